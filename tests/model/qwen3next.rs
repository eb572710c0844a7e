//! Qwen3-Next (`qwen3next`), a hybrid of Gated DeltaNet layers and gated attention layers with
//! routed experts and a gated shared expert in every layer, checked against llama.cpp: tiny
//! random-weight GGUFs written at test time (`engine::model::testing::write_tiny_qwen35_gguf`
//! with a `qwen3next` family) and llama.cpp's greedy tokens and logits on the same files,
//! recorded by `scripts/rope-scaling-reference.py` in `tests/data/qwen3next_llamacpp.json`
//! (the layout today's converter writes) and `tests/data/qwen3next_ssm_in_llamacpp.json`
//! (the same model as the first converter wrote it, the DeltaNet input fused in `ssm_in`).

use candle_core::quantized::GgmlDType;
use engine::model::testing::{write_tiny_qwen35_gguf, Qwen35Family, TinyExperts, TinyQwen35};

/// The tiny Qwen3-Next of these tests: four layers, the second and fourth attending, four
/// value heads grouped two by two over two key heads in the DeltaNet layers, a quarter of
/// each attention head turned by RoPE; each MLP four experts of width 32 (two per token,
/// their weights renormalized) beside a gated shared expert of width 64.
pub(crate) fn tiny_qwen3next() -> TinyQwen35 {
    TinyQwen35 {
        experts: Some(TinyExperts {
            count: 4,
            used: 2,
            width: 32,
            shared_width: Some(64),
            normalize: true,
            dense_layers: Vec::new(),
        }),
        family: Qwen35Family::Qwen3Next,
        seed: 80,
        ..TinyQwen35::default()
    }
}

/// The same model as the first converter wrote it: `ssm_in` in place of `attn_qkv` and
/// `attn_gate`, no `attention.recurrent_layers`.
pub(crate) fn tiny_qwen3next_ssm_in() -> TinyQwen35 {
    TinyQwen35 {
        family: Qwen35Family::Qwen3NextSsmIn,
        ..tiny_qwen3next()
    }
}

/// Writes the tiny Qwen3-Next (f32) where `THICKET_REFERENCE_GGUF` says, for
/// `scripts/rope-scaling-reference.py --case qwen3next`.
#[test]
#[ignore = "writes the reference GGUF for scripts/rope-scaling-reference.py"]
fn write_the_reference_gguf() {
    let path = std::env::var("THICKET_REFERENCE_GGUF").expect("THICKET_REFERENCE_GGUF");
    write_tiny_qwen35_gguf(
        std::path::Path::new(&path),
        &tiny_qwen3next(),
        GgmlDType::F32,
    )
    .unwrap();
}

/// Writes the tiny Qwen3-Next with `ssm_in` (f32) where `THICKET_REFERENCE_GGUF` says, for
/// `scripts/rope-scaling-reference.py --case qwen3next_ssm_in`.
#[test]
#[ignore = "writes the reference GGUF for scripts/rope-scaling-reference.py"]
fn write_the_ssm_in_reference_gguf() {
    let path = std::env::var("THICKET_REFERENCE_GGUF").expect("THICKET_REFERENCE_GGUF");
    write_tiny_qwen35_gguf(
        std::path::Path::new(&path),
        &tiny_qwen3next_ssm_in(),
        GgmlDType::F32,
    )
    .unwrap();
}

#[test]
fn qwen3next_matches_llama_cpp() {
    // llama.cpp's greedy tokens and logits on the same file (f32 weights, K/V and states,
    // attention in f32), recorded by scripts/rope-scaling-reference.py.
    super::qwen35::matches_llama_cpp(
        &tiny_qwen3next(),
        include_str!("../data/qwen3next_llamacpp.json"),
        1e-4,
    );
}

#[test]
fn qwen3next_with_the_first_converters_ssm_in_matches_llama_cpp() {
    super::qwen35::matches_llama_cpp(
        &tiny_qwen3next_ssm_in(),
        include_str!("../data/qwen3next_ssm_in_llamacpp.json"),
        1e-4,
    );
}

#[test]
fn qwen3next_value_heads_are_grouped_and_its_mtp_free_layers_load() {
    use engine::model::config::{KeyHeadsOfValues, LayerMixer};
    for spec in [tiny_qwen3next(), tiny_qwen3next_ssm_in()] {
        let (_dir, model) = super::qwen35_forward::qwen35_model(&spec, GgmlDType::Q8_0, false);
        let cfg = model.config();
        let LayerMixer::DeltaNet(shape) = cfg.layer_mixer(0) else {
            panic!("layer 0 is a Gated DeltaNet layer")
        };
        assert_eq!(shape.key_heads_of_values, KeyHeadsOfValues::Grouped);
        assert_eq!(cfg.layer_mixer(1), LayerMixer::Attention);
        assert!(cfg.variant.gated_attention && cfg.variant.moe.is_some());
    }
}
