//! Qwen3.5 as Hugging Face checkpoints: the tiny models of `tests/model/qwen35.rs` written by
//! `engine::model::testing::write_tiny_qwen35_hf` (the same weights as the GGUFs, laid out as
//! the released `Qwen3_5ForConditionalGeneration` / `Qwen3_5MoeForConditionalGeneration`
//! checkpoints), and transformers' greedy tokens and logits on them, recorded by
//! `scripts/transformers-reference.py` in `tests/data/qwen35_transformers.json` and
//! `tests/data/qwen35moe_transformers.json`.

use engine::model::testing::write_tiny_qwen35_hf;

use super::qwen35::{tiny_qwen35, tiny_qwen35moe};

/// Writes the tiny dense Qwen3.5 as an HF checkpoint where `THICKET_REFERENCE_HF` says, for
/// `scripts/transformers-reference.py --case qwen35`.
#[test]
#[ignore = "writes the reference checkpoint for scripts/transformers-reference.py"]
fn write_the_hf_reference() {
    let dir = std::env::var("THICKET_REFERENCE_HF").expect("THICKET_REFERENCE_HF");
    write_tiny_qwen35_hf(std::path::Path::new(&dir), &tiny_qwen35()).unwrap();
}

/// Writes the tiny Qwen3.5 mixture as an HF checkpoint where `THICKET_REFERENCE_HF` says, for
/// `scripts/transformers-reference.py --case qwen35moe`.
#[test]
#[ignore = "writes the reference checkpoint for scripts/transformers-reference.py"]
fn write_the_moe_hf_reference() {
    let dir = std::env::var("THICKET_REFERENCE_HF").expect("THICKET_REFERENCE_HF");
    write_tiny_qwen35_hf(std::path::Path::new(&dir), &tiny_qwen35moe()).unwrap();
}
