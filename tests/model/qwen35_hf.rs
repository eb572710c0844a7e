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

/// The tiny `spec` written as an HF checkpoint and loaded in f32, against transformers'
/// recorded run on the same files (`reference`).
fn matches_transformers(spec: &engine::model::testing::TinyQwen35, reference: &str) {
    use candle_core::Device;
    use engine::cpu::kv_store::KvDtype;

    use super::llamacpp_reference::check_recorded;

    let dir = tempfile::tempdir().unwrap();
    write_tiny_qwen35_hf(dir.path(), spec).unwrap();
    let bytes = std::fs::read(dir.path().join("model.safetensors")).unwrap();
    let (model, _) =
        engine::model::load::load_hf_model(dir.path(), engine::WeightDType::F32, &Device::Cpu)
            .unwrap();
    let model = model.with_kv_dtype(KvDtype::F32);
    // The text model only; the value heads read their key heads grouped, as transformers
    // lays them out.
    assert!(model.is_recurrent());
    // Measured: 6.0e-6 (dense) and 2.1e-5 (mixture) against logits up to 5.6; greedy tokens
    // identical for 32 steps.
    check_recorded(reference, &bytes, |_| model.clone(), 1e-4);
}

#[test]
fn qwen35_from_hf_matches_transformers() {
    matches_transformers(
        &tiny_qwen35(),
        include_str!("../data/qwen35_transformers.json"),
    );
}

#[test]
fn qwen35moe_from_hf_matches_transformers() {
    matches_transformers(
        &tiny_qwen35moe(),
        include_str!("../data/qwen35moe_transformers.json"),
    );
}

#[test]
fn qwen35_loads_the_same_model_from_gguf_and_hf() {
    use candle_core::quantized::GgmlDType;

    let dir = tempfile::tempdir().unwrap();
    write_tiny_qwen35_hf(dir.path(), &tiny_qwen35()).unwrap();
    let (hf, _) = engine::model::load::load_hf_model(
        dir.path(),
        engine::WeightDType::F32,
        &candle_core::Device::Cpu,
    )
    .unwrap();
    let (_g, gguf) = super::qwen35_forward::qwen35_model(&tiny_qwen35(), GgmlDType::F32, true);
    let (a, b) = (gguf.config(), hf.config());
    assert_eq!(
        (a.num_layers, a.rotary_dim(), a.head_dim, a.rope_theta),
        (b.num_layers, b.rotary_dim(), b.head_dim, b.rope_theta)
    );
    super::hybrid_checks::deltanet_hf_matches_gguf("qwen35 HF vs GGUF", &hf, &gguf);
}
