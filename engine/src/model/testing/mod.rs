//! Tiny random-weight models written to disk as HF directories (and, converted as llama.cpp's
//! converter does, as GGUF files), for tests and benches that must not depend on a downloaded
//! model. Weights come from a seeded generator, so every run builds the same model.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};

use crate::model::config::Architecture;
use crate::{Error, Result};

mod bert_gguf;
mod bert_hf;
mod gemma4;
mod gemma4_hf;
mod gguf;
mod gptoss;
mod gptoss_hf;
mod granite;
mod granite_hf;
mod lfm2;
mod o200k;
mod qwen35;
mod qwen35_hf;
mod qwen3next_hf;
mod retype;

pub use bert_gguf::write_bert_gguf;
pub use bert_hf::{write_tiny_bert_hf, TinyBert};
pub use gemma4::{write_tiny_gemma4_gguf, TinyGemma4};
pub use gemma4_hf::write_tiny_gemma4_hf;
pub use gguf::write_tiny_gguf;
pub use gptoss::{write_tiny_gptoss_gguf, TinyGptOss};
pub use gptoss_hf::{write_tiny_gptoss_hf, GptOssHfConfig};
pub use granite::{write_tiny_granite_gguf, TinyGranite};
pub use granite_hf::write_tiny_granite_hf;
pub use lfm2::{write_tiny_lfm2_gguf, write_tiny_lfm2_hf, TinyLfm2};
pub use o200k::{o200k_harmony_metadata, O200K_HARMONY_VOCAB};
pub use qwen35::{write_tiny_qwen35_gguf, Qwen35Family, TinyQwen35};
pub use qwen35_hf::write_tiny_qwen35_hf;
pub use qwen3next_hf::write_tiny_qwen3next_hf;
pub use retype::{quantize_mxfp4, retype_gguf, Blocks};

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
    /// Width of one head (`None`: `hidden_size / num_heads`).
    pub head_dim: Option<usize>,
    /// Sliding window of the windowed layers (Gemma 3: required; Mistral: every layer).
    pub sliding_window: Option<usize>,
    /// `rope_scaling` of `config.json` (`None`: plain RoPE). The GGUF writer turns Llama
    /// 3.1's into `rope_freqs.weight`, as llama.cpp's converter does.
    pub rope_scaling: Option<serde_json::Value>,
    /// `partial_rotary_factor` of `config.json` (`None`: every dimension turns); the GGUF
    /// writer gives the rotated width as `rope.dimension_count`.
    pub partial_rotary_factor: Option<f64>,
    /// Tie the head to the embedding.
    pub tie_word_embeddings: bool,
    /// Seed of the weight generator.
    pub seed: u64,
    /// A mixture of experts in place of the MLP (Qwen3-MoE, Qwen2-MoE, Mixtral).
    pub experts: Option<TinyExperts>,
}

/// A tiny model's mixture of experts.
#[derive(Debug, Clone)]
pub struct TinyExperts {
    /// Experts per layer.
    pub count: usize,
    /// Experts per token.
    pub used: usize,
    /// Inner width of one expert.
    pub width: usize,
    /// Inner width of the shared expert (Qwen2-MoE).
    pub shared_width: Option<usize>,
    /// `norm_topk_prob` (the Qwen mixtures; Mixtral always normalizes).
    pub normalize: bool,
    /// Layers with a dense MLP instead (`mlp_only_layers`).
    pub dense_layers: Vec<usize>,
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
            head_dim: None,
            sliding_window: None,
            rope_scaling: None,
            partial_rotary_factor: None,
            tie_word_embeddings: false,
            seed: 7,
            experts: None,
        }
    }
}

/// Writes `config.json` and `model.safetensors` for `spec` into `dir`.
pub fn write_tiny_hf_model(dir: &Path, spec: &TinyModelSpec) -> Result<()> {
    if spec.architecture == Architecture::Gemma4 {
        return Err(Error::Metadata(
            "gemma4: the tiny Gemma 4 is written as GGUF (`write_tiny_gemma4_gguf`)".into(),
        ));
    }
    if spec.architecture.family().mixers != crate::model::arch::Mixers::Attention {
        return Err(Error::Metadata(format!(
            "{}: tiny hybrids are written as GGUF (`write_tiny_lfm2_gguf`)",
            spec.architecture.as_str()
        )));
    }
    std::fs::create_dir_all(dir).map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
    let (h, f, v) = (spec.hidden_size, spec.intermediate_size, spec.vocab_size);
    let hd = spec.head_dim.unwrap_or(h / spec.num_heads);
    let (qw, kvw) = (spec.num_heads * hd, spec.num_kv_heads * hd);
    let arch = spec.architecture;
    let gemma = matches!(arch, Architecture::Gemma2 | Architecture::Gemma3);
    // Gemma's checkpoints store norm weights less one.
    let norm_offset = if gemma { 0.0 } else { 1.0 };
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
    // Gemma multiplies embedding rows by sqrt(hidden): drawn smaller, they weigh in the
    // residual what llama's do, and the layers' (post-normed) outputs still move the logits.
    let embedding_scale = if gemma { 1.0 / (h as f32).sqrt() } else { 1.0 };
    put(
        "model.embed_tokens.weight".into(),
        &[v, h],
        embedding_scale,
        0.0,
    )?;
    put("model.norm.weight".into(), &[h], 0.2, norm_offset)?;
    if !spec.tie_word_embeddings {
        put("lm_head.weight".into(), &[v, h], 0.3, 0.0)?;
    }
    let w = 1.0 / (h as f32).sqrt();
    for i in 0..spec.num_layers {
        let p = format!("model.layers.{i}");
        put(
            format!("{p}.input_layernorm.weight"),
            &[h],
            0.2,
            norm_offset,
        )?;
        put(
            format!("{p}.post_attention_layernorm.weight"),
            &[h],
            0.2,
            norm_offset,
        )?;
        put(
            format!("{p}.self_attn.q_proj.weight"),
            &[qw, h],
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
        put(format!("{p}.self_attn.o_proj.weight"), &[h, qw], w, 0.0)?;
        match &spec.experts {
            Some(moe) if !moe.dense_layers.contains(&i) => {
                let (block, names) = match arch {
                    Architecture::Mixtral => ("block_sparse_moe", ["w1", "w3", "w2"]),
                    _ => ("mlp", ["gate_proj", "up_proj", "down_proj"]),
                };
                // A router drawn wide, so that each row's choices stand apart.
                put(
                    format!("{p}.{block}.gate.weight"),
                    &[moe.count, h],
                    8.0 * w,
                    0.0,
                )?;
                let ew = moe.width;
                for e in 0..moe.count {
                    let at = |k: usize| format!("{p}.{block}.experts.{e}.{}.weight", names[k]);
                    put(at(0), &[ew, h], 2.0 * w, 0.0)?;
                    put(at(1), &[ew, h], 2.0 * w, 0.0)?;
                    put(at(2), &[h, ew], 2.0 * w, 0.0)?;
                }
                if let Some(sw) = moe.shared_width {
                    let at = |name: &str| format!("{p}.mlp.shared_expert.{name}.weight");
                    put(at("gate_proj"), &[sw, h], 2.0 * w, 0.0)?;
                    put(at("up_proj"), &[sw, h], 2.0 * w, 0.0)?;
                    put(at("down_proj"), &[h, sw], w, 0.0)?;
                    put(
                        format!("{p}.mlp.shared_expert_gate.weight"),
                        &[1, h],
                        2.0 * w,
                        0.0,
                    )?;
                }
            }
            _ => {
                put(format!("{p}.mlp.gate_proj.weight"), &[f, h], 2.0 * w, 0.0)?;
                put(format!("{p}.mlp.up_proj.weight"), &[f, h], 2.0 * w, 0.0)?;
                put(format!("{p}.mlp.down_proj.weight"), &[h, f], w, 0.0)?;
            }
        }
        if arch.family().attention_bias {
            put(format!("{p}.self_attn.q_proj.bias"), &[qw], 0.5, 0.0)?;
            put(format!("{p}.self_attn.k_proj.bias"), &[kvw], 0.5, 0.0)?;
            put(format!("{p}.self_attn.v_proj.bias"), &[kvw], 0.5, 0.0)?;
        }
        if arch.family().qk_norm {
            put(
                format!("{p}.self_attn.q_norm.weight"),
                &[hd],
                0.2,
                norm_offset,
            )?;
            put(
                format!("{p}.self_attn.k_norm.weight"),
                &[hd],
                0.2,
                norm_offset,
            )?;
        }
        if arch.family().post_norms {
            for name in ["pre_feedforward_layernorm", "post_feedforward_layernorm"] {
                put(format!("{p}.{name}.weight"), &[h], 0.2, norm_offset)?;
            }
        }
    }
    if arch.family().fused_projections {
        // Phi-3 stores q/k/v and gate/up each as one matrix, parts in that order.
        for i in 0..spec.num_layers {
            let p = format!("model.layers.{i}");
            for (fused, parts) in [
                ("self_attn.qkv_proj", &["q_proj", "k_proj", "v_proj"][..]),
                ("mlp.gate_up_proj", &["gate_proj", "up_proj"][..]),
            ] {
                let prefix = fused.split('.').next().unwrap_or_default();
                let parts: Vec<Tensor> = parts
                    .iter()
                    .filter_map(|part| tensors.remove(&format!("{p}.{prefix}.{part}.weight")))
                    .collect();
                tensors.insert(format!("{p}.{fused}.weight"), Tensor::cat(&parts, 0)?);
            }
        }
    }
    candle_core::safetensors::save(&tensors, dir.join("model.safetensors"))?;

    let config = hf_config(spec, hd);
    std::fs::write(dir.join("config.json"), config.to_string())
        .map_err(|e| Error::io("write config.json", e))?;
    Ok(())
}

/// The `config.json` transformers (and candle-transformers) read for `spec`.
fn hf_config(spec: &TinyModelSpec, hd: usize) -> serde_json::Value {
    let (architecture, model_type) = match spec.architecture {
        Architecture::Llama => ("LlamaForCausalLM", "llama"),
        Architecture::Qwen2 => ("Qwen2ForCausalLM", "qwen2"),
        Architecture::Qwen3 => ("Qwen3ForCausalLM", "qwen3"),
        Architecture::Mistral => ("MistralForCausalLM", "mistral"),
        Architecture::Phi3 => ("Phi3ForCausalLM", "phi3"),
        Architecture::Gemma2 => ("Gemma2ForCausalLM", "gemma2"),
        Architecture::Gemma3 => ("Gemma3ForCausalLM", "gemma3_text"),
        Architecture::Qwen3Moe => ("Qwen3MoeForCausalLM", "qwen3_moe"),
        Architecture::Mixtral => ("MixtralForCausalLM", "mixtral"),
        Architecture::Qwen2Moe => ("Qwen2MoeForCausalLM", "qwen2_moe"),
        Architecture::Lfm2 => ("Lfm2ForCausalLM", "lfm2"),
        Architecture::Qwen35 => ("Qwen3_5ForCausalLM", "qwen3_5_text"),
        Architecture::Qwen35Moe => ("Qwen3_5MoeForCausalLM", "qwen3_5_moe_text"),
        Architecture::Qwen3Next => ("Qwen3NextForCausalLM", "qwen3_next"),
        Architecture::GraniteHybrid => ("GraniteMoeHybridForCausalLM", "granitemoehybrid"),
        Architecture::GptOss => ("GptOssForCausalLM", "gpt_oss"),
        Architecture::Gemma4 => ("Gemma4ForCausalLM", "gemma4_text"),
    };
    let mut config = serde_json::json!({
        "architectures": [architecture],
        "model_type": model_type,
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": hd,
        "max_position_embeddings": 1024,
        "sliding_window": 1024,
        "max_window_layers": spec.num_layers,
        "use_sliding_window": false,
        "attention_bias": spec.architecture.family().attention_bias,
        "tie_word_embeddings": spec.tie_word_embeddings,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "eos_token_id": 0,
    });
    let extra = match spec.architecture {
        Architecture::Mistral | Architecture::Phi3 => serde_json::json!({
            "sliding_window": spec.sliding_window,
            "use_sliding_window": null,
        }),
        Architecture::Gemma3 => serde_json::json!({
            "hidden_act": null,
            "use_sliding_window": null,
            "hidden_activation": "gelu_pytorch_tanh",
            "query_pre_attn_scalar": hd,
            "sliding_window": spec.sliding_window.unwrap_or(512),
            "sliding_window_pattern": 6,
            "rope_local_base_freq": 10000.0,
            "rope_theta": 1000000.0,
            "final_logit_softcapping": null,
            "attn_logit_softcapping": null,
        }),
        Architecture::Gemma2 => serde_json::json!({
            "hidden_act": null,
            "use_sliding_window": null,
            "hidden_activation": "gelu_pytorch_tanh",
            "query_pre_attn_scalar": hd,
            "sliding_window": spec.sliding_window.unwrap_or(4096),
            // Smaller than the released 30 and 50, so that they bend these tiny logits.
            "final_logit_softcapping": 15.0,
            "attn_logit_softcapping": 4.0,
        }),
        _ => serde_json::json!({}),
    };
    if let Some(scaling) = &spec.rope_scaling {
        config["rope_scaling"] = scaling.clone();
    }
    if let (Some(moe), Some(c)) = (&spec.experts, config.as_object_mut()) {
        let mut put = |k: &str, v: serde_json::Value| {
            c.insert(k.to_string(), v);
        };
        put("num_experts_per_tok", moe.used.into());
        if spec.architecture == Architecture::Mixtral {
            put("num_local_experts", moe.count.into());
            put("intermediate_size", moe.width.into());
        } else {
            put("num_experts", moe.count.into());
            put("moe_intermediate_size", moe.width.into());
            put("norm_topk_prob", moe.normalize.into());
            put("decoder_sparse_step", 1.into());
            put("mlp_only_layers", moe.dense_layers.clone().into());
        }
        if let Some(sw) = moe.shared_width {
            put("shared_expert_intermediate_size", sw.into());
        }
    }
    if let Some(factor) = spec.partial_rotary_factor {
        config["partial_rotary_factor"] = factor.into();
    }
    if let (Some(config), Some(extra)) = (config.as_object_mut(), extra.as_object()) {
        for (k, v) in extra {
            if v.is_null() {
                config.remove(k);
            } else {
                config.insert(k.clone(), v.clone());
            }
        }
    }
    config
}

/// SplitMix64: small, seeded, good enough for test weights.
pub(crate) struct SplitMix(pub(crate) u64);

impl SplitMix {
    /// Uniform in [-1, 1).
    pub(crate) fn next_centered(&mut self) -> f32 {
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
