//! `Backend`: the device seam. Everything that runs a model goes through it: the engine
//! loop, the draft-model runner and the forward bench. A backend owns the model's weights
//! as its device wants them and the paged KV rows where its device keeps them; it runs one
//! forward of a [`TreeBatch`] (each row's K/V written at its slot, logits returned for the
//! rows asked for) and copies KV rows (copy-on-write and compaction). Which backend a model
//! gets is decided in one place, [`for_model`]: a device with its own kernels and
//! device-resident KV is a new type behind this trait, chosen there.
//!
//! [`CpuBackend`] (`cpu.rs`) is the model over a host paged KV store (the fused CPU pass and
//! thicket's kernels on the CPU, candle's ops around host attention elsewhere);
//! `CudaBackend` (`cuda/`, feature `cuda`) keeps the KV cache on an NVIDIA GPU and runs
//! thicket's own paged tree attention there; [`MockBackend`] (`mock.rs`) has no tensors at
//! all.

mod cpu;
#[cfg(any(test, feature = "cuda"))]
mod cuda;
mod mock;

use kvcache::KvMove;

pub use cpu::CpuBackend;
#[cfg(feature = "cuda")]
pub use cuda::CudaBackend;
pub use mock::{MockBackend, NextToken, RankedTokens};

use crate::model::Model;
use crate::tree_batch::TreeBatch;
use crate::Result;

/// A model the engine loop can run.
pub trait Backend: Send + 'static {
    /// Logits per row.
    fn vocab_size(&self) -> usize;
    /// KV rows (slots) it holds per layer.
    fn num_slots(&self) -> usize;
    /// Where and how it runs, for reports (device, forward path, kernels).
    fn describe(&self) -> String;
    /// Whether its forwards record the fused CPU pass's per-part times (`fused_pass::profile`).
    fn profiles_parts(&self) -> bool {
        false
    }
    /// Runs `batch`, writing every row's K/V at its slot; returns the logits of
    /// `batch.logit_rows`, in that order, or for those in `batch.hidden_outputs` the row's
    /// final-normed state (where [`Backend::returns_states`]).
    fn forward(&mut self, batch: &TreeBatch) -> Result<Vec<Vec<f32>>>;
    /// Whether its forward returns final-normed states (`TreeBatch::hidden_outputs`): a
    /// decoder that embeds. A backend that does not fails such a batch.
    fn returns_states(&self) -> bool {
        false
    }
    /// Copies KV rows, in order (copy-on-write and compaction).
    fn move_kv(&mut self, moves: &[KvMove]) -> Result<()>;
    /// Whether the model has layers that carry a recurrent state per sequence: every batch
    /// then names each sequence's state slot (`TreeBatch::set_state`).
    fn recurrent(&self) -> bool {
        self.state_bytes_per_sequence() > 0
    }
    /// Bytes of recurrent state one sequence (or one snapshot of it) takes.
    fn state_bytes_per_sequence(&self) -> usize {
        0
    }
    /// Has the OS map the KV pool's memory now, before any request runs, where it is
    /// allocated lazily (host memory); a backend whose pool is resident from allocation does
    /// nothing.
    fn prefault_kv(&mut self) {}

    /// Has the OS map the first `slots` recurrent state slots now (a model with recurrent
    /// layers whose states live in host memory; nothing otherwise): the running sequences'
    /// and the snapshots', which would otherwise be mapped as the first steps reach them.
    fn prefault_states(&mut self, _slots: usize) {}
}

/// The backend for `model` on the device its weights were loaded to, with `num_slots` KV
/// rows per layer: [`CudaBackend`] for a model on a CUDA device (built with `cuda`) whose
/// shape and family its kernels take, [`CpuBackend`] for every other (on a GPU: candle's ops
/// with attention on the host, slower but any shape and family).
pub fn for_model(model: Model, num_slots: usize) -> Result<Box<dyn Backend>> {
    for_model_spaces(model, num_slots, None)
}

/// Whether the backend [`for_model`] picks for `model` keeps every layer's KV in one slot
/// space (the CUDA backend's device-resident cache), so that windowed layers cannot have a
/// pool of their own.
pub fn keeps_one_kv_space(model: &Model) -> bool {
    #[cfg(feature = "cuda")]
    if model.device().is_cuda() {
        return cuda::kernels_take(model.config()).is_ok();
    }
    let _ = model;
    false
}

/// [`for_model`] with the windowed layers in a slot space of their own of `window_slots`
/// rows, where given (a host store only: the CUDA backend keeps one space).
pub fn for_model_spaces(
    model: Model,
    num_slots: usize,
    window_slots: Option<usize>,
) -> Result<Box<dyn Backend>> {
    #[cfg(feature = "cuda")]
    if model.device().is_cuda() {
        match cuda::kernels_take(model.config()) {
            Ok(()) if window_slots.is_none() => {
                return Ok(Box::new(CudaBackend::new(model, num_slots)?));
            }
            Ok(()) => {
                return Err(crate::Error::Metadata(
                    "the CUDA backend keeps one KV space: a windowed KV pool was asked of it"
                        .into(),
                ));
            }
            Err(why) => tracing::warn!(
                "thicket's CUDA kernels do not take this model ({why}): it runs on candle's                  ops on the GPU with attention and KV on the host, which is much slower"
            ),
        }
    }
    Ok(Box::new(CpuBackend::with_spaces(
        model,
        num_slots,
        window_slots,
    )))
}
