//! Gemma 4 as Hugging Face checkpoints: the tiny models of `tests/model/gemma4.rs` written by
//! `engine::model::testing::write_tiny_gemma4_hf` (the same weights as the GGUFs, laid out as
//! transformers saves `Gemma4ForCausalLM`), loaded as the GGUF loads them, and transformers'
//! greedy tokens and logits on them, recorded by `scripts/transformers-reference.py` in
//! `tests/data/gemma4_transformers.json` (global layers of their own heads listed in
//! `per_layer_config`, per-layer embeddings, shared keys and values, doubled MLPs) and
//! `tests/data/gemma4_moe_transformers.json` (the mixture, global values from the keys'
//! projection, the released configs' flat `global_head_dim`); the multimodal layout (text
//! model under `model.language_model`, a vision tower beside it) loads the same model; a
//! config thicket cannot honour is refused by its key.

use candle_core::quantized::GgmlDType;
use candle_core::{DType, Device, Tensor};
use engine::model::testing::{write_tiny_gemma4_gguf, write_tiny_gemma4_hf, TinyGemma4};

/// The tiny Gemma 4 as a checkpoint can hold it: keys as values on every global layer or on
/// none (here none), the global layers' single KV head listed per layer.
fn tiny_dense() -> TinyGemma4 {
    TinyGemma4 {
        keys_as_values: vec![],
        seed: 406,
        ..TinyGemma4::default()
    }
}

fn write_reference(spec: &TinyGemma4) {
    let dir = std::env::var("THICKET_REFERENCE_HF").expect("THICKET_REFERENCE_HF");
    write_tiny_gemma4_hf(std::path::Path::new(&dir), spec).unwrap();
}

/// Writes the tiny Gemma 4 as an HF checkpoint where `THICKET_REFERENCE_HF` says, for
/// `scripts/transformers-reference.py --case gemma4`.
#[test]
#[ignore = "writes the reference checkpoint for scripts/transformers-reference.py"]
fn write_the_hf_reference() {
    write_reference(&tiny_dense());
}

/// The tiny mixture, for `--case gemma4_moe`.
#[test]
#[ignore = "writes the reference checkpoint for scripts/transformers-reference.py"]
fn write_the_moe_hf_reference() {
    write_reference(&TinyGemma4::mixture());
}

fn hf_model(spec: &TinyGemma4) -> (tempfile::TempDir, engine::Model) {
    super::hybrid_checks::hf_in_f32(|dir| write_tiny_gemma4_hf(dir, spec).unwrap())
}

fn gguf_model(spec: &TinyGemma4) -> engine::Model {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gemma4.gguf");
    write_tiny_gemma4_gguf(&path, spec, GgmlDType::F32).unwrap();
    let (config, weights) =
        engine::model::gguf::load_gguf_weights(&path, Some(DType::F32), &Device::Cpu).unwrap();
    engine::Model::new(config, weights, Device::Cpu)
        .unwrap()
        .with_kv_dtype(engine::cpu::kv_store::KvDtype::F32)
}

fn matches_transformers(spec: &TinyGemma4, reference: &str) {
    let (dir, model) = hf_model(spec);
    let bytes = std::fs::read(dir.path().join("model.safetensors")).unwrap();
    // Both compute in f32 with the exact tanh GELU. Measured: 5.2e-6 (dense) and 3.2e-5
    // (mixture) against logits up to 5.3; greedy tokens identical for 32 steps.
    super::llamacpp_reference::check_recorded(reference, &bytes, |_| model.clone(), 1e-4);
}

#[test]
fn gemma4_from_hf_matches_transformers() {
    matches_transformers(
        &tiny_dense(),
        include_str!("../data/gemma4_transformers.json"),
    );
}

#[test]
fn gemma4_moe_from_hf_matches_transformers() {
    matches_transformers(
        &TinyGemma4::mixture(),
        include_str!("../data/gemma4_moe_transformers.json"),
    );
}

#[test]
fn gemma4_loads_the_same_model_from_gguf_and_hf() {
    for spec in [tiny_dense(), TinyGemma4::mixture()] {
        let (_dir, hf) = hf_model(&spec);
        let gguf = gguf_model(&spec);
        let (a, b) = (gguf.config(), hf.config());
        for i in 0..a.num_layers {
            assert_eq!(a.layer_attention(i), b.layer_attention(i), "layer {i}");
            assert_eq!(a.layer_heads(i), b.layer_heads(i), "layer {i}");
            assert_eq!(a.layer_mlp_width(i), b.layer_mlp_width(i), "layer {i}");
        }
        assert_eq!(a.variant.proportional_pairs, b.variant.proportional_pairs);
        assert_eq!(a.variant.embedding_scale, b.variant.embedding_scale);
        assert_eq!(a.variant.final_softcap, b.variant.final_softcap);
        assert_eq!(a.variant.moe, b.variant.moe);
        assert_eq!(
            a.variant.local_rope_theta.map(f32::to_bits),
            b.variant.local_rope_theta.map(f32::to_bits)
        );
        assert_eq!(hf.kv_bytes_per_position(), gguf.kv_bytes_per_position());
        let found = super::families::compare(
            &hf,
            &super::families::PROMPT,
            super::families_gguf::as_reference(&gguf),
        );
        super::families::assert_close("gemma4 HF vs GGUF", &found);
    }
}

/// `dir`'s checkpoint rewritten as Google releases them: the text config under
/// `text_config`, the text model under `model.language_model`, a vision tower beside it.
fn as_multimodal(dir: &std::path::Path) {
    let path = dir.join("config.json");
    let text: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let top = serde_json::json!({
        "architectures": ["Gemma4ForConditionalGeneration"],
        "model_type": "gemma4",
        "text_config": text,
        "vision_config": {"model_type": "gemma4_vision", "hidden_size": 8},
        "audio_config": {"model_type": "gemma4_audio"},
        "tie_word_embeddings": false,
    });
    std::fs::write(&path, top.to_string()).unwrap();
    let file = dir.join("model.safetensors");
    let tensors = candle_core::safetensors::load(&file, &Device::Cpu).unwrap();
    let mut renamed: std::collections::HashMap<String, Tensor> = tensors
        .into_iter()
        .map(|(name, t)| match name.strip_prefix("model.") {
            Some(rest) => (format!("model.language_model.{rest}"), t),
            None => (name, t),
        })
        .collect();
    renamed.insert(
        "model.vision_tower.patch_embedder.weight".into(),
        Tensor::ones((8, 8), DType::F32, &Device::Cpu).unwrap(),
    );
    candle_core::safetensors::save(&renamed, &file).unwrap();
}

#[test]
fn the_multimodal_layout_loads_its_text_model() {
    let spec = tiny_dense();
    let (_dir, plain) = hf_model(&spec);
    let (_dir2, multimodal) = super::hybrid_checks::hf_in_f32(|dir| {
        write_tiny_gemma4_hf(dir, &spec).unwrap();
        as_multimodal(dir);
    });
    let found = super::families::compare(
        &multimodal,
        &super::families::PROMPT,
        super::families_gguf::as_reference(&plain),
    );
    assert_eq!(found.worst, 0.0, "the same weights give the same logits");
    assert!(found.scale > 1.0);
}

#[test]
fn a_config_thicket_cannot_honour_is_refused_by_its_key() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_gemma4_hf(dir.path(), &tiny_dense()).unwrap();
    let path = dir.path().join("config.json");
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    for (key, value, named) in [
        (
            "rope_parameters",
            serde_json::json!({"full_attention": {"rope_type": "yarn", "rope_theta": 1e6,
                                                  "factor": 4.0}}),
            "factor",
        ),
        (
            "use_bidirectional_attention",
            serde_json::json!("all"),
            "use_bidirectional_attention",
        ),
        (
            "per_layer_config",
            serde_json::json!({"02": {"head_dim": 32, "num_key_value_heads": 1},
                               "04": {"head_dim": 16}}),
            "layer 4",
        ),
        (
            "layer_types",
            serde_json::json!(["sliding_attention", "chunked_attention"]),
            "layer_types",
        ),
        (
            "hidden_activation",
            serde_json::json!("silu"),
            "hidden_activation",
        ),
    ] {
        let mut bad = config.clone();
        bad[key] = value;
        std::fs::write(&path, bad.to_string()).unwrap();
        let err =
            engine::model::load::load_hf_model(dir.path(), engine::WeightDType::F32, &Device::Cpu)
                .err()
                .unwrap_or_else(|| panic!("{key} was accepted"))
                .to_string();
        assert!(err.contains(named), "{key}: {err}");
    }
}
