//! Tiny random-weight Qwen3.5 models written as Hugging Face checkpoints: the model
//! `write_tiny_qwen35_gguf` writes (the same drawn values), laid out as the released
//! Qwen3.5 / Qwen3.6 checkpoints are (`Qwen3_5ForConditionalGeneration`, model type `qwen3_5`,
//! or `Qwen3_5MoeForConditionalGeneration`, `qwen3_5_moe`): a `config.json` whose text
//! model's fields sit in `text_config`, beside a `vision_config`, and one `model.safetensors`
//! (f32) with the text weights under `model.language_model.` (the head as `lm_head`) and a
//! one-block vision tower under `model.visual.`, which a text-only loader must skip.
//!
//! The GGUF conventions are undone: every RMS norm weight but the DeltaNet output norm
//! (`linear_attn.norm`, a plain weight) is stored less one, as Qwen's norms apply `1 + w`;
//! `A_log` is `ln(-ssm_a)`; the convolution taps are `[channels, 1, kernel]`; and the value
//! heads of the DeltaNet layers are grouped by key head (value head `j` reads key head
//! `j / (value_heads / key_heads)`) where the `qwen35` GGUF tiles them (`j % key_heads`), so
//! every axis indexed by value head is reordered: the value rows of `in_proj_qkv` and the
//! convolution's value channels, `in_proj_z`, `in_proj_b`, `in_proj_a`, `dt_bias`, `A_log`
//! and the columns of `out_proj`. The experts are packed as the released mixtures hold them
//! and transformers loads them: per layer `mlp.experts.gate_up_proj` `[experts, 2 * width,
//! hidden]` (each expert's gate rows, then its up rows) and `mlp.experts.down_proj`
//! `[experts, hidden, width]`. transformers' Qwen3.5 mixture always renormalizes the chosen
//! experts' weights (its config has no `norm_topk_prob`).

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};

use super::qwen35::{draw, grouped_from_tiled, pick, Named};
use super::{SplitMix, TinyQwen35};
use crate::{Error, Result};

/// Prefix of the text model's weights in a Qwen3.5 checkpoint.
pub(super) const TEXT: &str = "model.language_model";

/// Width of the tiny vision tower's residual.
const VISION_WIDTH: usize = 16;

/// Writes `spec` as a Qwen3.5 HF checkpoint in `dir` (`config.json`, `model.safetensors` in
/// f32): `Qwen3_5ForConditionalGeneration` without experts, the MoE one with. The text model
/// is the function the `qwen35` / `qwen35moe` GGUF of the same spec computes.
pub fn write_tiny_qwen35_hf(dir: &Path, spec: &TinyQwen35) -> Result<()> {
    spec.check()?;
    let bad = |why: &str| Err(Error::Metadata(format!("tiny qwen35 hf: {why}")));
    if spec.family.is_next() {
        return bad("Qwen3-Next is not a Qwen3.5 checkpoint");
    }
    if spec.rope_sections[3] != 0 {
        return bad("transformers' Qwen3.5 has three rope sections");
    }
    let factor = spec.rotary_dim as f64 / spec.head_dim as f64;
    // transformers turns `int(head_dim * partial_rotary_factor)` dimensions.
    if (spec.head_dim as f64 * factor) as usize != spec.rotary_dim {
        return bad("rotary_dim / head_dim does not round-trip through transformers");
    }
    std::fs::create_dir_all(dir).map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
    let mut tensors: HashMap<String, Tensor> =
        text_tensors(spec, draw(spec)?)?.into_iter().collect();
    tensors.extend(vision_tensors(spec)?);
    candle_core::safetensors::save(&tensors, dir.join("model.safetensors"))?;
    std::fs::write(dir.join("config.json"), hf_config(spec, factor).to_string())
        .map_err(|e| Error::io("write config.json", e))
}

/// `values` less one: a Qwen norm weight as checkpoints store it (`1 + w` is applied).
fn less_one(values: Tensor) -> Result<Tensor> {
    Ok(values.affine(1.0, -1.0)?)
}

/// The text model's tensors under their HF names, from `drawn` (GGUF names and layout).
pub(super) fn text_tensors(spec: &TinyQwen35, drawn: Vec<Named>) -> Result<Vec<(String, Tensor)>> {
    let qk = 2 * spec.linear_key_heads * spec.linear_key_head_dim;
    // Grouped from tiled: value rows (or columns) and single per-head entries.
    let heads = grouped_from_tiled(spec, spec.linear_value_head_dim);
    let per_head = grouped_from_tiled(spec, 1);
    let channels: Vec<u32> = (0..qk as u32)
        .chain(heads.iter().map(|&x| x + qk as u32))
        .collect();
    let mut out = Vec::with_capacity(drawn.len());
    let mut gates: Option<Tensor> = None;
    for Named { name, values, .. } in drawn {
        let (hf, values) = match name.as_str() {
            "token_embd.weight" => (format!("{TEXT}.embed_tokens.weight"), values),
            "output_norm.weight" => (format!("{TEXT}.norm.weight"), less_one(values)?),
            "output.weight" => ("lm_head.weight".to_string(), values),
            _ => {
                let Some((layer, role)) = name.strip_prefix("blk.").and_then(|r| r.split_once('.'))
                else {
                    return Err(Error::Metadata(format!(
                        "tiny qwen35 hf: no HF name for {name}"
                    )));
                };
                let (role, values) = match role {
                    "attn_norm.weight" => ("input_layernorm.weight", less_one(values)?),
                    "post_attention_norm.weight" => {
                        ("post_attention_layernorm.weight", less_one(values)?)
                    }
                    // Each head's query rows, then its gate rows, in GGUF and HF alike.
                    "attn_q.weight" => ("self_attn.q_proj.weight", values),
                    "attn_k.weight" => ("self_attn.k_proj.weight", values),
                    "attn_v.weight" => ("self_attn.v_proj.weight", values),
                    "attn_output.weight" => ("self_attn.o_proj.weight", values),
                    "attn_q_norm.weight" => ("self_attn.q_norm.weight", less_one(values)?),
                    "attn_k_norm.weight" => ("self_attn.k_norm.weight", less_one(values)?),
                    "attn_qkv.weight" => (
                        "linear_attn.in_proj_qkv.weight",
                        pick(&values, channels.clone(), 0)?,
                    ),
                    "attn_gate.weight" => (
                        "linear_attn.in_proj_z.weight",
                        pick(&values, heads.clone(), 0)?,
                    ),
                    "ssm_conv1d.weight" => (
                        "linear_attn.conv1d.weight",
                        pick(&values, channels.clone(), 0)?.unsqueeze(1)?,
                    ),
                    "ssm_dt.bias" => ("linear_attn.dt_bias", pick(&values, per_head.clone(), 0)?),
                    "ssm_a" => (
                        "linear_attn.A_log",
                        pick(&values, per_head.clone(), 0)?.neg()?.log()?,
                    ),
                    "ssm_beta.weight" => (
                        "linear_attn.in_proj_b.weight",
                        pick(&values, per_head.clone(), 0)?,
                    ),
                    "ssm_alpha.weight" => (
                        "linear_attn.in_proj_a.weight",
                        pick(&values, per_head.clone(), 0)?,
                    ),
                    "ssm_norm.weight" => ("linear_attn.norm.weight", values),
                    "ssm_out.weight" => (
                        "linear_attn.out_proj.weight",
                        pick(&values, heads.clone(), 1)?,
                    ),
                    "ffn_gate.weight" => ("mlp.gate_proj.weight", values),
                    "ffn_up.weight" => ("mlp.up_proj.weight", values),
                    "ffn_down.weight" => ("mlp.down_proj.weight", values),
                    "ffn_gate_inp.weight" => ("mlp.gate.weight", values),
                    "ffn_gate_exps.weight" => {
                        gates = Some(values);
                        continue;
                    }
                    "ffn_up_exps.weight" => {
                        let Some(gate) = gates.take() else {
                            return Err(Error::Metadata(format!(
                                "tiny qwen35 hf: {name} before the experts' gates"
                            )));
                        };
                        ("mlp.experts.gate_up_proj", Tensor::cat(&[gate, values], 1)?)
                    }
                    "ffn_down_exps.weight" => ("mlp.experts.down_proj", values),
                    "ffn_gate_inp_shexp.weight" => {
                        ("mlp.shared_expert_gate.weight", values.unsqueeze(0)?)
                    }
                    "ffn_gate_shexp.weight" => ("mlp.shared_expert.gate_proj.weight", values),
                    "ffn_up_shexp.weight" => ("mlp.shared_expert.up_proj.weight", values),
                    "ffn_down_shexp.weight" => ("mlp.shared_expert.down_proj.weight", values),
                    _ => {
                        return Err(Error::Metadata(format!(
                            "tiny qwen35 hf: no HF name for {name}"
                        )))
                    }
                };
                (format!("{TEXT}.layers.{layer}.{role}"), values)
            }
        };
        out.push((hf, values));
    }
    Ok(out)
}

/// A one-block vision tower (`vision_config` of [`hf_config`]), drawn from its own stream so
/// the text weights stay those of the GGUF.
fn vision_tensors(spec: &TinyQwen35) -> Result<Vec<(String, Tensor)>> {
    let (w, f, merged) = (VISION_WIDTH, 2 * VISION_WIDTH, 4 * VISION_WIDTH);
    let shapes: [(&str, &[usize]); 21] = [
        ("patch_embed.proj.weight", &[w, 3, 2, 2, 2]),
        ("patch_embed.proj.bias", &[w]),
        ("pos_embed.weight", &[16, w]),
        ("blocks.0.norm1.weight", &[w]),
        ("blocks.0.norm1.bias", &[w]),
        ("blocks.0.norm2.weight", &[w]),
        ("blocks.0.norm2.bias", &[w]),
        ("blocks.0.attn.qkv.weight", &[3 * w, w]),
        ("blocks.0.attn.qkv.bias", &[3 * w]),
        ("blocks.0.attn.proj.weight", &[w, w]),
        ("blocks.0.attn.proj.bias", &[w]),
        ("blocks.0.mlp.linear_fc1.weight", &[f, w]),
        ("blocks.0.mlp.linear_fc1.bias", &[f]),
        ("blocks.0.mlp.linear_fc2.weight", &[w, f]),
        ("blocks.0.mlp.linear_fc2.bias", &[w]),
        ("merger.norm.weight", &[w]),
        ("merger.norm.bias", &[w]),
        ("merger.linear_fc1.weight", &[merged, merged]),
        ("merger.linear_fc1.bias", &[merged]),
        ("merger.linear_fc2.weight", &[spec.hidden_size, merged]),
        ("merger.linear_fc2.bias", &[spec.hidden_size]),
    ];
    let mut rng = SplitMix(spec.seed ^ 0x5649_5349_4f4e);
    let mut out = Vec::with_capacity(shapes.len());
    for (name, shape) in shapes {
        let n: usize = shape.iter().product();
        let data: Vec<f32> = (0..n).map(|_| 0.1 * rng.next_centered()).collect();
        let values = Tensor::from_vec(data, shape, &Device::Cpu)?;
        out.push((format!("model.visual.{name}"), values));
    }
    Ok(out)
}

/// `x` as the f64 its shortest decimal form reads as (`1e-6`, not `9.99999997e-7`).
pub(super) fn shortest(x: f32) -> f64 {
    x.to_string().parse().unwrap_or(f64::from(x))
}

/// `config.json` of a released Qwen3.5 / Qwen3.6 checkpoint, shrunk to `spec`.
fn hf_config(spec: &TinyQwen35, partial_rotary_factor: f64) -> serde_json::Value {
    let moe = spec.experts.is_some();
    let (architecture, model_type) = match moe {
        false => ("Qwen3_5ForConditionalGeneration", "qwen3_5"),
        true => ("Qwen3_5MoeForConditionalGeneration", "qwen3_5_moe"),
    };
    let layer_types: Vec<&str> = (0..spec.num_layers)
        .map(|i| match spec.attends(i) {
            true => "full_attention",
            false => "linear_attention",
        })
        .collect();
    let mut text = serde_json::json!({
        "model_type": format!("{model_type}_text"),
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "num_hidden_layers": spec.num_layers,
        "layer_types": layer_types,
        "full_attention_interval": spec.full_attention_interval,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "attn_output_gate": true,
        "attention_bias": false,
        "attention_dropout": 0.0,
        "linear_conv_kernel_dim": spec.conv_kernel,
        "linear_key_head_dim": spec.linear_key_head_dim,
        "linear_value_head_dim": spec.linear_value_head_dim,
        "linear_num_key_heads": spec.linear_key_heads,
        "linear_num_value_heads": spec.linear_value_heads,
        "hidden_act": "silu",
        "rms_norm_eps": shortest(spec.rms_eps),
        "max_position_embeddings": 1024,
        "initializer_range": 0.02,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": shortest(spec.rope_theta),
            "partial_rotary_factor": partial_rotary_factor,
            "mrope_section": &spec.rope_sections[..3],
            "mrope_interleaved": true,
        },
        "tie_word_embeddings": false,
        "use_cache": true,
        "dtype": "float32",
    });
    if let (Some(experts), Some(text)) = (&spec.experts, text.as_object_mut()) {
        let shared = experts.shared_width.unwrap_or(spec.intermediate_size);
        for (k, v) in [
            ("num_experts", experts.count),
            ("num_experts_per_tok", experts.used),
            ("moe_intermediate_size", experts.width),
            ("shared_expert_intermediate_size", shared),
        ] {
            text.insert(k.into(), v.into());
        }
        text.insert("router_aux_loss_coef".into(), 0.001.into());
        text.insert("output_router_logits".into(), false.into());
    } else if let Some(text) = text.as_object_mut() {
        text.insert("intermediate_size".into(), spec.intermediate_size.into());
    }
    serde_json::json!({
        "architectures": [architecture],
        "model_type": model_type,
        "text_config": text,
        "vision_config": {
            "model_type": format!("{model_type}_vision"),
            "depth": 1,
            "hidden_size": VISION_WIDTH,
            "intermediate_size": 2 * VISION_WIDTH,
            "num_heads": 2,
            "in_channels": 3,
            "patch_size": 2,
            "temporal_patch_size": 2,
            "spatial_merge_size": 2,
            "out_hidden_size": spec.hidden_size,
            "num_position_embeddings": 16,
            "hidden_act": "gelu_pytorch_tanh",
            "initializer_range": 0.02,
        },
        "image_token_id": spec.vocab_size + 3,
        "video_token_id": spec.vocab_size + 4,
        "vision_start_token_id": spec.vocab_size + 1,
        "vision_end_token_id": spec.vocab_size + 2,
        "tie_word_embeddings": false,
        "dtype": "float32",
    })
}
