//! Llama (1, 2, 3.x) and SmolLM2: the baseline every other family departs from. GGUF weights of
//! this family are permuted for RoPE's interleaved pairs; Llama 3.1's frequency scaling comes
//! from the file (`rope_scaling` / `rope.scaling.*`).

use super::{Architecture, Experts, Family, Mixers, Windows};
use crate::model::config::{Activation, RopeStyle};

/// The declaration.
pub const FAMILY: Family = Family {
    architecture: Architecture::Llama,
    gguf: "llama",
    hf: &["LlamaForCausalLM"],
    attention_bias: false,
    qk_norm: false,
    fused_projections: false,
    post_norms: false,
    activation: Activation::Silu,
    scaled_embedding: false,
    gguf_rope_style: RopeStyle::Interleaved,
    hf_norm_offset: 0.0,
    // Mistral models converted to GGUF are written as llama, with a window where set.
    windows: Windows::WhereSet,
    local_rope_theta: None,
    gguf_residual_query_scale_at: &[],
    gguf_rope_switch: false,
    // Mixtral's GGUF files are `llama` with `llama.expert_count`; llama.cpp divides the chosen
    // probabilities by their sum, as transformers' Mixtral does.
    experts: Some(Experts {
        required: false,
        shared_expert: false,
        hf_normalize: true,
        gguf_normalize: true,
    }),
    mixers: Mixers::Attention,
    attention_scale: None,
    value_norm: false,
    hf_renames: &[],
};
