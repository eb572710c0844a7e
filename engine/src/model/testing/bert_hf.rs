//! A tiny random BERT written as a Hugging Face folder: `config.json`
//! (`BertForSequenceClassification` with one label, a cross-encoder, or `BertModel`),
//! `model.safetensors` under transformers' names (the `bert.` prefix, BERT's pooler and the
//! classifier for a cross-encoder), and a WordPiece `tokenizer.json` as BERT's tokenizers are
//! saved (lower-casing normalizer, BERT pre-tokenizer, `[CLS] A [SEP] B [SEP]` with the
//! segments as token types), over a vocabulary of a few dozen words and `##` pieces.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};

use super::SplitMix;
use crate::{Error, Result};

/// The words of the tiny vocabulary after BERT's five special tokens.
const WORDS: &[&str] = &[
    "the", "a", "cat", "dog", "sat", "on", "mat", "is", "what", "where", "##s", "##ing", "run",
    "play", "garden", "house", "blue", "red", "?", ".", ",", "un", "##able", "##ness", "happy",
    "kind", "of", "in", "to", "and", "who", "sleep", "##ed", "big", "small",
];

/// Draws a named tensor of a shape: `offset + scale * uniform(-1, 1)`.
type Put<'a> = dyn FnMut(String, &[usize], f32, f32) -> Result<()> + 'a;

/// The tiny BERT's geometry.
#[derive(Debug, Clone, Copy)]
pub struct TinyBert {
    /// Width of a token's state.
    pub hidden: usize,
    /// Layers.
    pub layers: usize,
    /// Attention heads.
    pub heads: usize,
    /// Width of the feed-forward block.
    pub intermediate: usize,
    /// Rows of the position table.
    pub positions: usize,
    /// A cross-encoder (one logit per pair) rather than a bare `BertModel`.
    pub cross_encoder: bool,
    /// Seed of the weights.
    pub seed: u64,
}

impl Default for TinyBert {
    fn default() -> Self {
        Self {
            hidden: 32,
            layers: 2,
            heads: 4,
            intermediate: 64,
            positions: 48,
            cross_encoder: true,
            seed: 11,
        }
    }
}

/// Writes `spec` as a Hugging Face folder in `dir`.
pub fn write_tiny_bert_hf(dir: &Path, spec: &TinyBert) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
    let vocab = 5 + WORDS.len();
    let (h, f) = (spec.hidden, spec.intermediate);
    let mut rng = SplitMix(spec.seed);
    let mut tensors: HashMap<String, Tensor> = HashMap::new();
    let prefix = if spec.cross_encoder { "bert." } else { "" };
    let mut put = |name: String, shape: &[usize], scale: f32, offset: f32| -> Result<()> {
        let n: usize = shape.iter().product();
        let data: Vec<f32> = (0..n)
            .map(|_| offset + scale * rng.next_centered())
            .collect();
        tensors.insert(name, Tensor::from_vec(data, shape, &Device::Cpu)?);
        Ok(())
    };
    let linear = |put: &mut Put, name: String, out: usize, inp: usize| -> Result<()> {
        put(
            format!("{name}.weight"),
            &[out, inp],
            1.0 / (inp as f32).sqrt(),
            0.0,
        )?;
        put(format!("{name}.bias"), &[out], 0.1, 0.0)
    };
    let norm = |put: &mut Put, name: String| {
        put(format!("{name}.weight"), &[h], 0.2, 1.0)?;
        put(format!("{name}.bias"), &[h], 0.1, 0.0)
    };
    let e = format!("{prefix}embeddings");
    put(format!("{e}.word_embeddings.weight"), &[vocab, h], 0.5, 0.0)?;
    put(
        format!("{e}.position_embeddings.weight"),
        &[spec.positions, h],
        0.5,
        0.0,
    )?;
    put(
        format!("{e}.token_type_embeddings.weight"),
        &[2, h],
        0.5,
        0.0,
    )?;
    norm(&mut put, format!("{e}.LayerNorm"))?;
    for i in 0..spec.layers {
        let l = format!("{prefix}encoder.layer.{i}");
        for part in ["query", "key", "value"] {
            linear(&mut put, format!("{l}.attention.self.{part}"), h, h)?;
        }
        linear(&mut put, format!("{l}.attention.output.dense"), h, h)?;
        norm(&mut put, format!("{l}.attention.output.LayerNorm"))?;
        linear(&mut put, format!("{l}.intermediate.dense"), f, h)?;
        linear(&mut put, format!("{l}.output.dense"), h, f)?;
        norm(&mut put, format!("{l}.output.LayerNorm"))?;
    }
    linear(&mut put, format!("{prefix}pooler.dense"), h, h)?;
    if spec.cross_encoder {
        linear(&mut put, "classifier".into(), 1, h)?;
    }
    candle_core::safetensors::save(&tensors, dir.join("model.safetensors"))?;

    let architecture = match spec.cross_encoder {
        true => "BertForSequenceClassification",
        false => "BertModel",
    };
    let mut config = serde_json::json!({
        "architectures": [architecture],
        "model_type": "bert",
        "hidden_size": h,
        "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.heads,
        "intermediate_size": f,
        "vocab_size": vocab,
        "max_position_embeddings": spec.positions,
        "type_vocab_size": 2,
        "layer_norm_eps": 1e-12,
        "hidden_act": "gelu",
        "position_embedding_type": "absolute",
        "pad_token_id": 0,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
    });
    if spec.cross_encoder {
        config["id2label"] = serde_json::json!({"0": "LABEL_0"});
        config["label2id"] = serde_json::json!({"LABEL_0": 0});
    }
    write(dir, "config.json", &config.to_string())?;
    write_wordpiece(dir)
}

fn write(dir: &Path, name: &str, text: &str) -> Result<()> {
    let path = dir.join(name);
    std::fs::write(&path, text).map_err(|e| Error::io(format!("write {}", path.display()), e))
}

/// BERT's tokenizer over the tiny vocabulary, as `tokenizer.json`.
fn write_wordpiece(dir: &Path) -> Result<()> {
    let specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"];
    let vocab: Vec<String> = specials
        .iter()
        .chain(WORDS)
        .map(|w| w.to_string())
        .collect();
    let marked: Vec<(usize, String)> = specials
        .iter()
        .enumerate()
        .map(|(i, s)| (i, s.to_string()))
        .collect();
    let json = crate::encoder::gguf::wordpiece_json(
        &vocab,
        &marked,
        ("[CLS]", 2),
        ("[SEP]", 3),
        "[UNK]",
        true,
    );
    write(dir, "tokenizer.json", &json.to_string())
}
