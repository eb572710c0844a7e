//! An encoder from a GGUF file of architecture `bert`, as llama.cpp's converter writes one: the
//! geometry from `bert.*` metadata, the pooling from `bert.pooling_type` (mean, CLS, last, or a
//! reranker's head; embeddings are normalized, as llama-server gives them), and the WordPiece
//! tokenizer rebuilt from `tokenizer.ggml.*`: the converter marks a word's first piece with a
//! leading `▁` and strips the `##` of the pieces that continue one, so `▁the` is `the` again
//! and `ing` is `##ing`; control tokens stay as they are.

use std::path::Path;

use candle_core::quantized::gguf_file::{Content, Value};

use super::config::{EncoderActivation, EncoderConfig, EncoderTask, Pooling, PoolingMode};
use crate::{Error, Result};

/// Whether the GGUF at `path` holds an encoder (`general.architecture` `bert`).
pub fn is_encoder_gguf(path: &Path) -> bool {
    crate::model::gguf::read_content(path).is_ok_and(|(content, _)| {
        content
            .metadata
            .get("general.architecture")
            .and_then(|v| v.to_string().ok())
            .is_some_and(|a| a == "bert")
    })
}

fn get<'a>(content: &'a Content, key: &str) -> Result<&'a Value> {
    content
        .metadata
        .get(key)
        .ok_or_else(|| Error::Metadata(format!("the GGUF has no {key}")))
}

fn number(content: &Content, key: &str) -> Result<usize> {
    let v = get(content, key)?;
    v.to_u32()
        .map(|n| n as usize)
        .or_else(|_| v.to_u64().map(|n| n as usize))
        .map_err(|e| Error::Metadata(format!("{key}: {e}")))
}

/// The geometry and the task a `bert` GGUF declares.
pub fn read_config(content: &Content) -> Result<(EncoderConfig, EncoderTask)> {
    let arch = get(content, "general.architecture")?
        .to_string()
        .map_err(|e| Error::Metadata(e.to_string()))?;
    if arch != "bert" {
        return Err(Error::UnsupportedArchitecture(arch.clone()));
    }
    let rows = |name: &str| {
        content
            .tensor_infos
            .get(name)
            .and_then(|t| t.shape.dims().first().copied())
    };
    if content.tensor_infos.contains_key("blk.0.attn_qkv.weight") {
        return Err(Error::Metadata(
            "bert GGUF with a fused attn_qkv is not supported (separate attn_q, attn_k, attn_v)"
                .into(),
        ));
    }
    let vocab = get(content, "tokenizer.ggml.tokens")?
        .to_vec()
        .map_err(|e| Error::Metadata(e.to_string()))?
        .len();
    let config = EncoderConfig {
        hidden_size: number(content, "bert.embedding_length")?,
        num_heads: number(content, "bert.attention.head_count")?,
        num_layers: number(content, "bert.block_count")?,
        intermediate_size: number(content, "bert.feed_forward_length")?,
        vocab_size: vocab,
        max_positions: number(content, "bert.context_length")?,
        type_vocab_size: rows("token_types.weight").unwrap_or(0),
        layer_norm_eps: get(content, "bert.attention.layer_norm_epsilon")?
            .to_f32()
            .map(f64::from)
            .map_err(|e| Error::Metadata(e.to_string()))?,
        activation: EncoderActivation::Gelu,
        matryoshka: None,
    };
    if config.num_heads == 0 || !config.hidden_size.is_multiple_of(config.num_heads) {
        return Err(Error::Metadata(format!(
            "bert.embedding_length {} is not a multiple of bert.attention.head_count {}",
            config.hidden_size, config.num_heads
        )));
    }
    let pooling = content
        .metadata
        .get("bert.pooling_type")
        .and_then(|v| {
            v.to_u32()
                .ok()
                .or_else(|| v.to_i32().ok().map(|n| n as u32))
        })
        .unwrap_or(1);
    let embed = |mode| {
        EncoderTask::Embed(Pooling {
            mode,
            normalize: true,
        })
    };
    let task = match pooling {
        1 => embed(PoolingMode::Mean),
        2 => embed(PoolingMode::Cls),
        3 => embed(PoolingMode::Last),
        4 => EncoderTask::Classify {
            labels: rows("cls.output.weight").ok_or_else(|| {
                Error::Metadata("a reranking bert GGUF (pooling type 4) without cls.output".into())
            })?,
        },
        other => {
            return Err(Error::Metadata(format!(
                "bert.pooling_type {other} is not supported (1 mean, 2 cls, 3 last, 4 rank)"
            )))
        }
    };
    Ok((config, task))
}

/// The `tokenizer.json` of the WordPiece vocabulary the GGUF holds.
pub fn tokenizer_json(content: &Content) -> Result<serde_json::Value> {
    let md = &content.metadata;
    let list = |key: &str| -> Result<&Vec<Value>> {
        get(content, key)?
            .to_vec()
            .map_err(|e| Error::Metadata(format!("{key}: {e}")))
    };
    let tokens = list("tokenizer.ggml.tokens")?;
    let types = list("tokenizer.ggml.token_type").ok();
    let id = |key: &str| md.get(key).and_then(|v| v.to_u32().ok());
    const CONTROL: i32 = 3;
    let mut vocab = Vec::with_capacity(tokens.len());
    let mut specials = Vec::new();
    for (i, token) in tokens.iter().enumerate() {
        let text = token
            .to_string()
            .map_err(|e| Error::Metadata(format!("tokenizer.ggml.tokens: {e}")))?;
        let control = types
            .and_then(|t| t.get(i))
            .and_then(|v| v.to_i32().ok())
            .is_some_and(|t| t == CONTROL);
        let piece = if control {
            specials.push((i, text.clone()));
            text.clone()
        } else if let Some(word) = text.strip_prefix('\u{2581}') {
            word.to_string()
        } else {
            format!("##{text}")
        };
        vocab.push(piece);
    }
    let name = |key: &str, fallback: &str| -> String {
        id(key)
            .and_then(|i| vocab.get(i as usize).cloned())
            .unwrap_or_else(|| fallback.to_string())
    };
    let (cls, sep, unk) = (
        name("tokenizer.ggml.bos_token_id", "[CLS]"),
        name("tokenizer.ggml.seperator_token_id", "[SEP]"),
        name("tokenizer.ggml.unknown_token_id", "[UNK]"),
    );
    let lowercase = md
        .get("tokenizer.ggml.normalizer.lowercase")
        .and_then(|v| v.to_bool().ok())
        .unwrap_or(true);
    let index = |piece: &str| vocab.iter().position(|p| p == piece);
    let (cls_id, sep_id) = match (index(&cls), index(&sep)) {
        (Some(c), Some(s)) => (c, s),
        _ => {
            return Err(Error::Tokenizer(
                "the GGUF names no [CLS] or [SEP] token".into(),
            ))
        }
    };
    Ok(wordpiece_json(
        &vocab,
        &specials,
        (&cls, cls_id),
        (&sep, sep_id),
        &unk,
        lowercase,
    ))
}

/// BERT's `tokenizer.json` over `vocab` (WordPiece pieces, `##` marking continuations):
/// BERT's normalizer and pre-tokenizer, `[CLS] A [SEP]` and `[CLS] A [SEP] B [SEP]` with the
/// segments as token types, `specials` as special added tokens.
pub fn wordpiece_json(
    vocab: &[String],
    specials: &[(usize, String)],
    (cls, cls_id): (&str, usize),
    (sep, sep_id): (&str, usize),
    unk: &str,
    lowercase: bool,
) -> serde_json::Value {
    use serde_json::json;
    let pieces: serde_json::Map<String, serde_json::Value> = vocab
        .iter()
        .enumerate()
        .map(|(i, w)| (w.clone(), json!(i)))
        .collect();
    let added: Vec<serde_json::Value> = specials
        .iter()
        .map(|(id, content)| {
            json!({"id": id, "content": content, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let special = |id: &str, type_id: u32| json!({"SpecialToken": {"id": id, "type_id": type_id}});
    let sequence = |id: &str, type_id: u32| json!({"Sequence": {"id": id, "type_id": type_id}});
    let mut special_tokens = serde_json::Map::new();
    for (name, id) in [(cls, cls_id), (sep, sep_id)] {
        special_tokens.insert(
            name.to_string(),
            json!({"id": name, "ids": [id], "tokens": [name]}),
        );
    }
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": {"type": "BertNormalizer", "clean_text": true,
            "handle_chinese_chars": true, "strip_accents": null, "lowercase": lowercase},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [special(cls, 0), sequence("A", 0), special(sep, 0)],
            "pair": [special(cls, 0), sequence("A", 0), special(sep, 0), sequence("B", 1),
                special(sep, 1)],
            "special_tokens": special_tokens,
        },
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": true},
        "model": {"type": "WordPiece", "unk_token": unk, "continuing_subword_prefix": "##",
            "max_input_chars_per_word": 100, "vocab": pieces},
    })
}
