//! Gemma 3 (the text decoder): QK norm; RMSNorm before and after both attention and the MLP;
//! GeGLU with tanh GELU; embedding rows times `sqrt(hidden)`; five windowed layers to one
//! global (llama.cpp and transformers both default to a period of 6), the windowed ones with
//! RoPE base 10,000 and the global ones with the file's base (1M). HF checkpoints store norm
//! weights less one.

use super::{Architecture, Family, Mixers, Windows};
use crate::model::config::{Activation, RopeStyle};

/// The declaration.
pub const FAMILY: Family = Family {
    architecture: Architecture::Gemma3,
    gguf: "gemma3",
    hf: &["Gemma3ForCausalLM", "gemma3_text"],
    attention_bias: false,
    qk_norm: true,
    fused_projections: false,
    post_norms: true,
    activation: Activation::GeluTanh,
    scaled_embedding: true,
    gguf_rope_style: RopeStyle::Halves,
    hf_norm_offset: 1.0,
    windows: Windows::AllButEvery(6),
    local_rope_theta: Some(10_000.0),
    gguf_residual_query_scale_at: &[62],
    gguf_rope_switch: false,
    experts: None,
    mixers: Mixers::Attention,
    attention_scale: None,
    value_norm: false,
    hf_renames: &[],
};
