//! gpt-oss (20B, 120B): biases on q, k, v and the output projection; a sink logit per query
//! head in every softmax; every other layer windowed at 128 positions, the first among them;
//! RoPE over halves with YaRN; a mixture of experts in every layer whose router has a bias
//! and picks the top 4 by logit, weighing them by the softmax of their logits alone (the
//! softmax over all experts, then the chosen divided by their sum, is the same); biased
//! experts with a clamped SwiGLU (`Activation::SwigluOai`). GGUF files keep the experts in
//! MXFP4. The biases and sinks load where the file has them.

use super::{Architecture, Experts, Family, Mixers, Windows};
use crate::model::config::{Activation, RopeStyle};

/// The declaration.
pub const FAMILY: Family = Family {
    architecture: Architecture::GptOss,
    gguf: "gpt-oss",
    hf: &["GptOssForCausalLM", "gpt_oss"],
    attention_bias: true,
    qk_norm: false,
    fused_projections: false,
    post_norms: false,
    activation: Activation::SwigluOai,
    scaled_embedding: false,
    gguf_rope_style: RopeStyle::Halves,
    hf_norm_offset: 0.0,
    windows: Windows::AllButEvery(2),
    local_rope_theta: None,
    gguf_residual_query_scale_at: &[],
    gguf_rope_switch: false,
    experts: Some(Experts {
        required: true,
        shared_expert: false,
        hf_normalize: true,
        gguf_normalize: true,
    }),
    mixers: Mixers::Attention,
    attention_scale: None,
    value_norm: false,
    hf_renames: &[],
};
