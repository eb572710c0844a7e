//! gpt-oss on a tiny random GGUF written as llama.cpp's converter writes it (biased q/k/v/o,
//! sinks, a biased router over biased experts with the clamped SwiGLU, every other layer
//! windowed at 16 positions so the 38-position run passes the window, YaRN): against
//! llama.cpp's recorded run on the same file (`tests/data/gptoss_llamacpp.json`, made by
//! `scripts/rope-scaling-reference.py --case gptoss`), greedy tokens identical for 32 steps and
//! logits close; and with its experts in MXFP4 on thicket's kernels, the fused pass gives the
//! candle-ops bits, a prompt prefilled in chunks the token-by-token bits, and every node of a
//! draft tree its root path's bits (what lossless verification needs).

use candle_core::quantized::GgmlDType;
use candle_core::{DType, Device};
use engine::model::config::LayerMixer;
use engine::model::testing::{write_tiny_gptoss_gguf, TinyGptOss};
use engine::Model;

use super::hybrid_checks::{
    chunked_prefill_gives_token_by_token, fused_gives_candle_bits, tree_nodes_give_root_paths,
};

/// The tiny gpt-oss of the reference: f32 weights, experts included.
pub(crate) fn tiny_f32() -> TinyGptOss {
    TinyGptOss {
        mxfp4: false,
        ..TinyGptOss::default()
    }
}

pub(crate) fn load(spec: &TinyGptOss, dtype: GgmlDType, dense: Option<DType>) -> (Model, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gptoss.gguf");
    write_tiny_gptoss_gguf(&path, spec, dtype).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let (config, weights) =
        engine::model::gguf::load_gguf_weights(&path, dense, &Device::Cpu).unwrap();
    (Model::new(config, weights, Device::Cpu).unwrap(), bytes)
}

/// Writes the tiny gpt-oss (f32) where `THICKET_REFERENCE_GGUF` says, for
/// `scripts/rope-scaling-reference.py --case gptoss`.
#[test]
#[ignore = "writes the reference GGUF for scripts/rope-scaling-reference.py"]
fn write_the_reference_gguf() {
    let path = std::env::var("THICKET_REFERENCE_GGUF").expect("THICKET_REFERENCE_GGUF");
    write_tiny_gptoss_gguf(std::path::Path::new(&path), &tiny_f32(), GgmlDType::F32).unwrap();
}

/// The same with its experts in MXFP4, for `--case gptoss_mxfp4`.
#[test]
#[ignore = "writes the reference GGUF for scripts/rope-scaling-reference.py"]
fn write_the_mxfp4_reference_gguf() {
    let path = std::env::var("THICKET_REFERENCE_GGUF").expect("THICKET_REFERENCE_GGUF");
    let spec = TinyGptOss::default();
    write_tiny_gptoss_gguf(std::path::Path::new(&path), &spec, GgmlDType::F32).unwrap();
}

#[test]
fn the_file_declares_windows_sinks_biases_and_experts() {
    let (model, _) = load(&tiny_f32(), GgmlDType::F32, Some(DType::F32));
    let cfg = model.config();
    let windows: Vec<Option<usize>> = (0..cfg.num_layers)
        .map(|i| cfg.layer_attention(i).window)
        .collect();
    assert_eq!(windows, [Some(16), None, Some(16), None]);
    // A file that lists its windowed layers is read as it lists them.
    let listed = TinyGptOss {
        window_pattern: Some(vec![false, true, true, false]),
        ..tiny_f32()
    };
    let (other, _) = load(&listed, GgmlDType::F32, Some(DType::F32));
    let windows: Vec<Option<usize>> = (0..cfg.num_layers)
        .map(|i| other.config().layer_attention(i).window)
        .collect();
    assert_eq!(windows, [None, Some(16), Some(16), None]);
    assert!((0..cfg.num_layers).all(|i| cfg.layer_mixer(i) == LayerMixer::Attention));
    let moe = cfg.variant.moe.as_ref().unwrap();
    assert_eq!((moe.num_experts, moe.experts_per_token), (4, 2));
    assert_eq!(cfg.head_dim, 32);
    for layer in &model.weights().layers {
        let attention = layer.attention().unwrap();
        assert_eq!(attention.sinks.as_ref().map(Vec::len), Some(4));
        assert!(attention.o.bias().is_some() && attention.q.bias().is_some());
        let engine::model::experts::Mlp::Experts(moe) = &layer.mlp else {
            panic!("a dense layer");
        };
        assert_eq!(moe.router_bias.as_ref().map(Vec::len), Some(4));
        assert!(moe
            .experts
            .iter()
            .all(|e| e.projections().iter().all(|p| p.bias().is_some())));
    }
}

#[test]
fn gptoss_matches_llama_cpp() {
    // Measured: 1.4e-5 against logits up to 5.35 (f32 weights and K/V); greedy tokens
    // identical for 32 steps.
    let (model, bytes) = load(&tiny_f32(), GgmlDType::F32, Some(DType::F32));
    let model = model.with_kv_dtype(engine::cpu::kv_store::KvDtype::F32);
    super::hybrid_checks::matches_llama_cpp_in_chunks(
        &model,
        &bytes,
        include_str!("../data/gptoss_llamacpp.json"),
        1e-4,
    );
}

#[test]
fn mxfp4_gptoss_matches_llama_cpp() {
    // The experts on thicket's MXFP4 kernels (activations in 8-bit blocks, as llama.cpp's
    // MXFP4 product takes them), the rest f32. Measured: 2.7e-6 against logits up to 5.83.
    let (model, bytes) = load(&TinyGptOss::default(), GgmlDType::F32, None);
    let model = model.with_kv_dtype(engine::cpu::kv_store::KvDtype::F32);
    super::hybrid_checks::matches_llama_cpp_in_chunks(
        &model,
        &bytes,
        include_str!("../data/gptoss_mxfp4_llamacpp.json"),
        1e-4,
    );
}

#[test]
fn mxfp4_gptoss_fused_pass_chunks_and_trees_keep_their_bits() {
    let (model, _) = load(&TinyGptOss::default(), GgmlDType::Q8_0, None);
    fused_gives_candle_bits(&model);
    chunked_prefill_gives_token_by_token(&model, 3);
    tree_nodes_give_root_paths(&model, 4);
}
