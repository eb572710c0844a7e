//! The families from GGUF files: a tiny random checkpoint of each, converted with llama.cpp's
//! names and conventions (`engine::model::testing::write_tiny_gguf`: Gemma's norms with one
//! added, llama's query and key rows permuted for interleaved RoPE), loads to the model its HF
//! checkpoint loads to (same logits for 32 greedy steps); and a Qwen3 GGUF in Q8_0 against
//! candle-transformers' `quantized_qwen3`, with candle's quantized matmul and attention ops
//! (thicket's own kernels are checked against those in `candle_oracle`): close logits, and
//! greedy choices that differ only at near-ties.

use candle_core::quantized::GgmlDType;
use candle_core::{DType, Device, Tensor};
use candle_transformers::models::quantized_qwen3;
use engine::cpu::attention::AttentionKernel;
use engine::cpu::kv_store::KvDtype;
use engine::model::config::Architecture;
use engine::model::testing::{write_tiny_gguf, TinyModelSpec};
use engine::QuantKernel;
use engine::{LogitRows, Model, TokenTree, TreeBatch};

use super::families::{
    assert_close, compare, compare_within, tiny_gemma2, tiny_gemma3, tiny_phi3,
    tiny_phi3_partial_rotary, tiny_qwen3, PROMPT,
};
use crate::support::fixtures::{one_sequence, tiny_model};

/// `spec` as a GGUF in `dtype`, loaded dense in f32 (or kept quantized: `quantized`).
fn gguf_model(
    spec: &TinyModelSpec,
    dtype: GgmlDType,
    quantized: bool,
) -> (tempfile::TempDir, Model) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    write_tiny_gguf(&path, spec, dtype).unwrap();
    let dense = (!quantized).then_some(DType::F32);
    let (config, weights) =
        engine::model::gguf::load_gguf_weights(&path, dense, &Device::Cpu).unwrap();
    (dir, Model::new(config, weights, Device::Cpu).unwrap())
}

/// `other` as a reference for `compare`: its own sequence, fed the same tokens.
pub(crate) fn as_reference(
    other: &Model,
) -> impl FnMut(&Tensor, usize) -> candle_core::Result<Tensor> + '_ {
    let (table, mut kv) = one_sequence(other, PROMPT.len() + super::families::STEPS + 1, 4);
    move |x, pos| {
        let tokens = x.flatten_all()?.to_vec1::<u32>()?;
        let mut batch = TreeBatch::new(4);
        batch
            .push(pos, &table, &TokenTree::chain(&tokens), LogitRows::Last)
            .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        batch
            .set_state(0, super::families::KEPT)
            .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        other
            .forward(&batch, &mut kv)
            .map_err(|e| candle_core::Error::Msg(e.to_string()))
    }
}

#[test]
fn every_family_loads_the_same_model_from_gguf_and_hf() {
    let llama = TinyModelSpec {
        vocab_size: 300,
        ..TinyModelSpec::default()
    };
    let qwen2 = TinyModelSpec {
        architecture: Architecture::Qwen2,
        ..llama.clone()
    };
    for spec in [
        llama,
        qwen2,
        tiny_qwen3(),
        tiny_phi3(),
        tiny_phi3_partial_rotary(),
        tiny_gemma2(),
        tiny_gemma3(),
    ] {
        let name = format!("{:?}", spec.architecture);
        let (_hf_dir, hf) = tiny_model(&spec);
        let (_gguf_dir, gguf) = gguf_model(&spec, GgmlDType::F32, false);
        let (a, b) = (hf.config(), gguf.config());
        assert_eq!(a.architecture, b.architecture, "{name}");
        assert_eq!(a.rope_style == b.rope_style, name != "Llama", "{name}");
        for i in 0..a.num_layers {
            assert_eq!(
                a.layer_attention(i),
                b.layer_attention(i),
                "{name} layer {i}"
            );
        }
        assert_eq!(a.attention_scale(), b.attention_scale(), "{name}");
        let found = compare(&gguf, &PROMPT, as_reference(&hf));
        assert_close(&format!("{name} GGUF vs HF"), &found);
    }
}

#[test]
fn tiny_qwen3_gguf_q8_0_matches_candle_quantized_qwen3() {
    let spec = tiny_qwen3();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    write_tiny_gguf(&path, &spec, GgmlDType::Q8_0).unwrap();
    let (config, weights) =
        engine::model::gguf::load_gguf_weights(&path, None, &Device::Cpu).unwrap();
    // With candle's arithmetic (its quantized matmul, its attention ops, f32 K/V), so that
    // everything else (GGUF names, QK norm, wide heads) must give candle's tokens exactly.
    let ours = Model::new(config, weights, Device::Cpu)
        .unwrap()
        .with_attention(AttentionKernel::Reference)
        .with_quant_kernel(QuantKernel::Candle)
        .unwrap()
        .with_kv_dtype(KvDtype::F32);
    let mut file = std::fs::File::open(&path).unwrap();
    let content = candle_core::quantized::gguf_file::Content::read(&mut file).unwrap();
    let mut reference =
        quantized_qwen3::ModelWeights::from_gguf(content, &mut file, &Device::Cpu).unwrap();
    // candle's CPU path computes RoPE's frequencies in f64 and attention in a kernel of its
    // own: one-ulp differences that 8-bit activation rounding can turn into a step of the
    // rounding grid. Logits agree to 3% of their scale (measured: 0.11 of 5.4), and a greedy
    // choice may differ only where the two tokens lie within 0.25 of each other in candle's
    // logits (measured: one step of 33).
    let found = compare_within(&ours, &PROMPT, |x, pos| reference.forward(x, pos), 0.25);
    assert_q8_close(&found);
}

/// A Q8_0 model against candle's quantized one: logits within 3% of their scale, and at most
/// two greedy choices that differ (each a near-tie: `compare_within`'s 0.25).
pub(crate) fn assert_q8_close(found: &super::families::Agreement) {
    assert!(
        found.worst < 0.03 * found.scale && found.scale > 1.0,
        "max |ours - candle| = {} against logits up to {}",
        found.worst,
        found.scale
    );
    assert!(found.near_ties <= 2, "{} near ties", found.near_ties);
}

#[test]
fn llama3_rope_freqs_in_gguf_give_the_hf_scaling() {
    // llama.cpp's converter writes Llama 3.1's scaling as per-frequency divisors
    // (`rope_freqs.weight`); the HF config states its parameters. Both must rotate alike.
    let spec = TinyModelSpec {
        vocab_size: 300,
        seed: 12,
        rope_scaling: Some(serde_json::json!({
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        })),
        ..TinyModelSpec::default()
    };
    let (_hf_dir, hf) = tiny_model(&spec);
    let (_gguf_dir, gguf) = gguf_model(&spec, GgmlDType::F32, false);
    assert!(matches!(
        gguf.config().variant.rope_scaling,
        engine::model::config::RopeScaling::Factors(ref f) if f.len() == 8
    ));
    let found = compare(&gguf, &PROMPT, as_reference(&hf));
    assert_close("llama3 rope_freqs GGUF vs HF", &found);
}

#[test]
fn gemma_27b_gguf_files_scale_queries_by_the_residual_per_head() {
    // Gemma 2 27B: 46 layers, residual 4608, 32 heads of 128; its queries are scaled by
    // 1/sqrt(4608 / 32) = 1/12, as `query_pre_attn_scalar = 144` says in its HF config. GGUF
    // carries no such key: the layer count identifies the model, as in llama.cpp.
    use candle_core::quantized::gguf_file::{self, Value};
    let dir = tempfile::tempdir().unwrap();
    for (layers, scale) in [(46u32, 1.0 / 12.0), (42, 1.0 / (128f64).sqrt())] {
        let path = dir.path().join(format!("gemma2-{layers}.gguf"));
        let keys: Vec<(&str, Value)> = vec![
            ("general.architecture", Value::String("gemma2".into())),
            ("gemma2.embedding_length", Value::U32(4608)),
            ("gemma2.block_count", Value::U32(layers)),
            ("gemma2.feed_forward_length", Value::U32(36864)),
            ("gemma2.attention.head_count", Value::U32(32)),
            ("gemma2.attention.head_count_kv", Value::U32(16)),
            ("gemma2.attention.key_length", Value::U32(128)),
            ("gemma2.attention.value_length", Value::U32(128)),
            ("gemma2.attention.sliding_window", Value::U32(4096)),
            ("gemma2.attention.layer_norm_rms_epsilon", Value::F32(1e-6)),
            ("gemma2.vocab_size", Value::U32(256_000)),
        ];
        let keys: Vec<(&str, &Value)> = keys.iter().map(|(k, v)| (*k, v)).collect();
        let mut file = std::fs::File::create(&path).unwrap();
        gguf_file::write(&mut file, &keys, &[]).unwrap();
        drop(file);
        let (content, _) = engine::model::gguf::read_content(&path).unwrap();
        let config = engine::model::gguf::config_from_gguf(&content).unwrap();
        assert_eq!(config.attention_scale(), scale as f32, "{layers} layers");
        assert_eq!(config.layer_attention(0).window, Some(4096));
        assert_eq!(config.layer_attention(1).window, None);
    }
}
