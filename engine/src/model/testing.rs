//! Tiny random-weight models written to disk as HF directories, for tests and benches that
//! must not depend on a downloaded model. Weights come from a seeded generator, so every run
//! builds the same model.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};

use crate::model::config::Architecture;
use crate::{Error, Result};

/// Shape of a tiny model.
#[derive(Debug, Clone)]
pub struct TinyModelSpec {
    /// Family (qwen2 adds q/k/v biases).
    pub architecture: Architecture,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Residual width.
    pub hidden_size: usize,
    /// MLP width.
    pub intermediate_size: usize,
    /// Blocks.
    pub num_layers: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads.
    pub num_kv_heads: usize,
    /// Tie the head to the embedding.
    pub tie_word_embeddings: bool,
    /// Seed of the weight generator.
    pub seed: u64,
}

impl Default for TinyModelSpec {
    fn default() -> Self {
        Self {
            architecture: Architecture::Llama,
            vocab_size: 256,
            hidden_size: 64,
            intermediate_size: 128,
            num_layers: 2,
            num_heads: 4,
            num_kv_heads: 2,
            tie_word_embeddings: false,
            seed: 7,
        }
    }
}

/// Writes `config.json` and `model.safetensors` for `spec` into `dir`.
pub fn write_tiny_hf_model(dir: &Path, spec: &TinyModelSpec) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
    let (h, f, v) = (spec.hidden_size, spec.intermediate_size, spec.vocab_size);
    let hd = h / spec.num_heads;
    let kvw = spec.num_kv_heads * hd;
    let mut rng = SplitMix(spec.seed);
    let mut tensors: HashMap<String, Tensor> = HashMap::new();
    let mut put = |name: String, shape: &[usize], scale: f32, offset: f32| -> Result<()> {
        let n: usize = shape.iter().product();
        let data: Vec<f32> = (0..n)
            .map(|_| offset + scale * rng.next_centered())
            .collect();
        tensors.insert(name, Tensor::from_vec(data, shape, &Device::Cpu)?);
        Ok(())
    };
    put("model.embed_tokens.weight".into(), &[v, h], 1.0, 0.0)?;
    put("model.norm.weight".into(), &[h], 0.2, 1.0)?;
    if !spec.tie_word_embeddings {
        put("lm_head.weight".into(), &[v, h], 0.3, 0.0)?;
    }
    let w = 1.0 / (h as f32).sqrt();
    for i in 0..spec.num_layers {
        let p = format!("model.layers.{i}");
        put(format!("{p}.input_layernorm.weight"), &[h], 0.2, 1.0)?;
        put(
            format!("{p}.post_attention_layernorm.weight"),
            &[h],
            0.2,
            1.0,
        )?;
        put(
            format!("{p}.self_attn.q_proj.weight"),
            &[h, h],
            2.0 * w,
            0.0,
        )?;
        put(
            format!("{p}.self_attn.k_proj.weight"),
            &[kvw, h],
            2.0 * w,
            0.0,
        )?;
        put(
            format!("{p}.self_attn.v_proj.weight"),
            &[kvw, h],
            2.0 * w,
            0.0,
        )?;
        put(format!("{p}.self_attn.o_proj.weight"), &[h, h], w, 0.0)?;
        put(format!("{p}.mlp.gate_proj.weight"), &[f, h], 2.0 * w, 0.0)?;
        put(format!("{p}.mlp.up_proj.weight"), &[f, h], 2.0 * w, 0.0)?;
        put(format!("{p}.mlp.down_proj.weight"), &[h, f], w, 0.0)?;
        if spec.architecture == Architecture::Qwen2 {
            put(format!("{p}.self_attn.q_proj.bias"), &[h], 0.5, 0.0)?;
            put(format!("{p}.self_attn.k_proj.bias"), &[kvw], 0.5, 0.0)?;
            put(format!("{p}.self_attn.v_proj.bias"), &[kvw], 0.5, 0.0)?;
        }
    }
    candle_core::safetensors::save(&tensors, dir.join("model.safetensors"))?;

    let architecture = match spec.architecture {
        Architecture::Llama => "LlamaForCausalLM",
        Architecture::Qwen2 => "Qwen2ForCausalLM",
    };
    let config = serde_json::json!({
        "architectures": [architecture],
        "model_type": spec.architecture.as_str(),
        "vocab_size": v,
        "hidden_size": h,
        "intermediate_size": f,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "max_position_embeddings": 1024,
        "sliding_window": 1024,
        "max_window_layers": spec.num_layers,
        "use_sliding_window": false,
        "tie_word_embeddings": spec.tie_word_embeddings,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "eos_token_id": 0,
    });
    std::fs::write(dir.join("config.json"), config.to_string())
        .map_err(|e| Error::io("write config.json", e))?;
    Ok(())
}

/// SplitMix64: small, seeded, good enough for test weights.
struct SplitMix(u64);

impl SplitMix {
    /// Uniform in [-1, 1).
    fn next_centered(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        ((z >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// Writes a `tokenizer.json` for a tiny model: token i is the word `<i>`, words are split on
/// whitespace, so `decode` gives `<3> <17> ...` and every id round-trips.
pub fn write_tiny_tokenizer(dir: &Path, vocab_size: usize) -> Result<()> {
    use tokenizers::models::wordlevel::WordLevel;
    use tokenizers::pre_tokenizers::whitespace::WhitespaceSplit;
    let vocab = (0..vocab_size)
        .map(|i| (format!("<{i}>"), i as u32))
        .collect::<std::collections::HashMap<_, _>>();
    let model = WordLevel::builder()
        .vocab(vocab.into_iter().collect())
        .unk_token("<0>".into())
        .build()
        .map_err(|e| Error::Tokenizer(e.to_string()))?;
    let mut tokenizer = tokenizers::Tokenizer::new(model);
    tokenizer.with_pre_tokenizer(Some(WhitespaceSplit));
    tokenizer
        .save(dir.join("tokenizer.json"), false)
        .map_err(|e| Error::Tokenizer(e.to_string()))
}
