//! Qwen3-Next as a Hugging Face checkpoint: the tiny model of `tests/model/qwen3next.rs`
//! written by `engine::model::testing::write_tiny_qwen3next_hf` (the same weights as the
//! GGUF, with transformers' fused `in_proj_qkvz` and `in_proj_ba`), loaded as the GGUF loads
//! it, and transformers' greedy tokens and logits on it, recorded by
//! `scripts/transformers-reference.py` in `tests/data/qwen3next_transformers.json`.

use candle_core::quantized::GgmlDType;
use engine::model::testing::write_tiny_qwen3next_hf;

use super::qwen3next::tiny_qwen3next;

/// Writes the tiny Qwen3-Next as an HF checkpoint where `THICKET_REFERENCE_HF` says, for
/// `scripts/transformers-reference.py --case qwen3next`.
#[test]
#[ignore = "writes the reference checkpoint for scripts/transformers-reference.py"]
fn write_the_hf_reference() {
    let dir = std::env::var("THICKET_REFERENCE_HF").expect("THICKET_REFERENCE_HF");
    write_tiny_qwen3next_hf(std::path::Path::new(&dir), &tiny_qwen3next()).unwrap();
}

/// The tiny Qwen3-Next as an HF checkpoint, loaded in f32.
fn hf_model() -> (tempfile::TempDir, engine::Model) {
    super::hybrid_checks::hf_in_f32(|dir| write_tiny_qwen3next_hf(dir, &tiny_qwen3next()).unwrap())
}

#[test]
fn qwen3next_from_hf_matches_transformers() {
    let (dir, model) = hf_model();
    let bytes = std::fs::read(dir.path().join("model.safetensors")).unwrap();
    // Measured: 6.9e-6 against logits up to 6.0; greedy tokens identical for 32 steps.
    super::llamacpp_reference::check_recorded(
        include_str!("../data/qwen3next_transformers.json"),
        &bytes,
        |_| model.clone(),
        1e-4,
    );
}

#[test]
fn qwen3next_loads_the_same_model_from_gguf_and_hf() {
    let (_dir, hf) = hf_model();
    let (_g, gguf) = super::qwen35_forward::qwen35_model(&tiny_qwen3next(), GgmlDType::F32, true);
    let gguf = gguf.with_kv_dtype(engine::cpu::kv_store::KvDtype::F32);
    let (a, b) = (gguf.config(), hf.config());
    assert_eq!(a.variant.mixers, b.variant.mixers);
    assert_eq!(
        (a.rotary_dim(), a.head_dim, a.variant.gated_attention),
        (b.rotary_dim(), b.head_dim, b.variant.gated_attention)
    );
    super::hybrid_checks::deltanet_hf_matches_gguf("qwen3next HF vs GGUF", &hf, &gguf);
}
