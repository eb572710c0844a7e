//! The GGUF side of the tiny models: `write_tiny_gguf` converts the HF checkpoint
//! `write_tiny_hf_model` writes as llama.cpp's converter does (tensor names, Gemma's norms,
//! llama's permuted query and key rows, `{arch}.*` metadata, RoPE scaling as metadata or factor
//! tensors), so GGUF loading is checked against the same weights.

use std::path::Path;

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

use super::{write_tiny_hf_model, TinyModelSpec};
use crate::{Error, Result};

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
        let sparse = spec
            .experts
            .as_ref()
            .filter(|moe| !moe.dense_layers.contains(&i));
        if let Some(moe) = sparse {
            add_experts(&mut add, &get, &p, &b, arch, moe.count, dtype)?;
        }
        for &(from, to, heads) in projections {
            if sparse.is_some() && from.starts_with("mlp.") {
                continue;
            }
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
    // Mixtral's GGUF files are llama's.
    let name = match arch {
        crate::model::config::Architecture::Mixtral => "llama",
        other => other.as_str(),
    };
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
    if let Some(moe) = &spec.experts {
        metadata.push((format!("{name}.expert_count"), u32_of(moe.count)));
        metadata.push((format!("{name}.expert_used_count"), u32_of(moe.used)));
        if name == "llama" {
            // Mixtral's experts are as wide as its `feed_forward_length`.
            metadata.retain(|(k, _)| k != &format!("{name}.feed_forward_length"));
            metadata.push((format!("{name}.feed_forward_length"), u32_of(moe.width)));
        } else {
            metadata.push((
                format!("{name}.expert_feed_forward_length"),
                u32_of(moe.width),
            ));
        }
        if let Some(sw) = moe.shared_width {
            metadata.push((
                format!("{name}.expert_shared_feed_forward_length"),
                u32_of(sw),
            ));
        }
    }
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
    write_file(path, &metadata, &tensors)
}

/// Writes a GGUF file of `metadata` and `tensors` at `path`.
pub(super) fn write_file(
    path: &Path,
    metadata: &[(String, Value)],
    tensors: &[(String, QTensor)],
) -> Result<()> {
    let metadata: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensors: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut file = std::fs::File::create(path)
        .map_err(|e| Error::io(format!("create {}", path.display()), e))?;
    gguf_file::write(&mut file, &metadata, &tensors)?;
    Ok(())
}

/// Layer `p`'s (GGUF `b`'s) mixture as llama.cpp's converter writes it: the router in f32,
/// each projection's experts stacked into one `[experts, rows, cols]` tensor in `dtype`, and
/// the shared expert (its gate a row of f32).
fn add_experts(
    add: &mut dyn FnMut(String, Tensor, GgmlDType) -> Result<()>,
    get: &dyn Fn(&str) -> Result<Tensor>,
    p: &str,
    b: &str,
    arch: crate::model::config::Architecture,
    count: usize,
    dtype: GgmlDType,
) -> Result<()> {
    let (block, names) = match arch {
        crate::model::config::Architecture::Mixtral => ("block_sparse_moe", ["w1", "w3", "w2"]),
        _ => ("mlp", ["gate_proj", "up_proj", "down_proj"]),
    };
    add(
        format!("{b}.ffn_gate_inp.weight"),
        get(&format!("{p}.{block}.gate.weight"))?,
        GgmlDType::F32,
    )?;
    for (name, to) in names
        .iter()
        .zip(["ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"])
    {
        let experts = (0..count)
            .map(|e| get(&format!("{p}.{block}.experts.{e}.{name}.weight")))
            .collect::<Result<Vec<_>>>()?;
        add(
            format!("{b}.{to}.weight"),
            Tensor::stack(&experts, 0)?,
            dtype,
        )?;
    }
    if let Ok(gate) = get(&format!("{p}.mlp.shared_expert_gate.weight")) {
        add(
            format!("{b}.ffn_gate_inp_shexp.weight"),
            gate.flatten_all()?,
            GgmlDType::F32,
        )?;
        for (name, to) in [
            ("gate_proj", "ffn_gate_shexp"),
            ("up_proj", "ffn_up_shexp"),
            ("down_proj", "ffn_down_shexp"),
        ] {
            add(
                format!("{b}.{to}.weight"),
                get(&format!("{p}.mlp.shared_expert.{name}.weight"))?,
                dtype,
            )?;
        }
    }
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
