//! A tiny random gpt-oss written as a Hugging Face checkpoint (`GptOssForCausalLM`, model
//! type `gpt_oss`): the model `write_tiny_gptoss_gguf` writes (the same drawn values), laid
//! out as the released checkpoints are and transformers loads them: the sinks as
//! `self_attn.sinks`, the router as `mlp.router` with its bias, each layer's experts in two
//! tensors whose gate and up columns alternate (`mlp.experts.gate_up_proj` `[experts, hidden,
//! 2 * width]` and `down_proj` `[experts, width, hidden]`, each with its bias), or, for an
//! MXFP4 spec, as the released files hold them: `*_blocks` `[experts, rows, blocks, 16]`
//! (two values a byte, the first in the low nibble) and `*_scales` `[experts, rows, blocks]`
//! (E8M0) with the gate and up rows alternating, and a `quantization_config` naming MXFP4.
//! The queries and keys need no reordering: gpt-oss's GGUF rotates halves, as transformers.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};

use super::gptoss::{draw, TinyGptOss};
use super::retype::quantize_mxfp4;
use crate::{Error, Result};

/// How the checkpoint's config writes its YaRN.
#[derive(Debug, Clone, Copy, Default)]
pub struct GptOssHfConfig {
    /// `truncate: false` in the scaling (the released configs' rounding of the ramp's ends,
    /// off), else the key is left out (rounded, as llama.cpp rounds).
    pub untruncated: bool,
    /// transformers 5's `rope_parameters` (the base inside), else `rope_scaling` beside
    /// `rope_theta` as the released configs write them.
    pub rope_parameters: bool,
}

/// Writes `spec` as a gpt-oss HF checkpoint in `dir` (`config.json`, one `model.safetensors`,
/// f32 but for the MXFP4 experts' bytes).
pub fn write_tiny_gptoss_hf(dir: &Path, spec: &TinyGptOss, how: GptOssHfConfig) -> Result<()> {
    if spec.window_pattern.is_some() || !spec.hidden_size.is_multiple_of(32) {
        return Err(Error::Metadata(
            "tiny gpt-oss hf: the even layers windowed and whole MXFP4 blocks only".into(),
        ));
    }
    std::fs::create_dir_all(dir).map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
    let mut drawn: HashMap<String, Tensor> = draw(spec)?
        .into_iter()
        .map(|t| (t.name, t.values))
        .collect();
    let mut take = |name: &str| {
        drawn
            .remove(name)
            .ok_or_else(|| Error::Metadata(format!("tiny gpt-oss hf: no tensor {name}")))
    };
    let mut out: HashMap<String, Tensor> = HashMap::new();
    out.insert(
        "model.embed_tokens.weight".into(),
        take("token_embd.weight")?,
    );
    out.insert("model.norm.weight".into(), take("output_norm.weight")?);
    out.insert("lm_head.weight".into(), take("output.weight")?);
    for i in 0..spec.num_layers {
        let (g, p) = (format!("blk.{i}"), format!("model.layers.{i}"));
        for (gguf, hf) in [
            ("attn_norm.weight", "input_layernorm.weight"),
            (
                "post_attention_norm.weight",
                "post_attention_layernorm.weight",
            ),
            ("attn_q.weight", "self_attn.q_proj.weight"),
            ("attn_k.weight", "self_attn.k_proj.weight"),
            ("attn_v.weight", "self_attn.v_proj.weight"),
            ("attn_output.weight", "self_attn.o_proj.weight"),
            ("attn_q.bias", "self_attn.q_proj.bias"),
            ("attn_k.bias", "self_attn.k_proj.bias"),
            ("attn_v.bias", "self_attn.v_proj.bias"),
            ("attn_output.bias", "self_attn.o_proj.bias"),
            ("attn_sinks.weight", "self_attn.sinks"),
            ("ffn_gate_inp.weight", "mlp.router.weight"),
            ("ffn_gate_inp.bias", "mlp.router.bias"),
            ("ffn_down_exps.bias", "mlp.experts.down_proj_bias"),
        ] {
            out.insert(format!("{p}.{hf}"), take(&format!("{g}.{gguf}"))?);
        }
        let [gate, up, down] =
            ["gate", "up", "down"].map(|n| take(&format!("{g}.ffn_{n}_exps.weight")));
        let (gate, up, down) = (gate?, up?, down?);
        let bias = alternate(
            &take(&format!("{g}.ffn_gate_exps.bias"))?,
            &take(&format!("{g}.ffn_up_exps.bias"))?,
        )?;
        out.insert(format!("{p}.mlp.experts.gate_up_proj_bias"), bias);
        let experts = format!("{p}.mlp.experts");
        if spec.mxfp4 {
            let (blocks, scales) = mxfp4_rows(&alternate(&gate, &up)?)?;
            out.insert(format!("{experts}.gate_up_proj_blocks"), blocks);
            out.insert(format!("{experts}.gate_up_proj_scales"), scales);
            let (blocks, scales) = mxfp4_rows(&down)?;
            out.insert(format!("{experts}.down_proj_blocks"), blocks);
            out.insert(format!("{experts}.down_proj_scales"), scales);
        } else {
            // Rows become columns: `[experts, hidden, 2 * width]` and `[experts, width, hidden]`.
            let gate_up = alternate(&gate, &up)?.transpose(1, 2)?.contiguous()?;
            out.insert(format!("{experts}.gate_up_proj"), gate_up);
            out.insert(
                format!("{experts}.down_proj"),
                down.transpose(1, 2)?.contiguous()?,
            );
        }
    }
    if let Some(left) = drawn.keys().next() {
        return Err(Error::Metadata(format!(
            "tiny gpt-oss hf: unmapped tensor {left}"
        )));
    }
    candle_core::safetensors::save(&out, dir.join("model.safetensors"))?;
    std::fs::write(dir.join("config.json"), config(spec, how).to_string())
        .map_err(|e| Error::io("write config.json", e))
}

/// `a` and `b` (`[experts, rows, ...]` or `[experts, rows]`) with their rows alternating:
/// `a`'s row `j` at `2j`, `b`'s at `2j + 1`.
fn alternate(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let mut dims = a.dims().to_vec();
    let both = Tensor::stack(&[a, b], 2)?;
    dims[1] *= 2;
    Ok(both.reshape(dims)?)
}

/// MXFP4 blocks and scales of `[experts, rows, cols]` as the released checkpoints hold them:
/// ggml's quantization of each block of 32, its codes two a byte in order.
fn mxfp4_rows(values: &Tensor) -> Result<(Tensor, Tensor)> {
    let (experts, rows, cols) = values.dims3()?;
    let flat: Vec<f32> = values.flatten_all()?.to_vec1()?;
    let ggml = quantize_mxfp4(&flat);
    let (mut blocks, mut scales) = (Vec::new(), Vec::new());
    for block in ggml.chunks_exact(17) {
        scales.push(block[0]);
        // ggml's byte `j` holds codes `j` and `j + 16`.
        let code = |i: usize| match i < 16 {
            true => block[1 + i] & 0x0f,
            false => block[1 + i - 16] >> 4,
        };
        blocks.extend((0..16).map(|k| code(2 * k) | (code(2 * k + 1) << 4)));
    }
    let n = cols / 32;
    Ok((
        Tensor::from_vec(blocks, (experts, rows, n, 16), &Device::Cpu)?,
        Tensor::from_vec(scales, (experts, rows, n), &Device::Cpu)?,
    ))
}

/// The checkpoint's `config.json`.
fn config(spec: &TinyGptOss, how: GptOssHfConfig) -> serde_json::Value {
    let kinds: Vec<&str> = (0..spec.num_layers)
        .map(|i| match i % 2 {
            0 => "sliding_attention",
            _ => "full_attention",
        })
        .collect();
    let theta = 10_000.0;
    let mut rope = match spec.yarn {
        Some((factor, original)) => serde_json::json!({
            "rope_type": "yarn",
            "factor": factor,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "original_max_position_embeddings": original,
        }),
        None => serde_json::json!({"rope_type": "default"}),
    };
    if how.untruncated && spec.yarn.is_some() {
        rope["truncate"] = false.into();
    }
    let mut config = serde_json::json!({
        "architectures": ["GptOssForCausalLM"],
        "model_type": "gpt_oss",
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.expert_width,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "num_local_experts": spec.experts,
        "num_experts_per_tok": spec.used,
        "experts_per_token": spec.used,
        "sliding_window": spec.window,
        "layer_types": kinds,
        "max_position_embeddings": 1024,
        "initial_context_length": spec.yarn.map_or(1024, |(_, original)| original),
        "rms_norm_eps": 1e-5,
        "swiglu_limit": 7.0,
        "hidden_act": "silu",
        "attention_bias": true,
        "attention_dropout": 0.0,
        "tie_word_embeddings": false,
        "router_aux_loss_coef": 0.9,
        "output_router_logits": false,
        "use_cache": true,
    });
    if how.rope_parameters {
        rope["rope_theta"] = theta.into();
        config["rope_parameters"] = rope;
    } else {
        config["rope_theta"] = theta.into();
        config["rope_scaling"] = rope;
    }
    if spec.mxfp4 {
        config["quantization_config"] = serde_json::json!({
            "quant_method": "mxfp4",
            "modules_to_not_convert": [
                "model.layers.*.self_attn",
                "model.layers.*.mlp.router",
                "model.embed_tokens",
                "lm_head"
            ],
        });
    }
    config
}
