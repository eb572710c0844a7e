//! Tiny random-weight Qwen3-Next models written as Hugging Face checkpoints
//! (`Qwen3NextForCausalLM`, model type `qwen3_next`): the model `write_tiny_qwen35_gguf`
//! writes for a Qwen3-Next spec (the same drawn values), laid out as the released
//! Qwen3-Next-80B-A3B checkpoints are: one flat `config.json`, the weights under `model.`, and
//! the Gated DeltaNet inputs fused as transformers holds them: `linear_attn.in_proj_qkvz`
//! (per key head: its query rows, its key rows, its value heads' value rows, their gate
//! rows) and `linear_attn.in_proj_ba` (per key head: its value heads' `beta` rows, then
//! their `alpha` rows). Everything else is Qwen3.5's HF layout (`qwen35_hf`).

use std::collections::HashMap;
use std::path::Path;

use candle_core::Tensor;

use super::qwen35::{draw, pick};
use super::qwen35_hf::{shortest, text_tensors, TEXT};
use super::TinyQwen35;
use crate::{Error, Result};

/// Writes `spec` (a Qwen3-Next) as a Qwen3-Next HF checkpoint in `dir` (`config.json`,
/// `model.safetensors` in f32).
pub fn write_tiny_qwen3next_hf(dir: &Path, spec: &TinyQwen35) -> Result<()> {
    let Some(experts) = spec.experts.as_ref().filter(|_| spec.family.is_next()) else {
        return Err(Error::Metadata(
            "tiny qwen3next hf: a Qwen3-Next spec (with experts) is needed".into(),
        ));
    };
    std::fs::create_dir_all(dir).map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
    let (nk, dk) = (spec.linear_key_heads, spec.linear_key_head_dim);
    let (nv, dv) = (spec.linear_value_heads, spec.linear_value_head_dim);
    let r = nv / nk.max(1);
    let rows = |start: usize, n: usize| (start..start + n).map(|x| x as u32);
    // Rows of `[in_proj_qkv; in_proj_z]` in `in_proj_qkvz`'s order.
    let z_at = 2 * nk * dk + nv * dv;
    let qkvz: Vec<u32> = (0..nk)
        .flat_map(|k| {
            rows(k * dk, dk)
                .chain(rows(nk * dk + k * dk, dk))
                .chain(rows(2 * nk * dk + k * r * dv, r * dv))
                .chain(rows(z_at + k * r * dv, r * dv))
        })
        .collect();
    // Rows of `[in_proj_b; in_proj_a]` in `in_proj_ba`'s order.
    let ba: Vec<u32> = (0..nk)
        .flat_map(|k| rows(k * r, r).chain(rows(nv + k * r, r)))
        .collect();
    let mut out: HashMap<String, Tensor> = HashMap::new();
    let mut held: HashMap<String, Tensor> = HashMap::new();
    for (name, values) in text_tensors(spec, draw(spec)?)? {
        let name = name.replacen(TEXT, "model", 1);
        match name.rsplit_once(".linear_attn.") {
            Some((
                _,
                "in_proj_qkv.weight" | "in_proj_z.weight" | "in_proj_b.weight" | "in_proj_a.weight",
            )) => {
                held.insert(name, values);
            }
            _ => {
                out.insert(name, values);
            }
        }
    }
    for i in 0..spec.num_layers {
        let a = format!("model.layers.{i}.linear_attn");
        let mut take = |part: &str| held.remove(&format!("{a}.{part}.weight"));
        let (qkv, z, b, alpha) = (
            take("in_proj_qkv"),
            take("in_proj_z"),
            take("in_proj_b"),
            take("in_proj_a"),
        );
        let (Some(qkv), Some(z), Some(b), Some(alpha)) = (qkv, z, b, alpha) else {
            continue;
        };
        let both = Tensor::cat(&[qkv, z], 0)?;
        out.insert(
            format!("{a}.in_proj_qkvz.weight"),
            pick(&both, qkvz.clone(), 0)?,
        );
        let both = Tensor::cat(&[b, alpha], 0)?;
        out.insert(
            format!("{a}.in_proj_ba.weight"),
            pick(&both, ba.clone(), 0)?,
        );
    }
    if let Some(left) = held.keys().next() {
        return Err(Error::Metadata(format!(
            "tiny qwen3next hf: {left} left over"
        )));
    }
    candle_core::safetensors::save(&out, dir.join("model.safetensors"))?;
    let layer_types: Vec<&str> = (0..spec.num_layers)
        .map(|i| match spec.attends(i) {
            true => "full_attention",
            false => "linear_attention",
        })
        .collect();
    let config = serde_json::json!({
        "architectures": ["Qwen3NextForCausalLM"],
        "model_type": "qwen3_next",
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers,
        "layer_types": layer_types,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "linear_conv_kernel_dim": spec.conv_kernel,
        "linear_key_head_dim": dk,
        "linear_value_head_dim": dv,
        "linear_num_key_heads": nk,
        "linear_num_value_heads": nv,
        "num_experts": experts.count,
        "num_experts_per_tok": experts.used,
        "moe_intermediate_size": experts.width,
        "shared_expert_intermediate_size": experts.shared_width.unwrap_or(spec.intermediate_size),
        "norm_topk_prob": experts.normalize,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "hidden_act": "silu",
        "rms_norm_eps": shortest(spec.rms_eps),
        "max_position_embeddings": 1024,
        "initializer_range": 0.02,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": shortest(spec.rope_theta),
            "partial_rotary_factor": spec.rotary_dim as f64 / spec.head_dim as f64,
        },
        "attention_bias": false,
        "attention_dropout": 0.0,
        "router_aux_loss_coef": 0.001,
        "output_router_logits": false,
        "tie_word_embeddings": false,
        "use_cache": true,
        "dtype": "float32",
    });
    std::fs::write(dir.join("config.json"), config.to_string())
        .map_err(|e| Error::io("write config.json", e))
}
