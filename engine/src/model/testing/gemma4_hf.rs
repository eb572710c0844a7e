//! The tiny Gemma 4 written as a Hugging Face checkpoint: the model `write_tiny_gemma4_gguf`
//! writes (the same drawn values), laid out as transformers' `Gemma4ForCausalLM` saves it:
//! `model.layers.N.self_attn.*`, the norms around the MLP as `pre_feedforward_layernorm` and
//! `post_feedforward_layernorm` (with `_1` and `_2` beside a mixture), the per-layer inputs
//! as `per_layer_input_gate`, `per_layer_projection` and `post_per_layer_input_norm`, the
//! output scale as the `layer_scalar` buffer, the mixture as `router.proj`, `router.scale`,
//! `router.per_expert_scale`, `experts.gate_up_proj` and `experts.down_proj`. The global
//! layers' heads go in `per_layer_config`, or, where their values are their keys' projection,
//! in the flat `global_head_dim` and `num_global_key_value_heads` of the released configs.

use std::collections::HashMap;
use std::path::Path;

use candle_core::Tensor;

use super::gemma4::{draw, TinyGemma4};
use crate::{Error, Result};

/// Writes `spec` as a Gemma 4 HF checkpoint in `dir` (`config.json`, one `model.safetensors`
/// in f32).
pub fn write_tiny_gemma4_hf(dir: &Path, spec: &TinyGemma4) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
    let config = hf_config(spec)?;
    let mut out: HashMap<String, Tensor> = HashMap::new();
    for t in draw(spec)? {
        out.insert(hf_name(&t.name)?, t.values);
    }
    candle_core::safetensors::save(&out, dir.join("model.safetensors"))?;
    std::fs::write(dir.join("config.json"), config.to_string())
        .map_err(|e| Error::io("write config.json", e))
}

fn hf_name(gguf: &str) -> Result<String> {
    let unmapped = || Error::Metadata(format!("tiny gemma4 hf: unmapped tensor {gguf}"));
    let top = match gguf {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        "per_layer_token_embd.weight" => Some("model.embed_tokens_per_layer.weight"),
        "per_layer_model_proj.weight" => Some("model.per_layer_model_projection.weight"),
        "per_layer_proj_norm.weight" => Some("model.per_layer_projection_norm.weight"),
        _ => None,
    };
    if let Some(name) = top {
        return Ok(name.to_string());
    }
    let (i, part) = gguf
        .strip_prefix("blk.")
        .and_then(|rest| rest.split_once('.'))
        .ok_or_else(unmapped)?;
    let part = match part {
        "attn_norm.weight" => "input_layernorm.weight",
        "attn_q.weight" => "self_attn.q_proj.weight",
        "attn_q_norm.weight" => "self_attn.q_norm.weight",
        "attn_k.weight" => "self_attn.k_proj.weight",
        "attn_k_norm.weight" => "self_attn.k_norm.weight",
        "attn_v.weight" => "self_attn.v_proj.weight",
        "attn_output.weight" => "self_attn.o_proj.weight",
        "post_attention_norm.weight" => "post_attention_layernorm.weight",
        "ffn_norm.weight" => "pre_feedforward_layernorm.weight",
        "ffn_gate.weight" => "mlp.gate_proj.weight",
        "ffn_up.weight" => "mlp.up_proj.weight",
        "ffn_down.weight" => "mlp.down_proj.weight",
        "post_ffw_norm.weight" => "post_feedforward_layernorm.weight",
        "ffn_gate_inp.weight" => "router.proj.weight",
        "ffn_gate_inp.scale" => "router.scale",
        "ffn_gate_up_exps.weight" => "experts.gate_up_proj",
        "ffn_down_exps.weight" => "experts.down_proj",
        "ffn_down_exps.scale" => "router.per_expert_scale",
        "pre_ffw_norm_2.weight" => "pre_feedforward_layernorm_2.weight",
        "post_ffw_norm_1.weight" => "post_feedforward_layernorm_1.weight",
        "post_ffw_norm_2.weight" => "post_feedforward_layernorm_2.weight",
        "inp_gate.weight" => "per_layer_input_gate.weight",
        "proj.weight" => "per_layer_projection.weight",
        "post_norm.weight" => "post_per_layer_input_norm.weight",
        "layer_output_scale.weight" => "layer_scalar",
        _ => return Err(unmapped()),
    };
    Ok(format!("model.layers.{i}.{part}"))
}

/// `config.json` of a text-only Gemma 4 checkpoint, shrunk to `spec`.
fn hf_config(spec: &TinyGemma4) -> Result<serde_json::Value> {
    let n = spec.num_layers();
    let global: Vec<usize> = (0..n).filter(|&i| !spec.windowed[i]).collect();
    let keeping: Vec<usize> = global
        .iter()
        .copied()
        .filter(|&i| !spec.shares(i))
        .collect();
    let keys_as_values = !spec.keys_as_values.is_empty();
    if keys_as_values && spec.keys_as_values != keeping {
        return Err(Error::Metadata(format!(
            "tiny gemma4 hf: keys as values on layers {:?}, but a checkpoint has them on every \
             global layer that keeps its own ({keeping:?}) or none",
            spec.keys_as_values
        )));
    }
    let layer_types: Vec<&str> = spec
        .windowed
        .iter()
        .map(|&w| match w {
            true => "sliding_attention",
            false => "full_attention",
        })
        .collect();
    let (global_kv, global_dim) = spec.global_heads;
    let mut config = serde_json::json!({
        "architectures": ["Gemma4ForCausalLM"],
        "model_type": "gemma4_text",
        "vocab_size": spec.vocab_size,
        "vocab_size_per_layer_input": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "hidden_size_per_layer_input": spec.per_layer_width,
        "intermediate_size": spec.intermediate_size,
        "use_double_wide_mlp": spec.shared_kv_layers > 0,
        "num_hidden_layers": n,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.local_heads.0,
        "head_dim": spec.local_heads.1,
        "layer_types": layer_types,
        "sliding_window": spec.window,
        "num_kv_shared_layers": spec.shared_kv_layers,
        "rope_parameters": {
            "full_attention": {
                "rope_type": "proportional",
                "partial_rotary_factor": (2 * spec.turning_pairs) as f64 / global_dim as f64,
                "rope_theta": 1_000_000.0,
            },
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        },
        "final_logit_softcapping": f64::from(spec.final_softcap),
        "hidden_activation": "gelu_pytorch_tanh",
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 1024,
        "tie_word_embeddings": false,
        "attention_bias": false,
        "attention_k_eq_v": keys_as_values,
        "enable_moe_block": spec.experts.is_some(),
        "eos_token_id": 1,
        "bos_token_id": 2,
        "pad_token_id": 0,
        "dtype": "float32",
    });
    if keys_as_values {
        // As the released configs: the global heads flat, their count read with keys as values.
        config["global_head_dim"] = global_dim.into();
        config["num_global_key_value_heads"] = global_kv.into();
    } else {
        // As transformers saves them: each global layer's departures, by zero-padded index.
        let listed: serde_json::Map<String, serde_json::Value> = global
            .iter()
            .map(|i| {
                (
                    format!("{i:02}"),
                    serde_json::json!({"head_dim": global_dim, "num_key_value_heads": global_kv}),
                )
            })
            .collect();
        config["per_layer_config"] = listed.into();
    }
    if let Some((experts, used, width)) = spec.experts {
        config["num_experts"] = experts.into();
        config["top_k_experts"] = used.into();
        config["moe_intermediate_size"] = width.into();
    }
    Ok(config)
}
