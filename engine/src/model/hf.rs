//! Loading a Hugging Face llama / qwen2 directory: `config.json`, one or more
//! `*.safetensors` (memory-mapped), `tokenizer.json` and optional `tokenizer_config.json`.
//! Tensor names follow transformers (`model.layers.N.self_attn.q_proj.weight`, ...); RoPE
//! pairs halves.

use std::path::{Path, PathBuf};

use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};
use serde::Deserialize;

use crate::model::config::{Architecture, ModelConfig, RopeStyle};
use crate::model::linear::Linear;
use crate::model::{LayerWeights, ModelWeights};
use crate::{Error, Result};

#[derive(Debug, Deserialize)]
struct HfConfig {
    #[serde(default)]
    architectures: Vec<String>,
    #[serde(default)]
    model_type: Option<String>,
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    #[serde(default = "default_rope_theta")]
    rope_theta: f64,
    #[serde(default = "default_rms_eps")]
    rms_norm_eps: f64,
    #[serde(default = "default_max_positions")]
    max_position_embeddings: usize,
    #[serde(default)]
    tie_word_embeddings: bool,
    #[serde(default)]
    attention_bias: Option<bool>,
    #[serde(default)]
    eos_token_id: Option<serde_json::Value>,
}

fn default_rope_theta() -> f64 {
    10_000.0
}
fn default_rms_eps() -> f64 {
    1e-6
}
fn default_max_positions() -> usize {
    4096
}

/// What an HF directory yields besides the tokenizer.
pub struct HfModel {
    /// Hyper-parameters.
    pub config: ModelConfig,
    /// Weights.
    pub weights: ModelWeights,
    /// `eos_token_id` from config.json.
    pub eos_ids: Vec<u32>,
}

/// Loads config and weights. `dtype = None` quantizes projections to Q8_0.
pub fn load_hf_dir(dir: &Path, dtype: Option<DType>, device: &Device) -> Result<HfModel> {
    let config_path = dir.join("config.json");
    let text = std::fs::read_to_string(&config_path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::MissingFile(config_path.clone()),
        _ => Error::io(format!("read {}", config_path.display()), e),
    })?;
    let hf: HfConfig = serde_json::from_str(&text)
        .map_err(|e| Error::Metadata(format!("{}: {e}", config_path.display())))?;
    let arch_name = hf
        .architectures
        .first()
        .cloned()
        .or(hf.model_type.clone())
        .ok_or_else(|| Error::Metadata("config.json names no architecture".into()))?;
    let architecture = Architecture::parse(&arch_name)?;
    let config = ModelConfig {
        architecture,
        vocab_size: hf.vocab_size,
        hidden_size: hf.hidden_size,
        intermediate_size: hf.intermediate_size,
        num_layers: hf.num_hidden_layers,
        num_heads: hf.num_attention_heads,
        num_kv_heads: hf.num_key_value_heads.unwrap_or(hf.num_attention_heads),
        head_dim: hf
            .head_dim
            .unwrap_or(hf.hidden_size / hf.num_attention_heads.max(1)),
        rope_theta: hf.rope_theta as f32,
        rope_style: RopeStyle::Halves,
        rms_norm_eps: hf.rms_norm_eps,
        max_position_embeddings: hf.max_position_embeddings,
        attention_bias: hf
            .attention_bias
            .unwrap_or(architecture == Architecture::Qwen2),
    };
    config.validate()?;

    let files = safetensor_files(dir)?;
    // SAFETY: the files are mapped read-only and not modified while the model is loaded.
    let st = unsafe { MmapedSafetensors::multi(&files)? };
    let load = |name: &str| -> Result<Tensor> {
        st.load(name, device)
            .map_err(|e| Error::Metadata(format!("tensor {name}: {e}")))
    };
    let f32_of = |name: &str| -> Result<Tensor> { Ok(load(name)?.to_dtype(DType::F32)?) };
    let proj = |prefix: &str, biased: bool| -> Result<Linear> {
        let bias = if biased {
            Some(f32_of(&format!("{prefix}.bias"))?)
        } else {
            None
        };
        Linear::from_dense(load(&format!("{prefix}.weight"))?, bias, dtype)
    };

    let embedding = f32_of("model.embed_tokens.weight")?;
    let lm_head = if !hf.tie_word_embeddings && st.get("lm_head.weight").is_ok() {
        proj("lm_head", false)?
    } else {
        Linear::from_dense(embedding.clone(), None, dtype)?
    };
    let mut layers = Vec::with_capacity(config.num_layers);
    for i in 0..config.num_layers {
        let p = format!("model.layers.{i}");
        let bias = config.attention_bias;
        layers.push(LayerWeights {
            attn_norm: f32_of(&format!("{p}.input_layernorm.weight"))?,
            q: proj(&format!("{p}.self_attn.q_proj"), bias)?,
            k: proj(&format!("{p}.self_attn.k_proj"), bias)?,
            v: proj(&format!("{p}.self_attn.v_proj"), bias)?,
            o: proj(&format!("{p}.self_attn.o_proj"), false)?,
            mlp_norm: f32_of(&format!("{p}.post_attention_layernorm.weight"))?,
            gate: proj(&format!("{p}.mlp.gate_proj"), false)?,
            up: proj(&format!("{p}.mlp.up_proj"), false)?,
            down: proj(&format!("{p}.mlp.down_proj"), false)?,
        });
    }
    let weights = ModelWeights {
        embedding,
        layers,
        final_norm: f32_of("model.norm.weight")?,
        lm_head,
    };
    let eos_ids = match hf.eos_token_id {
        Some(serde_json::Value::Number(n)) => n.as_u64().map(|x| x as u32).into_iter().collect(),
        Some(serde_json::Value::Array(xs)) => xs
            .iter()
            .filter_map(|x| x.as_u64())
            .map(|x| x as u32)
            .collect(),
        _ => Vec::new(),
    };
    Ok(HfModel {
        config,
        weights,
        eos_ids,
    })
}

fn safetensor_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| Error::io(format!("read {}", dir.display()), e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(Error::MissingFile(dir.join("*.safetensors")));
    }
    Ok(files)
}
