//! Gemma 2: RMSNorm before and after both attention and the MLP; GeGLU with tanh GELU;
//! embedding rows times `sqrt(hidden)`; attention scores and final logits soft-capped (50 and
//! 30 in the released models, from the file); every other layer windowed, the first among them
//! (llama.cpp and transformers alike); one RoPE base. HF checkpoints store norm weights less
//! one.

use super::{Architecture, Family, Mixers, Windows};
use crate::model::config::{Activation, RopeStyle};

/// The declaration.
pub const FAMILY: Family = Family {
    architecture: Architecture::Gemma2,
    gguf: "gemma2",
    hf: &["Gemma2ForCausalLM", "gemma2"],
    attention_bias: false,
    qk_norm: false,
    fused_projections: false,
    post_norms: true,
    activation: Activation::GeluTanh,
    scaled_embedding: true,
    gguf_rope_style: RopeStyle::Halves,
    hf_norm_offset: 1.0,
    windows: Windows::AllButEvery(2),
    local_rope_theta: None,
    gguf_residual_query_scale_at: &[46],
    gguf_rope_switch: false,
    experts: None,
    mixers: Mixers::Attention,
    attention_scale: None,
    value_norm: false,
    hf_renames: &[],
};
