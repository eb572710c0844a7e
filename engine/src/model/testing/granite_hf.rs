//! Tiny random-weight Granite 4.0-H models written as Hugging Face checkpoints
//! (`GraniteMoeHybridForCausalLM`, model type `granitemoehybrid`): the model
//! `write_tiny_granite_gguf` writes (the same drawn values), laid out as the released
//! checkpoints are: `layer_types` of `mamba` and `attention`, the Mamba-2 tensors under
//! `mamba.` (`in_proj` as the GGUF's `ssm_in`, `conv1d` taps `[channels, 1, kernel]` with
//! their bias, `dt_bias`, `A_log = ln(-ssm_a)`, `D`, the group norm flat, `out_proj`), the MLP
//! as `shared_mlp.input_linear` (gate rows, then up rows) and `output_linear`, and a mixture
//! as `block_sparse_moe.router.layer`, `input_linear` `[experts, 2 * width, hidden]` and
//! `output_linear`. Without RoPE only: the GGUF's queries and keys are laid out for
//! llama.cpp's rotation, which a NoPE model never applies.

use std::path::Path;

use candle_core::Tensor;

use super::granite::{draw, TinyGranite};
use crate::{Error, Result};

/// Writes `spec` as a Granite 4.0-H HF checkpoint in `dir` (`config.json`, one
/// `model.safetensors` in f32).
pub fn write_tiny_granite_hf(dir: &Path, spec: &TinyGranite) -> Result<()> {
    if spec.rope {
        return Err(Error::Metadata(
            "tiny granite hf: the checkpoint is written without RoPE only".into(),
        ));
    }
    std::fs::create_dir_all(dir).map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
    let mut out: std::collections::HashMap<String, Tensor> = Default::default();
    let mut pending: std::collections::HashMap<String, Tensor> = Default::default();
    for t in draw(spec)? {
        let name = t.name;
        let v = t.values;
        let (layer, part) = match name.strip_prefix("blk.") {
            Some(rest) => match rest.split_once('.') {
                Some((i, part)) => (Some(i.to_string()), part.to_string()),
                None => (None, name.clone()),
            },
            None => (None, name.clone()),
        };
        let Some(i) = layer else {
            let hf = match part.as_str() {
                "token_embd.weight" => "model.embed_tokens.weight",
                "output_norm.weight" => "model.norm.weight",
                "output.weight" => "lm_head.weight",
                other => return Err(Error::Metadata(format!("unmapped tensor {other}"))),
            };
            out.insert(hf.into(), v);
            continue;
        };
        let p = format!("model.layers.{i}");
        let (hf, v) = match part.as_str() {
            "attn_norm.weight" => (format!("{p}.input_layernorm.weight"), v),
            "ffn_norm.weight" => (format!("{p}.post_attention_layernorm.weight"), v),
            "attn_q.weight" => (format!("{p}.self_attn.q_proj.weight"), v),
            "attn_k.weight" => (format!("{p}.self_attn.k_proj.weight"), v),
            "attn_v.weight" => (format!("{p}.self_attn.v_proj.weight"), v),
            "attn_output.weight" => (format!("{p}.self_attn.o_proj.weight"), v),
            "ssm_in.weight" => (format!("{p}.mamba.in_proj.weight"), v),
            "ssm_conv1d.weight" => (format!("{p}.mamba.conv1d.weight"), v.unsqueeze(1)?),
            "ssm_conv1d.bias" => (format!("{p}.mamba.conv1d.bias"), v),
            "ssm_dt.bias" => (format!("{p}.mamba.dt_bias"), v),
            "ssm_a" => (format!("{p}.mamba.A_log"), v.flatten_all()?.neg()?.log()?),
            "ssm_d" => (format!("{p}.mamba.D"), v.flatten_all()?),
            "ssm_norm.weight" => (format!("{p}.mamba.norm.weight"), v.flatten_all()?),
            "ssm_out.weight" => (format!("{p}.mamba.out_proj.weight"), v),
            "ffn_gate_inp.weight" => (format!("{p}.block_sparse_moe.router.layer.weight"), v),
            "ffn_down_exps.weight" => (format!("{p}.block_sparse_moe.output_linear.weight"), v),
            "ffn_down.weight" | "ffn_down_shexp.weight" => {
                (format!("{p}.shared_mlp.output_linear.weight"), v)
            }
            // Gate and up are joined once both are drawn.
            "ffn_gate.weight"
            | "ffn_up.weight"
            | "ffn_gate_shexp.weight"
            | "ffn_up_shexp.weight"
            | "ffn_gate_exps.weight"
            | "ffn_up_exps.weight" => {
                pending.insert(format!("{p}.{part}"), v);
                continue;
            }
            other => return Err(Error::Metadata(format!("unmapped tensor {p}.{other}"))),
        };
        out.insert(hf, v);
    }
    for i in 0..spec.num_layers {
        let p = format!("model.layers.{i}");
        let mut join = |gate: &str, up: &str, to: &str, dim: usize| -> Result<()> {
            if let (Some(g), Some(u)) = (
                pending.remove(&format!("{p}.{gate}")),
                pending.remove(&format!("{p}.{up}")),
            ) {
                out.insert(format!("{p}.{to}"), Tensor::cat(&[&g, &u], dim)?);
            }
            Ok(())
        };
        join(
            "ffn_gate.weight",
            "ffn_up.weight",
            "shared_mlp.input_linear.weight",
            0,
        )?;
        join(
            "ffn_gate_shexp.weight",
            "ffn_up_shexp.weight",
            "shared_mlp.input_linear.weight",
            0,
        )?;
        join(
            "ffn_gate_exps.weight",
            "ffn_up_exps.weight",
            "block_sparse_moe.input_linear.weight",
            1,
        )?;
    }
    if let Some(left) = pending.keys().next() {
        return Err(Error::Metadata(format!("{left} has no partner")));
    }
    candle_core::safetensors::save(&out, dir.join("model.safetensors"))?;
    std::fs::write(dir.join("config.json"), hf_config(spec).to_string())
        .map_err(|e| Error::io("write config.json", e))
}

/// `x` as the f64 its shortest decimal form reads as (`1e-5`, not `9.99999974e-6`).
fn shortest(x: f32) -> f64 {
    x.to_string().parse().unwrap_or(f64::from(x))
}

/// `config.json` of a released Granite 4.0-H checkpoint, shrunk to `spec`.
fn hf_config(spec: &TinyGranite) -> serde_json::Value {
    let layer_types: Vec<&str> = (0..spec.num_layers)
        .map(|i| match spec.attention_layers.contains(&i) {
            true => "attention",
            false => "mamba",
        })
        .collect();
    let [embedding, residual, attention, logits] = spec.scales.map(shortest);
    let (experts, used, shared) = match &spec.experts {
        None => (0, 0, spec.intermediate_size),
        Some(moe) => (
            moe.count,
            moe.used,
            moe.shared_width.unwrap_or(spec.intermediate_size),
        ),
    };
    serde_json::json!({
        "architectures": ["GraniteMoeHybridForCausalLM"],
        "model_type": "granitemoehybrid",
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "shared_intermediate_size": shared,
        "num_local_experts": experts,
        "num_experts_per_tok": used,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "layer_types": layer_types,
        "mamba_n_heads": spec.ssm_heads,
        "mamba_n_groups": spec.ssm_groups,
        "mamba_d_state": spec.ssm_state,
        "mamba_d_head": spec.inner() / spec.ssm_heads,
        "mamba_d_conv": spec.conv_kernel,
        "mamba_expand": 2,
        "mamba_chunk_size": 256,
        "mamba_conv_bias": true,
        "mamba_proj_bias": false,
        "embedding_multiplier": embedding,
        "residual_multiplier": residual,
        "attention_multiplier": attention,
        "logits_scaling": logits,
        "position_embedding_type": "nope",
        "hidden_act": "silu",
        "rms_norm_eps": shortest(spec.rms_eps),
        "max_position_embeddings": 1024,
        "initializer_range": 0.02,
        "attention_bias": false,
        "attention_dropout": 0.0,
        "tie_word_embeddings": false,
        "use_cache": true,
        "eos_token_id": 0,
        "bos_token_id": 1,
        "pad_token_id": 0,
        "dtype": "float32",
    })
}
