//! Granite 4.0-H (`granitehybrid`), Mamba-2 layers and attention with Granite's µP scales,
//! checked against llama.cpp: tiny random-weight GGUFs written at test time
//! (`engine::model::testing::write_tiny_granite_gguf`) and llama.cpp's greedy tokens and
//! logits on the same files, recorded by `scripts/rope-scaling-reference.py` in
//! `tests/data/granitehybrid_llamacpp.json` (no RoPE, as converted hybrids are) and
//! `tests/data/granitehybrid_rope_llamacpp.json` (RoPE, the file silent). Also: the fused
//! pass gives the candle-ops bits, draft-tree nodes give their root paths, and a prompt
//! prefilled in chunks gives the token-by-token logits.

use candle_core::quantized::GgmlDType;
use candle_core::{DType, Device};
use engine::cpu::kv_store::KvDtype;
use engine::model::config::LayerMixer;
use engine::model::testing::{write_tiny_granite_gguf, TinyExperts, TinyGranite};
use engine::Model;

use super::hybrid_checks::{
    chunked_prefill_gives_token_by_token, fused_gives_candle_bits, tree_nodes_give_root_paths,
};

/// The tiny Granite 4.0-H of these tests: four layers, the third attending (four query
/// heads on two KV heads), Mamba-2 with eight heads in two groups, a state of 16, a
/// convolution of 4, scales on the embeddings, residual branches, queries and logits.
pub(crate) fn tiny_granite() -> TinyGranite {
    TinyGranite::default()
}

/// The tiny Granite mixture (H-Tiny's kind): each MLP four experts of 32, two per token
/// (their weights renormalized), beside an ungated shared expert of 64.
pub(crate) fn tiny_granite_moe() -> TinyGranite {
    TinyGranite {
        intermediate_size: 32,
        experts: Some(TinyExperts {
            count: 4,
            used: 2,
            width: 32,
            shared_width: Some(64),
            normalize: true,
            dense_layers: Vec::new(),
        }),
        seed: 47,
        ..TinyGranite::default()
    }
}

/// The same shape with RoPE on (the file says nothing of `rope.scaling.finetuned`).
fn tiny_granite_rope() -> TinyGranite {
    TinyGranite {
        rope: true,
        seed: 46,
        ..TinyGranite::default()
    }
}

/// `spec` written as a GGUF of `dtype` and loaded for the CPU (f32 K/V where `dtype` is).
pub(crate) fn granite_model(spec: &TinyGranite, dtype: GgmlDType) -> Model {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("granite.gguf");
    write_tiny_granite_gguf(&path, spec, dtype).unwrap();
    let load = (dtype == GgmlDType::F32).then_some(DType::F32);
    let (config, weights) =
        engine::model::gguf::load_gguf_weights(&path, load, &Device::Cpu).unwrap();
    let model = Model::new(config, weights, Device::Cpu).unwrap();
    match dtype {
        GgmlDType::F32 => model.with_kv_dtype(KvDtype::F32),
        _ => model,
    }
}

fn write_reference(spec: &TinyGranite) {
    let path = std::env::var("THICKET_REFERENCE_GGUF").expect("THICKET_REFERENCE_GGUF");
    write_tiny_granite_gguf(std::path::Path::new(&path), spec, GgmlDType::F32).unwrap();
}

/// Writes the tiny Granite (f32) where `THICKET_REFERENCE_GGUF` says, for
/// `scripts/rope-scaling-reference.py --case granitehybrid`.
#[test]
#[ignore = "writes the reference GGUF for scripts/rope-scaling-reference.py"]
fn write_the_reference_gguf() {
    write_reference(&tiny_granite());
}

/// The tiny mixture, for `--case granitehybrid_moe`.
#[test]
#[ignore = "writes the reference GGUF for scripts/rope-scaling-reference.py"]
fn write_the_moe_reference_gguf() {
    write_reference(&tiny_granite_moe());
}

/// The same with RoPE on, for `--case granitehybrid_rope`.
#[test]
#[ignore = "writes the reference GGUF for scripts/rope-scaling-reference.py"]
fn write_the_rope_reference_gguf() {
    write_reference(&tiny_granite_rope());
}

/// `spec` (f32) against llama.cpp's recorded run on the same file, and the prompt prefilled
/// in chunks of 1, 2 and 4 against llama.cpp's first logits.
fn matches_llama_cpp(spec: &TinyGranite, reference: &str, tolerance: f32) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("granite.gguf");
    write_tiny_granite_gguf(&path, spec, GgmlDType::F32).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let model = granite_model(spec, GgmlDType::F32);
    super::hybrid_checks::matches_llama_cpp_in_chunks(&model, &bytes, reference, tolerance);
}

#[test]
fn granitehybrid_matches_llama_cpp() {
    // llama.cpp's greedy tokens and logits on the same file, recorded by
    // scripts/rope-scaling-reference.py (f32 weights, K/V and states, attention in f32).
    // Measured: 1.5e-6 against logits up to 1.85; greedy tokens identical for 32 steps.
    matches_llama_cpp(
        &tiny_granite(),
        include_str!("../data/granitehybrid_llamacpp.json"),
        1e-4,
    );
}

#[test]
fn granitehybrid_moe_matches_llama_cpp() {
    // Measured: 1.6e-6 against logits up to 1.76.
    matches_llama_cpp(
        &tiny_granite_moe(),
        include_str!("../data/granitehybrid_moe_llamacpp.json"),
        1e-4,
    );
}

#[test]
fn granitehybrid_with_rope_matches_llama_cpp() {
    // Measured: 1.4e-6 against logits up to 1.87.
    matches_llama_cpp(
        &tiny_granite_rope(),
        include_str!("../data/granitehybrid_rope_llamacpp.json"),
        1e-4,
    );
}

#[test]
fn the_file_declares_mamba2_layers_no_rope_and_the_scales() {
    let model = granite_model(&tiny_granite(), GgmlDType::F32);
    let cfg = model.config();
    let kinds: Vec<bool> = (0..cfg.num_layers)
        .map(|i| matches!(cfg.layer_mixer(i), LayerMixer::Mamba2(_)))
        .collect();
    assert_eq!(kinds, [true, true, false, true]);
    let LayerMixer::Mamba2(shape) = cfg.layer_mixer(0) else {
        unreachable!()
    };
    assert_eq!(
        (
            shape.key_heads,
            shape.value_heads,
            shape.key_dim,
            shape.value_dim
        ),
        (2, 8, 16, 8)
    );
    assert_eq!(shape.kernel, 4);
    assert_eq!(cfg.rotary_dim(), 0);
    let v = &cfg.variant;
    assert_eq!(
        (
            v.embedding_scale,
            v.residual_scale,
            v.attention_scale,
            v.logit_scale
        ),
        (Some(1.5), Some(0.6), Some(0.3), Some(2.0))
    );
    let rope = granite_model(&tiny_granite_rope(), GgmlDType::F32);
    assert_eq!(rope.config().rotary_dim(), rope.config().head_dim);
}

/// The tiny Granite with an MLP wide enough for Q8_0's blocks of 32.
pub(crate) fn tiny_granite_q8() -> TinyGranite {
    TinyGranite {
        intermediate_size: 64,
        ..tiny_granite()
    }
}

#[test]
fn granitehybrid_fused_pass_gives_the_candle_ops_bits() {
    for spec in [
        tiny_granite_q8(),
        TinyGranite {
            rope: true,
            ..tiny_granite_q8()
        },
        tiny_granite_moe(),
    ] {
        fused_gives_candle_bits(&granite_model(&spec, GgmlDType::Q8_0));
    }
}

#[test]
fn granitehybrid_prefill_in_chunks_gives_the_token_by_token_logits() {
    // Chunk boundaries at every offset inside the four-position convolution, and one chunk.
    chunked_prefill_gives_token_by_token(&granite_model(&tiny_granite_q8(), GgmlDType::Q8_0), 19);
}

#[test]
fn granitehybrid_tree_nodes_match_their_root_paths() {
    tree_nodes_give_root_paths(&granite_model(&tiny_granite_q8(), GgmlDType::Q8_0), 14);
}
