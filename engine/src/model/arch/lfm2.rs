//! LFM2 (Liquid AI's 350M to 2.6B hybrids): most layers mix positions with a gated short
//! convolution (`LayerMixer::ShortConv`, three positions wide in every released checkpoint)
//! and a few attend, with a per-head RMSNorm of queries and keys. A GGUF file says which by
//! its per-layer KV head counts (`lfm2.attention.head_count_kv`, 0 for a convolution layer)
//! and gives the width as `lfm2.shortconv.l_cache`; the final norm is `token_embd_norm`
//! (`model.embedding_norm` in HF checkpoints). SwiGLU MLP, RoPE on halves, no biases.

use super::{Architecture, Family, Mixers, Windows};
use crate::model::config::{Activation, RopeStyle};

/// The declaration.
pub const FAMILY: Family = Family {
    architecture: Architecture::Lfm2,
    gguf: "lfm2",
    hf: &["Lfm2ForCausalLM", "lfm2"],
    attention_bias: false,
    qk_norm: true,
    fused_projections: false,
    post_norms: false,
    activation: Activation::Silu,
    scaled_embedding: false,
    gguf_rope_style: RopeStyle::Halves,
    hf_norm_offset: 0.0,
    windows: Windows::WhereSet,
    local_rope_theta: None,
    gguf_residual_query_scale_at: &[],
    experts: None,
    mixers: Mixers::ShortConvWhereNoKv,
};
