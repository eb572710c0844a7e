//! Tiny random-weight models written to disk as HF directories (and, converted as llama.cpp's
//! converter does, as GGUF files), for tests and benches that must not depend on a downloaded
//! model. Weights come from a seeded generator, so every run builds the same model.

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
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
        }
    }
}

/// Writes `config.json` and `model.safetensors` for `spec` into `dir`.
pub fn write_tiny_hf_model(dir: &Path, spec: &TinyModelSpec) -> Result<()> {
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
        put(format!("{p}.mlp.gate_proj.weight"), &[f, h], 2.0 * w, 0.0)?;
        put(format!("{p}.mlp.up_proj.weight"), &[f, h], 2.0 * w, 0.0)?;
        put(format!("{p}.mlp.down_proj.weight"), &[h, f], w, 0.0)?;
        if arch == Architecture::Qwen2 {
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
        "attention_bias": spec.architecture == Architecture::Qwen2,
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

/// Writes the model `write_tiny_hf_model` writes for `spec` as a GGUF file at `path`, with
/// llama.cpp's tensor names and conventions: projections (and the embedding) in `dtype`,
/// norms in f32 with Gemma's one added, llama's query and key rows permuted for interleaved
/// RoPE pairs, hyper-parameters as `{arch}.*` keys. It carries no tokenizer
/// (`tokenizer.ggml.model = no_vocab`).
pub fn write_tiny_gguf(path: &Path, spec: &TinyModelSpec, dtype: GgmlDType) -> Result<()> {
    // The HF checkpoint first, in a directory beside the file, removed at the end.
    let hf_dir = path.with_extension("hf");
    write_tiny_hf_model(&hf_dir, spec)?;
    let hf = candle_core::safetensors::load(hf_dir.join("model.safetensors"), &Device::Cpu)?;
    let arch = spec.architecture;
    let family = arch.family();
    let hd = spec.head_dim.unwrap_or(spec.hidden_size / spec.num_heads);
    let interleaved = family.gguf_rope_style == crate::model::config::RopeStyle::Interleaved;
    let get = |name: &str| -> Result<Tensor> {
        hf.get(name)
            .cloned()
            .ok_or_else(|| Error::Metadata(format!("tiny model lacks {name}")))
    };
    let mut tensors: Vec<(String, QTensor)> = Vec::new();
    let mut add = |gguf: String, t: Tensor, dtype: GgmlDType| -> Result<()> {
        tensors.push((gguf, QTensor::quantize(&t, dtype)?));
        Ok(())
    };
    let norm = |name: &str| -> Result<Tensor> {
        let t = get(name)?;
        Ok((t + f64::from(family.hf_norm_offset))?)
    };
    add(
        "token_embd.weight".into(),
        get("model.embed_tokens.weight")?,
        dtype,
    )?;
    add(
        "output_norm.weight".into(),
        norm("model.norm.weight")?,
        GgmlDType::F32,
    )?;
    if !spec.tie_word_embeddings {
        add("output.weight".into(), get("lm_head.weight")?, dtype)?;
    }
    let (mlp_norm, post_attn) = if family.post_norms {
        (
            "pre_feedforward_layernorm",
            Some("post_attention_layernorm"),
        )
    } else {
        ("post_attention_layernorm", None)
    };
    for i in 0..spec.num_layers {
        let (p, b) = (format!("model.layers.{i}"), format!("blk.{i}"));
        let mut norms = vec![("input_layernorm", "attn_norm"), (mlp_norm, "ffn_norm")];
        if let Some(post) = post_attn {
            norms.push((post, "post_attention_norm"));
            norms.push(("post_feedforward_layernorm", "post_ffw_norm"));
        }
        if family.qk_norm {
            norms.push(("self_attn.q_norm", "attn_q_norm"));
            norms.push(("self_attn.k_norm", "attn_k_norm"));
        }
        for (from, to) in norms {
            add(
                format!("{b}.{to}.weight"),
                norm(&format!("{p}.{from}.weight"))?,
                GgmlDType::F32,
            )?;
        }
        let projections: &[(&str, &str, Option<usize>)] = if family.fused_projections {
            &[
                ("self_attn.qkv_proj", "attn_qkv", None),
                ("self_attn.o_proj", "attn_output", None),
                ("mlp.gate_up_proj", "ffn_up", None),
                ("mlp.down_proj", "ffn_down", None),
            ]
        } else {
            &[
                ("self_attn.q_proj", "attn_q", Some(spec.num_heads)),
                ("self_attn.k_proj", "attn_k", Some(spec.num_kv_heads)),
                ("self_attn.v_proj", "attn_v", None),
                ("self_attn.o_proj", "attn_output", None),
                ("mlp.gate_proj", "ffn_gate", None),
                ("mlp.up_proj", "ffn_up", None),
                ("mlp.down_proj", "ffn_down", None),
            ]
        };
        for &(from, to, heads) in projections {
            let permute = |t: Tensor| match heads {
                Some(n) if interleaved => interleave_rows(&t, n, hd),
                _ => Ok(t),
            };
            add(
                format!("{b}.{to}.weight"),
                permute(get(&format!("{p}.{from}.weight"))?)?,
                dtype,
            )?;
            if let Ok(bias) = get(&format!("{p}.{from}.bias")) {
                add(format!("{b}.{to}.bias"), permute(bias)?, GgmlDType::F32)?;
            }
        }
    }
    let config: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(hf_dir.join("config.json"))
            .map_err(|e| Error::io("read config.json", e))?,
    )
    .map_err(|e| Error::Metadata(e.to_string()))?;
    std::fs::remove_dir_all(&hf_dir)
        .map_err(|e| Error::io(format!("remove {}", hf_dir.display()), e))?;
    let name = arch.as_str();
    let u32_of = |v: usize| Value::U32(v as u32);
    let f32_at = |key: &str| config.get(key).and_then(|v| v.as_f64()).map(|v| v as f32);
    let mut metadata: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(name.into())),
        // No tokenizer: llama.cpp then gives the vocabulary's size in dummy tokens.
        (
            "tokenizer.ggml.model".into(),
            Value::String("no_vocab".into()),
        ),
        (format!("{name}.context_length"), u32_of(1024)),
        (format!("{name}.vocab_size"), u32_of(spec.vocab_size)),
        (format!("{name}.embedding_length"), u32_of(spec.hidden_size)),
        (format!("{name}.block_count"), u32_of(spec.num_layers)),
        (
            format!("{name}.feed_forward_length"),
            u32_of(spec.intermediate_size),
        ),
        (
            format!("{name}.attention.head_count"),
            u32_of(spec.num_heads),
        ),
        (
            format!("{name}.attention.head_count_kv"),
            u32_of(spec.num_kv_heads),
        ),
        (format!("{name}.attention.key_length"), u32_of(hd)),
        (format!("{name}.attention.value_length"), u32_of(hd)),
        (
            format!("{name}.rope.freq_base"),
            Value::F32(f32_at("rope_theta").unwrap_or(10_000.0)),
        ),
        (
            format!("{name}.attention.layer_norm_rms_epsilon"),
            Value::F32(1e-6),
        ),
    ];
    let windowed = config.get("use_sliding_window") != Some(&serde_json::Value::Bool(false));
    if family.windows != crate::model::arch::Windows::Never && windowed {
        if let Some(w) = config.get("sliding_window").and_then(|v| v.as_u64()) {
            metadata.push((
                format!("{name}.attention.sliding_window"),
                u32_of(w as usize),
            ));
        }
    }
    for key in ["attn_logit_softcapping", "final_logit_softcapping"] {
        if let Some(cap) = f32_at(key) {
            metadata.push((format!("{name}.{key}"), Value::F32(cap)));
        }
    }
    if let Some(factors) = llama3_rope_factors(&config, hd) {
        let n = factors.len();
        let t = Tensor::from_vec(factors, n, &Device::Cpu)?;
        tensors.push((
            "rope_freqs.weight".into(),
            QTensor::quantize(&t, GgmlDType::F32)?,
        ));
    }
    if let Some(factor) = spec.partial_rotary_factor {
        // As llama.cpp's converter writes it: the rotated width of a head.
        metadata.push((
            format!("{name}.rope.dimension_count"),
            u32_of((hd as f64 * factor) as usize),
        ));
    }
    if let Some(scaling) = config
        .get("rope_scaling")
        .filter(|s| s.get("rope_type").and_then(|t| t.as_str()) == Some("yarn"))
    {
        // As llama.cpp's converter writes YaRN: type, factor, original context, and the
        // bounds where the config gives them.
        let num = |k: &str| scaling.get(k).and_then(|v| v.as_f64());
        metadata.push((
            format!("{name}.rope.scaling.type"),
            Value::String("yarn".into()),
        ));
        if let Some(factor) = num("factor") {
            metadata.push((
                format!("{name}.rope.scaling.factor"),
                Value::F32(factor as f32),
            ));
        }
        if let Some(original) = num("original_max_position_embeddings") {
            metadata.push((
                format!("{name}.rope.scaling.original_context_length"),
                u32_of(original as usize),
            ));
        }
        for (from, to) in [
            ("beta_fast", "yarn_beta_fast"),
            ("beta_slow", "yarn_beta_slow"),
        ] {
            if let Some(v) = num(from) {
                metadata.push((format!("{name}.rope.scaling.{to}"), Value::F32(v as f32)));
            }
        }
    }
    if let Some((short, long, original)) = longrope_factors(&config) {
        // As llama.cpp's converter writes Phi-3's LongRoPE.
        let max = config
            .get("max_position_embeddings")
            .and_then(|v| v.as_f64())
            .unwrap_or(1024.0);
        let scale = max / original as f64;
        let attn_factor = if scale > 1.0 {
            (1.0 + scale.ln() / (original as f64).ln()).sqrt()
        } else {
            1.0
        };
        metadata.push((
            format!("{name}.rope.scaling.type"),
            Value::String("longrope".into()),
        ));
        metadata.push((
            format!("{name}.rope.scaling.original_context_length"),
            u32_of(original),
        ));
        metadata.push((
            format!("{name}.rope.scaling.attn_factor"),
            Value::F32(attn_factor as f32),
        ));
        for (tensor, factors) in [("rope_factors_long", long), ("rope_factors_short", short)] {
            let n = factors.len();
            let t = Tensor::from_vec(factors, n, &Device::Cpu)?;
            tensors.push((
                format!("{tensor}.weight"),
                QTensor::quantize(&t, GgmlDType::F32)?,
            ));
        }
    }
    let metadata: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensors: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut file = std::fs::File::create(path)
        .map_err(|e| Error::io(format!("create {}", path.display()), e))?;
    gguf_file::write(&mut file, &metadata, &tensors)?;
    Ok(())
}

/// Phi-3's LongRoPE factors (short, long) and original context, where `config` has them.
fn longrope_factors(config: &serde_json::Value) -> Option<(Vec<f32>, Vec<f32>, usize)> {
    let scaling = config.get("rope_scaling")?;
    let kind = scaling.get("type").or_else(|| scaling.get("rope_type"))?;
    if kind.as_str()? != "longrope" {
        return None;
    }
    let list = |k: &str| -> Option<Vec<f32>> {
        scaling
            .get(k)?
            .as_array()?
            .iter()
            .map(|v| v.as_f64().map(|f| f as f32))
            .collect()
    };
    let original = config
        .get("original_max_position_embeddings")
        .or_else(|| scaling.get("original_max_position_embeddings"))?
        .as_u64()? as usize;
    Some((list("short_factor")?, list("long_factor")?, original))
}

/// Llama 3.1's RoPE scaling as per-frequency divisors, computed as llama.cpp's converter
/// writes them into `rope_freqs.weight` (f32 arithmetic here, f64 in Python).
fn llama3_rope_factors(config: &serde_json::Value, hd: usize) -> Option<Vec<f32>> {
    let scaling = config.get("rope_scaling")?;
    if scaling.get("rope_type")?.as_str()? != "llama3" {
        return None;
    }
    let num = |k: &str| scaling.get(k).and_then(|v| v.as_f64());
    let (factor, low, high, old) = (
        num("factor")?,
        num("low_freq_factor")?,
        num("high_freq_factor")?,
        num("original_max_position_embeddings")?,
    );
    let theta = config.get("rope_theta")?.as_f64()?;
    let (low_wavelen, high_wavelen) = (old / low, old / high);
    Some(
        (0..hd)
            .step_by(2)
            .map(|i| {
                let freq = 1.0 / theta.powf(i as f64 / hd as f64);
                let wavelen = 2.0 * std::f64::consts::PI / freq;
                let divisor = if wavelen < high_wavelen {
                    1.0
                } else if wavelen > low_wavelen {
                    factor
                } else {
                    let smooth = (old / wavelen - low) / (high - low);
                    1.0 / ((1.0 - smooth) / factor + smooth)
                };
                divisor as f32
            })
            .collect(),
    )
}

/// Rows of each of `heads` heads reordered from halves (`[x_0..x_d/2, y_0..y_d/2]`) to
/// interleaved pairs (`[x_0, y_0, x_1, y_1, ...]`), as llama.cpp's converter permutes llama's
/// query and key projections (and their biases).
fn interleave_rows(t: &Tensor, heads: usize, hd: usize) -> Result<Tensor> {
    let rows = t.dim(0)?;
    let rest: Vec<usize> = t.dims()[1..].to_vec();
    let mut shape = vec![heads, 2, hd / 2];
    shape.extend(&rest);
    let mut back = vec![rows];
    back.extend(&rest);
    Ok(t.reshape(shape)?
        .transpose(1, 2)?
        .contiguous()?
        .reshape(back)?)
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
