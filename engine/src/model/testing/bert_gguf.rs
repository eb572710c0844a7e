//! A BERT Hugging Face folder written as a `bert` GGUF the way llama.cpp's converter writes
//! one (its tensor names, `bert.*` metadata with the pooling type, and the vocabulary with `▁`
//! marking a word's first piece and the `##` of continuing pieces stripped, BERT's five
//! special tokens as control tokens), in f32, for tests that must not run the converter.

use std::path::Path;

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device};

use crate::encoder::weights::gguf_name;
use crate::{Error, Result};

/// Writes the BERT in `hf_dir` (`config.json`, `model.safetensors`, `tokenizer.json`) to
/// `out` with `pooling_type` (1 mean, 2 CLS).
pub fn write_bert_gguf(hf_dir: &Path, out: &Path, pooling_type: u32) -> Result<()> {
    let config: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(hf_dir.join("config.json"))
            .map_err(|e| Error::io("read config.json", e))?,
    )
    .map_err(|e| Error::Metadata(e.to_string()))?;
    let tokenizer: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(hf_dir.join("tokenizer.json"))
            .map_err(|e| Error::io("read tokenizer.json", e))?,
    )
    .map_err(|e| Error::Metadata(e.to_string()))?;
    let vocab = tokenizer["model"]["vocab"]
        .as_object()
        .ok_or_else(|| Error::Metadata("tokenizer.json has no WordPiece vocabulary".into()))?;
    let mut pieces = vec![String::new(); vocab.len()];
    for (piece, id) in vocab {
        let id = id.as_u64().unwrap_or(0) as usize;
        if let Some(slot) = pieces.get_mut(id) {
            *slot = piece.clone();
        }
    }
    let specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"];
    let id_of = |name: &str| pieces.iter().position(|p| p == name).unwrap_or(0) as u32;
    let (tokens, types): (Vec<Value>, Vec<Value>) = pieces
        .iter()
        .map(
            |p| match (specials.contains(&p.as_str()), p.strip_prefix("##")) {
                (true, _) => (Value::String(p.clone()), Value::I32(3)),
                (false, Some(rest)) => (Value::String(rest.to_string()), Value::I32(1)),
                (false, None) => (Value::String(format!("\u{2581}{p}")), Value::I32(1)),
            },
        )
        .unzip();
    let number = |key: &str| Value::U32(config[key].as_u64().unwrap_or(0) as u32);
    let metadata: Vec<(&str, Value)> = vec![
        ("general.architecture", Value::String("bert".into())),
        ("bert.block_count", number("num_hidden_layers")),
        ("bert.context_length", number("max_position_embeddings")),
        ("bert.embedding_length", number("hidden_size")),
        ("bert.feed_forward_length", number("intermediate_size")),
        ("bert.attention.head_count", number("num_attention_heads")),
        (
            "bert.attention.layer_norm_epsilon",
            Value::F32(config["layer_norm_eps"].as_f64().unwrap_or(1e-12) as f32),
        ),
        ("bert.attention.causal", Value::Bool(false)),
        ("bert.pooling_type", Value::U32(pooling_type)),
        ("tokenizer.ggml.model", Value::String("bert".into())),
        ("tokenizer.ggml.tokens", Value::Array(tokens)),
        ("tokenizer.ggml.token_type", Value::Array(types)),
        ("tokenizer.ggml.bos_token_id", Value::U32(id_of("[CLS]"))),
        ("tokenizer.ggml.eos_token_id", Value::U32(id_of("[SEP]"))),
        (
            "tokenizer.ggml.seperator_token_id",
            Value::U32(id_of("[SEP]")),
        ),
        (
            "tokenizer.ggml.unknown_token_id",
            Value::U32(id_of("[UNK]")),
        ),
        (
            "tokenizer.ggml.padding_token_id",
            Value::U32(id_of("[PAD]")),
        ),
        ("tokenizer.ggml.normalizer.lowercase", Value::Bool(true)),
    ];
    let st = candle_core::safetensors::load(hf_dir.join("model.safetensors"), &Device::Cpu)?;
    let mut tensors = Vec::new();
    for (name, tensor) in &st {
        let name = name.strip_prefix("bert.").unwrap_or(name);
        let Some(gguf) = gguf_name(name) else {
            continue;
        };
        let q = QTensor::quantize(&tensor.to_dtype(DType::F32)?, GgmlDType::F32)?;
        tensors.push((gguf, q));
    }
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    let mut file = std::fs::File::create(out)
        .map_err(|e| Error::io(format!("create {}", out.display()), e))?;
    let md: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (*k, v)).collect();
    let ts: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    candle_core::quantized::gguf_file::write(&mut file, &md, &ts)?;
    Ok(())
}
