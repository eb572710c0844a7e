//! The fused pass's device buffers, kept from step to step: the plan, the residual stream,
//! every activation between kernels, the attention runs and the logits, each sized for the
//! most rows (and logit rows, attention runs, plan words) a step has needed so far. A step
//! allocates nothing, and a captured step (a CUDA graph) finds its buffers where it left
//! them. They grow (doubling what fell short) only when a step needs more; the graphs
//! captured over the old buffers are then dropped.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DeviceRepr, ValidAsZeroBits};
use half::f16;

use super::device::device_err;
use crate::model::config::ModelConfig;
use crate::Result;

/// What a step needs room for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Room {
    /// Rows through the layers.
    pub rows: usize,
    /// Rows through the LM head.
    pub logits: usize,
    /// Attention runs per (row, head).
    pub runs: usize,
    /// Plan words.
    pub words: usize,
}

impl Room {
    /// Whether `self` holds `need` in every dimension.
    fn holds(&self, need: &Room) -> bool {
        self.rows >= need.rows
            && self.logits >= need.logits
            && self.runs >= need.runs
            && self.words >= need.words
    }

    /// `self` grown to hold `need`: each short dimension to the larger of twice itself and
    /// the need.
    fn grown(&self, need: &Room) -> Room {
        let grow = |have: usize, want: usize| {
            if have >= want {
                have
            } else {
                want.max(2 * have)
            }
        };
        Room {
            rows: grow(self.rows, need.rows),
            logits: grow(self.logits, need.logits),
            runs: grow(self.runs, need.runs),
            words: grow(self.words, need.words),
        }
    }
}

/// The buffers for `room`.
pub(super) struct Arena {
    pub room: Room,
    /// The step's plan (`plan::AttentionPlan`).
    pub plan: CudaSlice<i32>,
    /// The residual stream, `[rows, hidden]` f32.
    pub x: CudaSlice<f32>,
    /// A norm's output, `[rows, hidden]` f16.
    pub h: CudaSlice<f16>,
    /// `[rows, (heads + 2 kv_heads) * head_dim]` f16.
    pub qkv: CudaSlice<f16>,
    /// Rotated queries, `[rows, heads, head_dim]` f32.
    pub q: CudaSlice<f32>,
    /// Attention output, `[rows, heads * head_dim]` f16.
    pub attn: CudaSlice<f16>,
    /// A projection's output before the residual add, `[rows, hidden]` f16.
    pub delta: CudaSlice<f16>,
    /// `[rows, 2 * ffn]` f16.
    pub gate_up: CudaSlice<f16>,
    /// `[rows, ffn]` f16.
    pub gated: CudaSlice<f16>,
    /// Attention runs, `[rows, heads, runs, head_dim + 2]` f32.
    pub parts: CudaSlice<f32>,
    /// The rows the LM head reads, `[logits, hidden]` f16.
    pub picked: CudaSlice<f16>,
    /// `[logits, vocab]` f32.
    pub logits: CudaSlice<f32>,
}

fn zeros<T: DeviceRepr + ValidAsZeroBits>(
    stream: &Arc<CudaStream>,
    len: usize,
) -> Result<CudaSlice<T>> {
    stream
        .alloc_zeros::<T>(len.max(1))
        .map_err(device_err("allocating the step's buffers"))
}

impl Arena {
    fn new(stream: &Arc<CudaStream>, cfg: &ModelConfig, room: Room) -> Result<Self> {
        let (hidden, heads, kv, dim) = (
            cfg.hidden_size,
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
        );
        let (rows, ffn) = (room.rows, cfg.intermediate_size);
        Ok(Self {
            room,
            plan: zeros(stream, room.words)?,
            x: zeros(stream, rows * hidden)?,
            h: zeros(stream, rows * hidden)?,
            qkv: zeros(stream, rows * (heads + 2 * kv) * dim)?,
            q: zeros(stream, rows * heads * dim)?,
            attn: zeros(stream, rows * heads * dim)?,
            delta: zeros(stream, rows * hidden)?,
            gate_up: zeros(stream, rows * 2 * ffn)?,
            gated: zeros(stream, rows * ffn)?,
            parts: zeros(stream, rows * heads * room.runs * (dim + 2))?,
            picked: zeros(stream, room.logits * hidden)?,
            logits: zeros(stream, room.logits * cfg.vocab_size)?,
        })
    }
}

/// The arena, made on the first step and grown as steps need.
#[derive(Default)]
pub(super) struct Buffers {
    arena: Option<Arena>,
}

impl Buffers {
    /// An arena that holds `need`, and whether it was (re)allocated by this call (graphs
    /// captured before then read freed buffers).
    pub fn hold(
        &mut self,
        stream: &Arc<CudaStream>,
        cfg: &ModelConfig,
        need: Room,
    ) -> Result<(&mut Arena, bool)> {
        let grown = match &self.arena {
            Some(arena) if arena.room.holds(&need) => None,
            Some(arena) => Some(arena.room.grown(&need)),
            None => Some(need),
        };
        if let Some(room) = grown {
            // Free the old buffers first: the new ones may need their memory.
            self.arena = None;
            self.arena = Some(Arena::new(stream, cfg, room)?);
        }
        match self.arena.as_mut() {
            Some(arena) => Ok((arena, grown.is_some())),
            None => Err(crate::Error::Device("no step buffers".into())),
        }
    }
}
