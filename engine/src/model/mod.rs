//! What a model is and how it is obtained: its hyper-parameters (`config`), its weights and
//! the `Model` that runs them, the one-pass CPU forward over the layers (`fused_pass`), the
//! linear layers (`linear`), a layer's MLP, dense or a mixture of experts (`experts`), loading from GGUF (`gguf`) or a Hugging Face directory (`hf`)
//! behind `load`, fetching pinned packages (`fetch`), the tokenizer and the incremental
//! detokenizer, and tiny random models for tests (`testing`). It computes with the kernels in
//! `crate::cpu`; backends (`crate::backend`) run it.
//!
//! `Model`: a decoder of any family in `arch` (RMSNorm, RoPE at arbitrary positions, GQA, a
//! gated MLP or a mixture of experts, optional q/k/v biases, tied or untied head, each layer's
//! token mixer (`mixer`: attention, or a kind that keeps state, such as LFM2's short
//! convolution), and what the family declares beyond that) whose forward takes a whole
//! `TreeBatch`: many sequences, each with its cached prefix in the paged KV store and its own
//! tree of new tokens. Weights are immutable (`&self`); the KV store is passed in, in candle's style.
//!
//! Per layer: projections, norms and the MLP run as candle ops over all rows at once (their
//! per-row arithmetic does not depend on the row count for the quantized formats we load;
//! SiLU is thicket's own `silu` on the CPU with thicket's attention, candle's otherwise);
//! RoPE uses candle's kernels with cos/sin gathered by each row's position; attention is
//! `cpu::attention::paged_tree_attention`, which reads K/V in place from the blocks. On the
//! CPU the same forward runs as the fused pass of `fused_pass` instead (bit-identical; no
//! candle op per layer where every projection runs on thicket's quantized kernel). The KV
//! stores it makes keep f16 with thicket's attention and f32 with the reference's, unless
//! told otherwise.

pub mod arch;
mod candle_pass;
pub mod config;
pub mod detokenizer;
pub mod embedding;
pub mod experts;
pub mod fetch;
pub(crate) mod fused_pass;
mod fused_rows;
pub mod gguf;
mod gguf_assemble;
mod gguf_delta_net;
pub mod gguf_header;
mod gguf_keys;
mod gguf_layers;
mod gguf_mamba2;
mod gguf_per_layer;
pub(crate) mod hf;
mod hf_delta_net;
mod hf_gemma4;
mod hf_gptoss;
mod hf_granite;
mod hf_hybrid;
mod hf_rope;
mod hf_text_config;
pub(crate) mod linear;
pub mod load;
pub mod mixer;
pub mod per_layer;
pub(crate) mod projection;
pub(crate) mod rope;
pub(crate) mod shapes;
pub mod testing;
pub mod tokenizer;

use candle_core::{Device, Tensor};

use crate::cpu::attention::AttentionKernel;
use std::sync::Arc;

use crate::cpu::kv_store::{KvDtype, LayerStorage, PagedKvStore};
use crate::model::config::RopeScaling;
use crate::model::config::{ModelConfig, RopeStyle, Rotary};
pub use crate::model::embedding::Embedding;
pub use crate::model::experts::{DenseMlp, Mlp};
use crate::model::fused_pass::FusedWeights;
use crate::model::linear::{Linear, QuantKernel};
pub(crate) use crate::model::mixer::TokenMixer;
pub use crate::model::mixer::{
    AttentionWeights, DeltaNetParts, DeltaNetWeights, Mamba2Parts, Mamba2Weights,
    SharedKvAttention, ShortConvWeights,
};
pub use crate::model::per_layer::{PerLayerEmbedding, PerLayerInput};
use crate::tree_batch::TreeBatch;
use crate::{Error, Result};
use kvcache::KvGroup;

/// What one forward returns: the logits of the rows that give logits, and the final-normed
/// states of those that give states (`TreeBatch::hidden_outputs`), each in `logit_rows` order.
#[derive(Debug)]
pub struct ForwardOutput {
    /// `[rows, vocab]` logits.
    pub logits: Tensor,
    /// One `[hidden]` state per row in `hidden_outputs`.
    pub hidden: Vec<Vec<f32>>,
}

impl ForwardOutput {
    /// Every output as one row each, in `batch.logit_rows` order.
    pub fn into_rows(self, batch: &TreeBatch) -> Result<Vec<Vec<f32>>> {
        batch.interleave_outputs(self.logits.to_vec2::<f32>()?, self.hidden)
    }
}

/// One decoder block's weights.
#[derive(Debug, Clone)]
pub struct LayerWeights {
    /// RMSNorm before the token mixer.
    pub attn_norm: Tensor,
    /// RMSNorm of the mixer's output and of the MLP output, before each residual add
    /// (post-norm families).
    pub post_norms: Option<(Tensor, Tensor)>,
    /// What mixes positions: attention, or a kind with state of its own (`mixer`).
    pub(crate) mixer: Box<dyn TokenMixer>,
    /// RMSNorm before the MLP.
    pub mlp_norm: Tensor,
    /// The gated MLP, or a mixture of experts.
    pub mlp: Mlp,
    /// The block's per-layer input, where the model has per-layer embeddings.
    pub per_layer_input: Option<PerLayerInput>,
    /// Factor on the whole residual after the block, where the model has one.
    pub output_scale: Option<f32>,
}

impl LayerWeights {
    /// Every projection of the layer (each expert's included).
    pub fn projections_mut(&mut self) -> Vec<&mut Linear> {
        let mut all = self.mixer.projections_mut();
        all.extend(self.mlp.projections_mut());
        all
    }

    /// The layer's attention, where it attends.
    pub fn attention(&self) -> Option<&AttentionWeights> {
        self.mixer.attention()
    }

    /// The layer's token mixer, as its family's declaration names it.
    pub fn mixer_kind(&self) -> crate::model::config::LayerMixer {
        self.mixer.kind()
    }
}

/// All weights of a decoder, as loaded.
#[derive(Debug, Clone)]
pub struct ModelWeights {
    /// The token embedding table.
    pub embedding: Embedding,
    /// Blocks, bottom first.
    pub layers: Vec<LayerWeights>,
    /// Final RMSNorm.
    pub final_norm: Tensor,
    /// Vocabulary projection (the embedding when tied).
    pub lm_head: Linear,
    /// Per-layer embeddings, where the model has them.
    pub per_layer: Option<PerLayerEmbedding>,
}

/// A loaded decoder.
#[derive(Debug, Clone)]
pub struct Model {
    config: ModelConfig,
    weights: ModelWeights,
    rope_cos: Tensor,
    rope_sin: Tensor,
    /// The windowed layers' table, where the family gives them their own RoPE base.
    rope_local: Option<(Tensor, Tensor)>,
    device: Device,
    attention: AttentionKernel,
    /// How KV stores keep values (`None`: see `kv_dtype`).
    kv_dtype: Option<KvDtype>,
    /// The fused CPU pass's view of the weights, where it applies.
    fused: Option<Arc<FusedWeights>>,
}

impl Model {
    /// Assembles a model; validates the config and precomputes the RoPE table.
    pub fn new(config: ModelConfig, weights: ModelWeights, device: Device) -> Result<Self> {
        config.validate()?;
        if weights.layers.len() != config.num_layers {
            return Err(Error::Metadata(format!(
                "{} layers of weights for {} layers in the config",
                weights.layers.len(),
                config.num_layers
            )));
        }
        check_layer_weights(&config, &weights)?;
        let (rope_cos, rope_sin) = rope::global_table(&config, &device)?;
        let rope_local = rope::local_table(&config, &device)?;
        let mut model = Self {
            config,
            weights,
            rope_cos,
            rope_sin,
            rope_local,
            device,
            attention: AttentionKernel::default(),
            kv_dtype: None,
            fused: None,
        };
        model.rebuild_fused()?;
        Ok(model)
    }

    /// Rebuilds the fused pass's view after the weights changed.
    fn rebuild_fused(&mut self) -> Result<()> {
        self.fused = FusedWeights::build(
            &self.weights,
            (&self.rope_cos, &self.rope_sin),
            self.rope_local.as_ref().map(|(c, s)| (c, s)),
            &self.device,
        )?
        .map(Arc::new);
        Ok(())
    }

    /// The same model for sequences of at most `len` positions: a LongRoPE model takes its
    /// short factors where `len` stays within its original context and its long ones beyond
    /// (once, for every position, as llama.cpp chooses by its context size); any other model
    /// is unchanged.
    pub fn for_context(mut self, len: usize) -> Result<Self> {
        let RopeScaling::LongRope {
            original,
            long_context,
            ..
        } = &mut self.config.variant.rope_scaling
        else {
            return Ok(self);
        };
        let long = len > *original;
        if *long_context == long {
            return Ok(self);
        }
        *long_context = long;
        (self.rope_cos, self.rope_sin) = rope::global_table(&self.config, &self.device)?;
        self.rebuild_fused()?;
        Ok(self)
    }

    /// The same model computing attention with `kernel`.
    pub fn with_attention(mut self, kernel: AttentionKernel) -> Self {
        self.attention = kernel;
        self
    }

    /// The same model keeping K and V as `dtype` in the stores it makes.
    pub fn with_kv_dtype(mut self, dtype: KvDtype) -> Self {
        self.kv_dtype = Some(dtype);
        self
    }

    /// How the KV stores this model makes keep values: as set, else f16 with thicket's
    /// attention and f32 with the reference arithmetic (whose K/V are the reference's f32).
    pub fn kv_dtype(&self) -> KvDtype {
        self.kv_dtype.unwrap_or(match self.attention {
            AttentionKernel::Fused => KvDtype::F16,
            AttentionKernel::Reference => KvDtype::F32,
        })
    }

    /// Bytes of K and V one position takes in every layer (or of what a layer that does
    /// not attend keeps instead).
    pub fn kv_bytes_per_position(&self) -> usize {
        (0..self.config.num_layers)
            .map(|i| self.layer_bytes_per_position(i))
            .sum()
    }

    /// Bytes layer `index` keeps per position.
    fn layer_bytes_per_position(&self, index: usize) -> usize {
        match self.layer_storage(index) {
            LayerStorage::Rows(width) | LayerStorage::Recurrent { row: width, .. } => width * 4,
            LayerStorage::Shared(_) => 0,
            LayerStorage::KvOf { .. } | LayerStorage::Kv => self
                .config
                .layer_kv_bytes_per_position(index, self.kv_dtype().size()),
        }
    }

    /// What layer `index` keeps in the paged store: its mixer's storage, keys and values in
    /// the layer's own heads where they differ from the model's.
    fn layer_storage(&self, index: usize) -> LayerStorage {
        let storage = self
            .weights
            .layers
            .get(index)
            .map(|l| l.mixer.storage())
            .unwrap_or_default();
        let (kv_heads, head_dim) = self.config.layer_heads(index);
        match storage {
            LayerStorage::Kv
                if (kv_heads, head_dim) != (self.config.num_kv_heads, self.config.head_dim) =>
            {
                LayerStorage::KvOf { kv_heads, head_dim }
            }
            other => other,
        }
    }

    /// Bytes of recurrent state one sequence takes over every layer that carries one (0 for
    /// a model without such layers).
    pub fn state_bytes_per_sequence(&self) -> usize {
        self.weights
            .layers
            .iter()
            .map(|l| match l.mixer.storage() {
                LayerStorage::Recurrent { state, .. } => state * 4,
                _ => 0,
            })
            .sum()
    }

    /// Whether some layer carries a recurrent state per sequence (batches then name each
    /// sequence's state slot: `TreeBatch::set_state`).
    pub fn is_recurrent(&self) -> bool {
        self.state_bytes_per_sequence() > 0
    }

    /// The same model multiplying its quantized weights with `kernel`.
    pub fn with_quant_kernel(mut self, kernel: QuantKernel) -> Result<Self> {
        for layer in &mut self.weights.layers {
            for l in layer.projections_mut() {
                l.set_kernel(kernel)?;
            }
        }
        self.weights.lm_head.set_kernel(kernel)?;
        self.rebuild_fused()?;
        Ok(self)
    }

    /// The kernel multiplying the quantized weights, `None` when all weights are dense.
    pub fn quant_kernel(&self) -> Option<QuantKernel> {
        self.weights
            .layers
            .iter()
            .flat_map(|l| l.mixer.projections())
            .find_map(|p| p.kernel())
    }

    /// The attention kernel in use.
    pub fn attention(&self) -> AttentionKernel {
        self.attention
    }

    /// Hyper-parameters.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The weights, as loaded (a device backend runs its own forward over them).
    pub fn weights(&self) -> &ModelWeights {
        &self.weights
    }

    /// RoPE's cos and sin for every position (`[max_positions, head_dim / 2]` each), of
    /// the global layers.
    pub fn rope_tables(&self) -> (&Tensor, &Tensor) {
        (&self.rope_cos, &self.rope_sin)
    }

    /// RoPE's cos and sin for each of `positions` (`[rows, head_dim / 2]` each), from the
    /// global table (`local`: the windowed layers' own, where the family has one).
    pub fn rope_rows_of(&self, positions: &Tensor, local: bool) -> Result<(Tensor, Tensor)> {
        let (cos, sin) = match (&self.rope_local, local) {
            (Some((cos, sin)), true) => (cos, sin),
            _ => (&self.rope_cos, &self.rope_sin),
        };
        Ok((
            cos.index_select(positions, 0)?.contiguous()?,
            sin.index_select(positions, 0)?.contiguous()?,
        ))
    }

    /// RoPE's cos and sin of the global table for each of `positions`.
    pub fn rope_rows(&self, positions: &Tensor) -> Result<(Tensor, Tensor)> {
        self.rope_rows_of(positions, false)
    }

    /// The device the weights live on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Bytes of projection weights read by one decode step (embedding lookup excluded).
    pub fn weight_bytes(&self) -> usize {
        let layers: usize = self
            .weights
            .layers
            .iter()
            .map(|l| {
                l.mixer
                    .projections()
                    .iter()
                    .map(|w| w.weight_bytes())
                    .sum::<usize>()
                    + l.mlp.weight_bytes()
            })
            .sum();
        layers + self.weights.lm_head.weight_bytes()
    }

    /// A KV store with room for `num_slots` rows in every layer.
    pub fn new_kv_store(&self, num_slots: usize) -> PagedKvStore {
        self.new_kv_store_with(num_slots, None)
    }

    /// A KV store with room for `num_slots` rows in every full-attention layer and, where
    /// `window_slots` is given, that many in every windowed layer (their own space).
    pub fn new_kv_store_with(&self, num_slots: usize, window_slots: Option<usize>) -> PagedKvStore {
        let layers: Vec<(KvGroup, LayerStorage)> = self
            .weights
            .layers
            .iter()
            .enumerate()
            .map(|(i, _)| {
                let group = match (window_slots, self.config.layer_reach(i)) {
                    (Some(_), Some(_)) => KvGroup::Window,
                    _ => KvGroup::Full,
                };
                (group, self.layer_storage(i))
            })
            .collect();
        PagedKvStore::with_layers(
            &layers,
            num_slots,
            window_slots,
            (self.config.num_kv_heads, self.config.head_dim),
            self.kv_dtype(),
        )
    }

    /// The widest window of positions the model's layers read, where every layer does not
    /// read them all (a sliding window, a short convolution's width).
    pub fn kv_window(&self) -> Option<usize> {
        (0..self.config.num_layers)
            .filter_map(|i| self.config.layer_reach(i))
            .max()
    }

    /// Bytes one position takes in the layers that read every position and in the windowed
    /// ones (sliding windows, short convolutions).
    pub fn kv_bytes_per_position_split(&self) -> (usize, usize) {
        (0..self.config.num_layers).fold((0, 0), |(full, windowed), i| {
            let bytes = self.layer_bytes_per_position(i);
            match self.config.layer_reach(i) {
                Some(_) => (full, windowed + bytes),
                None => (full + bytes, windowed),
            }
        })
    }

    /// Runs every row of `batch` through the decoder, writing each row's K/V at its slot,
    /// and returns `[rows, vocab]` f32 logits of the `logit_rows` that give logits, in
    /// order (those in `hidden_outputs` are left out: [`Model::forward_output`] has them).
    pub fn forward(&self, batch: &TreeBatch, kv: &mut PagedKvStore) -> Result<Tensor> {
        Ok(self.forward_output(batch, kv)?.logits)
    }

    /// [`Model::forward`] with the final-normed states of the rows in `hidden_outputs`.
    pub fn forward_output(
        &self,
        batch: &TreeBatch,
        kv: &mut PagedKvStore,
    ) -> Result<ForwardOutput> {
        if self.is_fused() && self.fused.as_ref().is_some_and(|f| f.all_packed()) {
            // The fused pass on thicket's kernel runs on the calling thread (the engine's),
            // which leads a team of the pool's workers for its parallel loops: handing the
            // whole forward to a worker and sleeping until it ends would cost a wake on each
            // side of every step, and the engine's thread would then share the cores with
            // two workers. (Candle's matmul of dense weights would have that thread wait on
            // the pool from outside it, while the workers help its team.)
            let output = self.forward_on_pool(batch, kv);
            crate::cpu::team::linger();
            return output;
        }
        // Candle's ops split their work over the pool each: from a worker of the pool they
        // run there or hand it to the others directly, instead of each waking the pool from
        // outside (hundreds of times per forward).
        rayon::scope(|_| {
            let output = self.forward_on_pool(batch, kv);
            crate::cpu::team::linger();
            output
        })
    }

    fn forward_on_pool(&self, batch: &TreeBatch, kv: &mut PagedKvStore) -> Result<ForwardOutput> {
        batch.validate(
            self.config.vocab_size,
            self.config.max_position_embeddings,
            kv.num_slots(),
        )?;
        batch.validate_window(kv.window_slots())?;
        if let (Some(fused), AttentionKernel::Fused) = (&self.fused, self.attention) {
            return fused.forward(&self.config, &self.weights, batch, kv);
        }
        self.forward_candle(batch, kv)
    }

    /// Whether forwards take the fused CPU pass (`fused`) rather than candle's ops.
    pub fn is_fused(&self) -> bool {
        self.fused.is_some() && self.attention == AttentionKernel::Fused
    }

    /// The same model running its forward with candle's ops even where the fused CPU pass
    /// applies (the reference the fused pass is tested against).
    pub fn without_fused_pass(mut self) -> Self {
        self.fused = None;
        self
    }

    /// `[rows, heads * dim]` -> rotated `[1, heads, rows, dim]`, as `rotary` turns a head.
    pub fn rotate(
        &self,
        x: &Tensor,
        heads: usize,
        rotary: Rotary,
        cos: &Tensor,
        sin: &Tensor,
    ) -> Result<Tensor> {
        let rows = x.dim(0)?;
        let d = rotary.head_dim;
        let x = x
            .reshape((1, rows, heads, d))?
            .transpose(1, 2)?
            .contiguous()?;
        let turn = |x: &Tensor| -> Result<Tensor> {
            Ok(match rotary.style {
                RopeStyle::Interleaved => candle_nn::rotary_emb::rope_i(x, cos, sin)?,
                RopeStyle::Halves => candle_nn::rotary_emb::rope(x, cos, sin)?,
            })
        };
        let (pairs, offset) = (rotary.pairs, rotary.offset);
        if pairs == 0 {
            // No positional rotation (Granite 4.0-H's attention).
            return Ok(x);
        }
        if 2 * pairs == d {
            return turn(&x);
        }
        if rotary.style == RopeStyle::Halves && offset != pairs {
            // Proportional: the leading pairs of each half turn, each with its partner half a
            // head on; the rest pass through.
            let part = |from: usize, len: usize| x.narrow(3, from, len);
            let both = Tensor::cat(&[&part(0, pairs)?, &part(offset, pairs)?], 3)?.contiguous()?;
            let turned = turn(&both)?;
            let pieces = [
                turned.narrow(3, 0, pairs)?,
                part(pairs, offset - pairs)?,
                turned.narrow(3, pairs, pairs)?,
                part(offset + pairs, d - offset - pairs)?,
            ];
            return Ok(Tensor::cat(&pieces, 3)?.contiguous()?);
        }
        // Partial rotary: the leading dimensions turn, the rest pass through.
        let rot = 2 * pairs;
        let turned = turn(&x.narrow(3, 0, rot)?.contiguous()?)?;
        Ok(Tensor::cat(&[&turned, &x.narrow(3, rot, d - rot)?], 3)?.contiguous()?)
    }
}

/// Checks that each layer carries the mixer and the norms its family declares, and its
/// per-layer input exactly where the model has per-layer embeddings.
fn check_layer_weights(config: &ModelConfig, weights: &ModelWeights) -> Result<()> {
    let v = &config.variant;
    for (i, layer) in weights.layers.iter().enumerate() {
        if layer.per_layer_input.is_some() != weights.per_layer.is_some() {
            return Err(Error::Metadata(format!(
                "layer {i}: a per-layer input {} per-layer embeddings",
                match weights.per_layer.is_some() {
                    true => "is missing beside",
                    false => "was loaded without",
                }
            )));
        }
        if layer.mixer.kind() != config.layer_mixer(i) {
            return Err(Error::Metadata(format!(
                "layer {i}: a {:?} was loaded where the {} declaration has a {:?}",
                layer.mixer.kind(),
                config.architecture.as_str(),
                config.layer_mixer(i)
            )));
        }
        let qk_norm = layer.attention().map(|a| a.qk_norm.is_some());
        if qk_norm.is_some_and(|q| q != v.qk_norm) || layer.post_norms.is_some() != v.post_norms {
            return Err(Error::Metadata(format!(
                "layer {i}: the norms loaded do not match the {} declaration",
                config.architecture.as_str()
            )));
        }
    }
    Ok(())
}
