//! A layer's token mixer: what moves information between positions, behind one trait beside
//! the MLP kinds (`experts`). Each kind owns its weights, its forward as candle ops (the
//! reference path, any device) and its form in the fused CPU pass, and what it keeps per
//! position in the paged store: attention (`attention`) keeps keys and values and reads them
//! through the tree mask, full or windowed; a short convolution (`short_conv`, LFM2) keeps its
//! gated inputs as one f32 row per position and reads the last few along the row's path,
//! which is a window of the same paged slots. So prefix caching, tree verification,
//! compaction of an accepted path and preemption treat every kind alike: a sequence's state is
//! its rows, and a draft node's state follows from its ancestors' rows. Gated DeltaNet
//! (`delta_net`) keeps its convolution's inputs the same way and, per sequence, a recurrent
//! state in a slot of its own that each forward moves to the context's end; Mamba-2
//! (`mamba2`) is the same with another recurrence. The family's
//! declaration (`ModelConfig::layer_mixer`) says which layer is which; the forwards never ask
//! which family they run.

pub(crate) mod attention;
pub(crate) mod delta_net;
mod delta_net_rows;
pub(crate) mod mamba2;
pub(crate) mod shared_kv;
pub(crate) mod short_conv;

use std::fmt::Debug;
use std::sync::Arc;

use candle_core::Tensor;

use crate::cpu::kv_store::{LayerStorage, PagedKvStore};
use crate::cpu::qgemm::Activations;
use crate::model::config::{LayerMixer, ModelConfig};
use crate::model::fused_pass::Clock;
use crate::model::linear::Linear;
use crate::model::projection::Projection;
use crate::model::Model;
use crate::tree_batch::TreeBatch;
use crate::Result;

pub use attention::AttentionWeights;
pub use delta_net::{DeltaNetParts, DeltaNetWeights};
pub use mamba2::{Mamba2Parts, Mamba2Weights};
pub use shared_kv::SharedKvAttention;
pub use short_conv::ShortConvWeights;

/// One layer's token mixer, as loaded.
pub(crate) trait TokenMixer: Debug + Send + Sync {
    /// The kind, as the family's declaration names it.
    fn kind(&self) -> LayerMixer;

    /// What the layer keeps per position in the paged store.
    fn storage(&self) -> LayerStorage;

    /// The attention weights, where the mixer attends (backends with kernels of their own
    /// for attention read them).
    fn attention(&self) -> Option<&AttentionWeights> {
        None
    }

    /// Every projection.
    fn projections(&self) -> Vec<&Linear>;

    /// Every projection, to change its kernel.
    fn projections_mut(&mut self) -> Vec<&mut Linear>;

    /// The mixer over the normed rows `h` (`[rows, hidden]`) as candle ops, writing what the
    /// rows keep into `kv`: `[rows, hidden]`, before the residual add.
    fn forward_candle(
        &self,
        at: &CandleAt<'_>,
        h: &Tensor,
        kv: &mut PagedKvStore,
    ) -> Result<Tensor>;

    /// The mixer's form in the fused CPU pass.
    fn fused(&self) -> Result<Arc<dyn FusedMixer>>;

    /// A copy behind a new box.
    fn clone_box(&self) -> Box<dyn TokenMixer>;
}

impl Clone for Box<dyn TokenMixer> {
    fn clone(&self) -> Self {
        self.clone_box()
    }
}

/// Where a mixer runs in the candle-ops forward.
pub(crate) struct CandleAt<'a> {
    /// The model (its config, RoPE, attention kernel, activation).
    pub model: &'a Model,
    /// The layer's index.
    pub index: usize,
    /// The whole batch.
    pub batch: &'a TreeBatch,
    /// The batch as the layer sees it (its window's view where it has one).
    pub seen: &'a TreeBatch,
    /// RoPE's cos and sin of each row, from the layer's table.
    pub rope: (&'a Tensor, &'a Tensor),
}

/// Where a mixer runs in the fused CPU pass.
pub(crate) struct FusedAt<'a> {
    /// The model's hyper-parameters.
    pub cfg: &'a ModelConfig,
    /// The layer's index.
    pub index: usize,
    /// The whole batch (each row's position).
    pub batch: &'a TreeBatch,
    /// The batch as the layer sees it (its window's view where it has one).
    pub seen: &'a TreeBatch,
    /// The layer's RoPE table, cos and sin.
    pub table: (&'a [f32], &'a [f32]),
}

/// Reusable buffers of the mixers of one thread's fused forwards.
#[derive(Default)]
pub(crate) struct MixerBuffers {
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub q_heads: Vec<f32>,
    pub normed: Vec<f32>,
    pub mixed: Vec<f32>,
}

/// A token mixer as the fused CPU pass runs it.
pub(crate) trait FusedMixer: Debug + Send + Sync {
    /// Every projection (the pass asks whether all are on thicket's kernel).
    fn projections(&self) -> Vec<&Projection>;

    /// The mixer over the normed rows `h`, writing what the rows keep into `kv` and the
    /// `[rows][hidden]` result into `out`; stages are charged to `clock`.
    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        at: &FusedAt<'_>,
        h: &[f32],
        kv: &mut PagedKvStore,
        w: &mut MixerBuffers,
        acts: &mut Activations,
        clock: &mut Clock,
        out: &mut Vec<f32>,
    ) -> Result<()>;
}
