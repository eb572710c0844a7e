//! Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's attention (QK norm, no biases, heads
//! wider than the residual) and a mixture of experts in every layer: a softmax router over
//! 128 experts, each row running 8, their probabilities divided by their sum where
//! `norm_topk_prob` says so (every released checkpoint; transformers' default is not to, and
//! llama.cpp always does for `qwen3moe` GGUF files).

use super::{qwen3, Architecture, Experts, Family};

/// The declaration: qwen3's, with experts.
pub const FAMILY: Family = Family {
    architecture: Architecture::Qwen3Moe,
    gguf: "qwen3moe",
    hf: &["Qwen3MoeForCausalLM"],
    experts: Some(Experts {
        required: true,
        shared_expert: false,
        hf_normalize: false,
        gguf_normalize: true,
    }),
    ..qwen3::FAMILY
};
