//! Phi-3 and Phi-3.5 (mini, medium; 4k and 128k contexts): the llama block with the query, key
//! and value projections fused into one (`qkv_proj` / `attn_qkv`) and the MLP's gate and up
//! fused (`gate_up_proj` / `ffn_up`, gate first), split at load; a sliding window on every layer
//! where the file sets one (2047 in the released configs, as llama.cpp honours it). The 128k
//! models' LongRoPE is a RoPE scaling (`RopeScaling::LongRope`), read from either file kind.

use super::{Architecture, Family, Mixers, Windows};
use crate::model::config::{Activation, RopeStyle};

/// The declaration.
pub const FAMILY: Family = Family {
    architecture: Architecture::Phi3,
    gguf: "phi3",
    hf: &["Phi3ForCausalLM", "phi3"],
    attention_bias: false,
    qk_norm: false,
    fused_projections: true,
    post_norms: false,
    activation: Activation::Silu,
    scaled_embedding: false,
    gguf_rope_style: RopeStyle::Halves,
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
