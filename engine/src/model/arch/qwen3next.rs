//! Qwen3-Next (80B-A3B): Qwen3.5's hybrid of Gated DeltaNet layers and gated attention, three
//! to one, with a mixture of experts beside a gated shared expert in every layer. As
//! llama.cpp's converter writes it, its value heads are grouped by key head (value head `j`
//! reads key head `j / (value_heads / key_heads)`, as transformers has them; Qwen3.5's files
//! are reordered to tile them), `beta` and `alpha` come in one tensor (`ssm_ba`), and the
//! first converter fused the DeltaNet inputs into `ssm_in` (`gguf_delta_net.rs`). RoPE on a
//! quarter of each head, in halves.

use super::{qwen35, Architecture, Experts, Family, Mixers};
use crate::model::config::KeyHeadsOfValues;

/// The declaration: qwen35's, with grouped value heads and experts.
pub const FAMILY: Family = Family {
    architecture: Architecture::Qwen3Next,
    gguf: "qwen3next",
    hf: &["Qwen3NextForCausalLM", "qwen3_next"],
    experts: Some(Experts {
        required: true,
        shared_expert: true,
        hf_normalize: true,
        gguf_normalize: true,
    }),
    mixers: Mixers::DeltaNet {
        interval: 4,
        key_heads_of_values: KeyHeadsOfValues::Grouped,
    },
    ..qwen35::FAMILY
};
