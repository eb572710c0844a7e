//! Mistral: the llama block, attending through a sliding window on every layer where the
//! config sets one (7B v0.1: 4096; later versions set none). GGUF conversions of Mistral
//! models are written as `llama` (with `llama.attention.sliding_window` where set).

use super::{Architecture, Family, Mixers, Windows};
use crate::model::config::{Activation, RopeStyle};

/// The declaration.
pub const FAMILY: Family = Family {
    architecture: Architecture::Mistral,
    gguf: "mistral",
    hf: &["MistralForCausalLM"],
    attention_bias: false,
    qk_norm: false,
    fused_projections: false,
    post_norms: false,
    activation: Activation::Silu,
    scaled_embedding: false,
    gguf_rope_style: RopeStyle::Interleaved,
    hf_norm_offset: 0.0,
    windows: Windows::WhereSet,
    local_rope_theta: None,
    gguf_residual_query_scale_at: &[],
    gguf_rope_switch: false,
    experts: None,
    mixers: Mixers::Attention,
    attention_scale: None,
    value_norm: false,
    hf_renames: &[],
};
