//! Qwen2 and Qwen2.5: the llama block with biases on the q, k and v projections; RoPE pairs
//! halves in both formats.

use super::{Architecture, Family, Mixers, Windows};
use crate::model::config::{Activation, RopeStyle};

/// The declaration.
pub const FAMILY: Family = Family {
    architecture: Architecture::Qwen2,
    gguf: "qwen2",
    hf: &["Qwen2ForCausalLM"],
    attention_bias: true,
    qk_norm: false,
    fused_projections: false,
    post_norms: false,
    activation: Activation::Silu,
    scaled_embedding: false,
    gguf_rope_style: RopeStyle::Halves,
    hf_norm_offset: 0.0,
    // Qwen2's `use_sliding_window` is off in every released checkpoint.
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
