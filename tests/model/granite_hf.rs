//! Granite 4.0-H as Hugging Face checkpoints: the tiny models of `tests/model/granite.rs`
//! written by `engine::model::testing::write_tiny_granite_hf` (the same weights as the GGUFs,
//! laid out as the released `GraniteMoeHybridForCausalLM` checkpoints), loaded as the GGUF
//! loads them, and transformers' greedy tokens and logits on them, recorded by
//! `scripts/transformers-reference.py` in `tests/data/granitehybrid_transformers.json` and
//! `tests/data/granitehybrid_moe_transformers.json`.

use candle_core::quantized::GgmlDType;
use engine::model::config::{KeyHeadsOfValues, LayerMixer};
use engine::model::testing::{write_tiny_granite_hf, TinyGranite};

use super::granite::{granite_model, tiny_granite, tiny_granite_moe};

fn write_reference(spec: &TinyGranite) {
    let dir = std::env::var("THICKET_REFERENCE_HF").expect("THICKET_REFERENCE_HF");
    write_tiny_granite_hf(std::path::Path::new(&dir), spec).unwrap();
}

/// Writes the tiny Granite as an HF checkpoint where `THICKET_REFERENCE_HF` says, for
/// `scripts/transformers-reference.py --case granitehybrid`.
#[test]
#[ignore = "writes the reference checkpoint for scripts/transformers-reference.py"]
fn write_the_hf_reference() {
    write_reference(&tiny_granite());
}

/// The tiny Granite mixture, for `--case granitehybrid_moe`.
#[test]
#[ignore = "writes the reference checkpoint for scripts/transformers-reference.py"]
fn write_the_moe_hf_reference() {
    write_reference(&tiny_granite_moe());
}

/// `spec` written as an HF checkpoint and loaded in f32.
fn hf_model(spec: &TinyGranite) -> (tempfile::TempDir, engine::Model) {
    super::hybrid_checks::hf_in_f32(|dir| write_tiny_granite_hf(dir, spec).unwrap())
}

/// `spec` as an HF checkpoint against transformers' recorded run on the same files.
fn matches_transformers(spec: &TinyGranite, reference: &str) {
    let (dir, model) = hf_model(spec);
    let bytes = std::fs::read(dir.path().join("model.safetensors")).unwrap();
    assert!(model.is_recurrent());
    // Measured: 1.4e-6 (dense) and 1.7e-6 (mixture) against logits up to 1.9; greedy tokens
    // identical for 32 steps.
    super::llamacpp_reference::check_recorded(reference, &bytes, |_| model.clone(), 1e-4);
}

#[test]
fn granitehybrid_from_hf_matches_transformers() {
    matches_transformers(
        &tiny_granite(),
        include_str!("../data/granitehybrid_transformers.json"),
    );
}

#[test]
fn granitehybrid_moe_from_hf_matches_transformers() {
    matches_transformers(
        &tiny_granite_moe(),
        include_str!("../data/granitehybrid_moe_transformers.json"),
    );
}

#[test]
fn granitehybrid_loads_the_same_model_from_gguf_and_hf() {
    for spec in [tiny_granite(), tiny_granite_moe()] {
        let (_dir, hf) = hf_model(&spec);
        let gguf = granite_model(&spec, GgmlDType::F32);
        let (a, b) = (gguf.config(), hf.config());
        assert_eq!(a.variant.mixers, b.variant.mixers);
        let LayerMixer::Mamba2(shape) = b.layer_mixer(0) else {
            panic!("layer 0 is a Mamba-2 layer")
        };
        assert_eq!(shape.key_heads_of_values, KeyHeadsOfValues::Grouped);
        assert_eq!(
            (a.variant.embedding_scale, a.variant.residual_scale),
            (b.variant.embedding_scale, b.variant.residual_scale)
        );
        assert_eq!(
            (
                a.variant.attention_scale,
                a.variant.logit_scale,
                b.rotary_dim()
            ),
            (b.variant.attention_scale, b.variant.logit_scale, 0)
        );
        let found = super::families::compare(
            &hf,
            &super::families::PROMPT,
            super::families_gguf::as_reference(&gguf),
        );
        super::families::assert_close("granitehybrid HF vs GGUF", &found);
    }
}

#[test]
fn a_clamped_step_or_a_biased_input_projection_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_granite_hf(dir.path(), &tiny_granite()).unwrap();
    let path = dir.path().join("config.json");
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    for (key, value, named) in [
        (
            "time_step_limit",
            serde_json::json!([0.001, 0.1]),
            "time_step_limit",
        ),
        (
            "mamba_proj_bias",
            serde_json::json!(true),
            "mamba_proj_bias",
        ),
        (
            "layer_types",
            serde_json::json!(["mamba", "moe", "attention", "mamba"]),
            "moe",
        ),
    ] {
        let mut changed = config.clone();
        changed[key] = value;
        std::fs::write(&path, changed.to_string()).unwrap();
        let err = engine::model::load::load_hf_model(
            dir.path(),
            engine::WeightDType::F32,
            &candle_core::Device::Cpu,
        )
        .err()
        .unwrap_or_else(|| panic!("{key} was accepted"))
        .to_string();
        assert!(err.contains(named), "{key}: {err}");
    }
}
