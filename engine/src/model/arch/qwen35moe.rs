//! Qwen3.5-MoE and Qwen3.6-MoE (35B-A3B, 122B-A10B, 397B-A17B): Qwen3.5's hybrid of Gated
//! DeltaNet layers and gated attention with a mixture of experts in every layer's MLP,
//! beside a shared expert scaled by the sigmoid of its own one-output gate.

use super::{qwen35, Architecture, Experts, Family};

/// The declaration: qwen35's, with experts.
pub const FAMILY: Family = Family {
    architecture: Architecture::Qwen35Moe,
    gguf: "qwen35moe",
    hf: &[
        "Qwen3_5MoeForConditionalGeneration",
        "Qwen3_5MoeForCausalLM",
        "qwen3_5_moe",
    ],
    experts: Some(Experts {
        required: true,
        shared_expert: true,
        hf_normalize: true,
        gguf_normalize: true,
    }),
    ..qwen35::FAMILY
};
