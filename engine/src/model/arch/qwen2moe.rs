//! Qwen2-MoE (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): Qwen2's attention (q/k/v biases) and a
//! mixture of experts whose chosen softmax probabilities are used as they are (not divided by
//! their sum unless `norm_topk_prob` says so), beside a shared expert every row runs, scaled by
//! the sigmoid of its own one-output gate.

use super::{qwen2, Architecture, Experts, Family};

/// The declaration: qwen2's, with experts.
pub const FAMILY: Family = Family {
    architecture: Architecture::Qwen2Moe,
    gguf: "qwen2moe",
    hf: &["Qwen2MoeForCausalLM"],
    experts: Some(Experts {
        required: true,
        shared_expert: true,
        hf_normalize: false,
        gguf_normalize: false,
    }),
    ..qwen2::FAMILY
};
