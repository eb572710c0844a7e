//! Qwen3 (dense): no biases, a per-head RMSNorm of queries and keys before RoPE, and heads
//! wider than the residual (0.6B: 16 heads of 128 over a residual of 1024).

use super::{Architecture, Family, Mixers, Windows};
use crate::model::config::{Activation, RopeStyle};

/// The declaration.
pub const FAMILY: Family = Family {
    architecture: Architecture::Qwen3,
    gguf: "qwen3",
    hf: &["Qwen3ForCausalLM"],
    attention_bias: false,
    qk_norm: true,
    fused_projections: false,
    post_norms: false,
    activation: Activation::Silu,
    scaled_embedding: false,
    gguf_rope_style: RopeStyle::Halves,
    hf_norm_offset: 0.0,
    windows: Windows::Never,
    local_rope_theta: None,
    gguf_residual_query_scale_at: &[],
    gguf_rope_switch: false,
    experts: None,
    mixers: Mixers::Attention,
    attention_scale: None,
    value_norm: false,
    hf_renames: &[],
};
