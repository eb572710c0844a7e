//! Qwen3.5 and Qwen3.6 (dense): a hybrid of Gated DeltaNet layers and gated attention, three
//! to one (`qwen35.full_attention_interval`, or the file's list of recurrent layers). The
//! attending layers are Qwen3's (QK norm, no biases, heads wider than the residual) with a
//! sigmoid gate on each head's output, which the query projection gives beside the query,
//! and RoPE on the first quarter of each head (`rope.dimension_count`; the multimodal
//! sections reduce to plain halves for text). The DeltaNet layers' value heads read key
//! head `j % key_heads`, as llama.cpp lays the converted weights out. The GGUF keeps
//! Qwen's `1 + w` norm weights with the one added.

use super::{Architecture, Family, Mixers, Windows};
use crate::model::config::{Activation, KeyHeadsOfValues, RopeStyle};

/// The declaration.
pub const FAMILY: Family = Family {
    architecture: Architecture::Qwen35,
    gguf: "qwen35",
    hf: &[
        "Qwen3_5ForConditionalGeneration",
        "Qwen3_5ForCausalLM",
        "qwen3_5",
    ],
    attention_bias: false,
    qk_norm: true,
    fused_projections: false,
    post_norms: false,
    activation: Activation::Silu,
    scaled_embedding: false,
    gguf_rope_style: RopeStyle::Halves,
    hf_norm_offset: 1.0,
    windows: Windows::Never,
    local_rope_theta: None,
    gguf_residual_query_scale_at: &[],
    gguf_rope_switch: false,
    experts: None,
    mixers: Mixers::DeltaNet {
        interval: 4,
        key_heads_of_values: KeyHeadsOfValues::Tiled,
    },
    attention_scale: None,
    value_norm: false,
    hf_renames: &[],
};
