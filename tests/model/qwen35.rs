//! Qwen3.5 (`qwen35` dense, `qwen35moe` with experts), hybrids of Gated DeltaNet layers and
//! gated attention layers, checked against llama.cpp: tiny random-weight GGUFs written at test
//! time (`engine::model::testing::write_tiny_qwen35_gguf`) and llama.cpp's greedy tokens and
//! logits on the same files, recorded by `scripts/rope-scaling-reference.py` in
//! `tests/data/qwen35_llamacpp.json` and `tests/data/qwen35moe_llamacpp.json`.

use candle_core::quantized::GgmlDType;
use engine::model::testing::{write_tiny_qwen35_gguf, TinyExperts, TinyQwen35};

/// The tiny dense Qwen3.5 of these tests: four layers, the second and fourth attending, four
/// value heads sharing two key heads in the DeltaNet layers, a quarter of each attention
/// head turned by RoPE.
pub(crate) fn tiny_qwen35() -> TinyQwen35 {
    TinyQwen35::default()
}

/// The tiny Qwen3.5 mixture: the same layers, each MLP four experts (two per token, their
/// weights renormalized) beside a gated shared expert.
pub(crate) fn tiny_qwen35moe() -> TinyQwen35 {
    TinyQwen35 {
        experts: Some(TinyExperts {
            count: 4,
            used: 2,
            width: 32,
            shared_width: Some(48),
            normalize: true,
            dense_layers: Vec::new(),
        }),
        seed: 36,
        ..TinyQwen35::default()
    }
}

/// Writes the tiny dense Qwen3.5 (f32) where `THICKET_REFERENCE_GGUF` says, for
/// `scripts/rope-scaling-reference.py --case qwen35`.
#[test]
#[ignore = "writes the reference GGUF for scripts/rope-scaling-reference.py"]
fn write_the_reference_gguf() {
    let path = std::env::var("THICKET_REFERENCE_GGUF").expect("THICKET_REFERENCE_GGUF");
    write_tiny_qwen35_gguf(std::path::Path::new(&path), &tiny_qwen35(), GgmlDType::F32).unwrap();
}

/// Writes the tiny Qwen3.5 mixture (f32) where `THICKET_REFERENCE_GGUF` says, for
/// `scripts/rope-scaling-reference.py --case qwen35moe`.
#[test]
#[ignore = "writes the reference GGUF for scripts/rope-scaling-reference.py"]
fn write_the_moe_reference_gguf() {
    let path = std::env::var("THICKET_REFERENCE_GGUF").expect("THICKET_REFERENCE_GGUF");
    write_tiny_qwen35_gguf(
        std::path::Path::new(&path),
        &tiny_qwen35moe(),
        GgmlDType::F32,
    )
    .unwrap();
}

/// `spec` (f32) against llama.cpp's recorded run on the same file (`reference`), and the
/// prompt prefilled in chunks of 1, 2 and 4 against llama.cpp's first logits.
pub(crate) fn matches_llama_cpp(spec: &TinyQwen35, reference: &str, tolerance: f32) {
    use candle_core::{DType, Device};
    use engine::cpu::kv_store::KvDtype;
    use engine::Model;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("qwen35.gguf");
    write_tiny_qwen35_gguf(&path, spec, GgmlDType::F32).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let (config, weights) =
        engine::model::gguf::load_gguf_weights(&path, Some(DType::F32), &Device::Cpu).unwrap();
    let model = Model::new(config, weights, Device::Cpu)
        .unwrap()
        .with_kv_dtype(KvDtype::F32);
    super::hybrid_checks::matches_llama_cpp_in_chunks(&model, &bytes, reference, tolerance);
}

#[test]
fn qwen35_matches_llama_cpp() {
    // llama.cpp's greedy tokens and logits on the same file, recorded by
    // scripts/rope-scaling-reference.py (f32 weights, K/V and states, attention in f32).
    // Measured: 1.2e-5 against logits up to 5.6; greedy tokens identical for 32 steps.
    matches_llama_cpp(
        &tiny_qwen35(),
        include_str!("../data/qwen35_llamacpp.json"),
        1e-4,
    );
}

#[test]
fn qwen35moe_matches_llama_cpp() {
    // Measured: 1.9e-5 against logits up to 5.6.
    matches_llama_cpp(
        &tiny_qwen35moe(),
        include_str!("../data/qwen35moe_llamacpp.json"),
        1e-4,
    );
}
