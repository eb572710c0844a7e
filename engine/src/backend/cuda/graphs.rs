//! Captured steps: the fused pass's launches for one step shape (rows, attention runs,
//! whether logits are wanted) recorded once as a CUDA graph and replayed with one launch,
//! so the host no longer pays for ~300 kernel launches and cuBLAS calls a step. A shape is
//! captured the second time it is seen (the first runs launch by launch, which also loads
//! the kernels and cuBLAS's choices outside any capture). A capture that fails turns graphs
//! off for the backend with a warning; the step then runs launch by launch, as every step
//! does with `THICKET_CUDA_GRAPHS=0`.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaGraph, CudaStream};

use super::device::device_err;
use crate::Result;

/// Most graphs kept; past it all are dropped and shapes are captured again as they recur.
const MAX_GRAPHS: usize = 96;

/// The shape a graph was captured at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct Shape {
    pub rows: usize,
    pub runs: usize,
    pub logits: bool,
}

/// A captured step.
struct Captured(CudaGraph);

// SAFETY: a graph is used by one thread at a time: the backend that owns it is used only
// through `&mut` (the engine thread's), and CUDA graphs need only external serialization.
unsafe impl Send for Captured {}

/// The backend's captured steps.
pub(super) struct Graphs {
    enabled: bool,
    seen: HashMap<Shape, u32>,
    graphs: HashMap<Shape, Captured>,
    /// Steps replayed and captured (for the log).
    pub replays: u64,
    pub captures: u64,
}

impl Graphs {
    /// Graphs on unless `THICKET_CUDA_GRAPHS=0`.
    pub fn new() -> Self {
        let enabled = std::env::var("THICKET_CUDA_GRAPHS").map_or(true, |v| v != "0");
        Self {
            enabled,
            seen: HashMap::new(),
            graphs: HashMap::new(),
            replays: 0,
            captures: 0,
        }
    }

    /// Whether steps may be captured.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Turns capturing on or off (off drops the graphs).
    pub fn set_enabled(&mut self, on: bool) {
        self.enabled = on;
        if !on {
            self.graphs.clear();
        }
    }

    /// Drops every graph (their buffers were freed).
    pub fn clear(&mut self) {
        self.graphs.clear();
    }

    /// Runs the step of `shape` from its graph, capturing `record` into one first when the
    /// shape is seen for the second time. `Ok(false)`: no graph ran, and the caller runs
    /// `record` launch by launch.
    pub fn run(
        &mut self,
        stream: &Arc<CudaStream>,
        shape: Shape,
        record: impl FnOnce() -> Result<()>,
    ) -> Result<bool> {
        if !self.enabled {
            return Ok(false);
        }
        if let Some(graph) = self.graphs.get(&shape) {
            graph.0.launch().map_err(device_err("replaying a step"))?;
            self.replays += 1;
            return Ok(true);
        }
        let seen = self.seen.entry(shape).or_insert(0);
        *seen += 1;
        if *seen < 2 {
            return Ok(false);
        }
        if self.graphs.len() >= MAX_GRAPHS {
            self.graphs.clear();
        }
        stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
            .map_err(device_err("capturing a step"))?;
        let recorded = record();
        // End the capture whatever happened while recording.
        let graph = stream.end_capture(CUgraphInstantiate_flags(0));
        match (recorded, graph) {
            (Ok(()), Ok(Some(graph))) => {
                graph.launch().map_err(device_err("replaying a step"))?;
                self.captures += 1;
                self.graphs.insert(shape, Captured(graph));
                Ok(true)
            }
            (recorded, graph) => {
                let why = match (recorded, graph) {
                    (Err(e), _) => e.to_string(),
                    (_, Err(e)) => e.to_string(),
                    _ => "an empty graph".to_string(),
                };
                tracing::warn!(
                    "capturing a {shape:?} step as a CUDA graph failed ({why}); steps run \
                     launch by launch from now on"
                );
                self.enabled = false;
                self.graphs.clear();
                Ok(false)
            }
        }
    }
}
