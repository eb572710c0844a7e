//! Mixtral (8x7B, 8x22B): Mistral's block with a mixture of 8 experts in every layer, each row
//! running 2, their softmax probabilities divided by their sum. Its HF checkpoints are
//! `MixtralForCausalLM`; its GGUF files are written as `llama` with `llama.expert_count`
//! (the llama declaration takes experts where a file has them), so `mixtral` names no GGUF.

use super::{mistral, Architecture, Experts, Family};

/// The declaration: mistral's, with experts.
pub const FAMILY: Family = Family {
    architecture: Architecture::Mixtral,
    gguf: "mixtral",
    hf: &["MixtralForCausalLM"],
    experts: Some(Experts {
        required: true,
        shared_expert: false,
        hf_normalize: true,
        gguf_normalize: true,
    }),
    ..mistral::FAMILY
};
