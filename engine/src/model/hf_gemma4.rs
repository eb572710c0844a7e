//! Gemma 4 from a Hugging Face checkpoint (`Gemma4ForCausalLM`, or the text model of
//! `Gemma4ForConditionalGeneration`, whose vision and audio towers are not read): the text
//! config resolved as transformers resolves it (each layer's head width and KV heads from
//! `per_layer_config`, or from the flat `global_head_dim` and `num_global_key_value_heads`
//! that the released configs carry; the RoPE of each layer kind from `rope_parameters`, the
//! global one proportional; the shared-KV layers, the doubled MLPs, the mixture beside each
//! dense MLP), then every tensor read under the name llama.cpp's converter gives it, so the
//! blocks are assembled exactly as from a `gemma4` GGUF. The embedding scale is rounded to the
//! table's dtype, as transformers rounds it.

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};
use serde::Deserialize;

use crate::model::arch::{ExpertFacts, FileFacts};
use crate::model::config::{Architecture, ModelConfig, RopeStyle};
use crate::model::gguf_assemble::{assemble, Source};
use crate::model::hf::{eos_ids, HfModel};
use crate::{Error, Result};

/// The keys of Gemma 4's text config that thicket reads (defaults as transformers' own).
#[derive(Debug, Deserialize)]
struct TextConfig {
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: usize,
    #[serde(default = "default_head_dim")]
    head_dim: usize,
    #[serde(default)]
    global_head_dim: Option<usize>,
    #[serde(default)]
    num_global_key_value_heads: Option<usize>,
    #[serde(default)]
    per_layer_config: Option<HashMap<String, LayerOverride>>,
    #[serde(default)]
    layer_types: Option<Vec<String>>,
    #[serde(default = "default_window")]
    sliding_window: usize,
    #[serde(default)]
    rope_parameters: Option<HashMap<String, RopeParameters>>,
    #[serde(default)]
    final_logit_softcapping: Option<f64>,
    #[serde(default)]
    attention_k_eq_v: bool,
    #[serde(default)]
    num_kv_shared_layers: usize,
    #[serde(default = "default_per_layer_width")]
    hidden_size_per_layer_input: usize,
    #[serde(default)]
    vocab_size_per_layer_input: Option<usize>,
    #[serde(default)]
    enable_moe_block: bool,
    #[serde(default)]
    use_double_wide_mlp: bool,
    #[serde(default)]
    num_experts: Option<usize>,
    #[serde(default)]
    top_k_experts: Option<usize>,
    #[serde(default)]
    moe_intermediate_size: Option<usize>,
    #[serde(default = "default_eps")]
    rms_norm_eps: f64,
    #[serde(default = "default_positions")]
    max_position_embeddings: usize,
    #[serde(default = "default_tied")]
    tie_word_embeddings: bool,
    #[serde(default)]
    hidden_activation: Option<String>,
    #[serde(default)]
    use_bidirectional_attention: Option<String>,
    #[serde(default)]
    attention_bias: bool,
    #[serde(default)]
    eos_token_id: Option<serde_json::Value>,
}

/// One layer's departures from the shared geometry.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LayerOverride {
    #[serde(default)]
    head_dim: Option<usize>,
    #[serde(default)]
    num_key_value_heads: Option<usize>,
}

#[derive(Debug, Deserialize)]
struct RopeParameters {
    #[serde(default)]
    rope_type: Option<String>,
    rope_theta: f64,
    #[serde(default)]
    partial_rotary_factor: Option<f64>,
    #[serde(default)]
    factor: Option<f64>,
}

fn default_head_dim() -> usize {
    256
}
fn default_window() -> usize {
    512
}
fn default_per_layer_width() -> usize {
    256
}
fn default_eps() -> f64 {
    1e-6
}
fn default_positions() -> usize {
    131_072
}
fn default_tied() -> bool {
    true
}

fn bad(message: String) -> Error {
    Error::Metadata(format!("gemma4 config.json: {message}"))
}

/// `x` as the nearest value of `dtype` (transformers casts the embedding scale to the
/// table's dtype before multiplying).
pub(crate) fn rounded_to(x: f32, dtype: DType) -> f32 {
    match dtype {
        DType::BF16 => half::bf16::from_f32(x).to_f32(),
        DType::F16 => half::f16::from_f32(x).to_f32(),
        _ => x,
    }
}

impl TextConfig {
    /// Per layer whether it is windowed (transformers' default pattern where none is given,
    /// the last layer always global).
    fn windowed(&self) -> Result<Vec<bool>> {
        let n = self.num_hidden_layers;
        let mut kinds = match &self.layer_types {
            Some(kinds) if kinds.len() != n => {
                return Err(bad(format!(
                    "layer_types lists {} layers of {n}",
                    kinds.len()
                )))
            }
            Some(kinds) => kinds
                .iter()
                .map(|k| match k.as_str() {
                    "sliding_attention" => Ok(true),
                    "full_attention" => Ok(false),
                    other => Err(bad(format!("layer_types holds '{other}'"))),
                })
                .collect::<Result<Vec<bool>>>()?,
            None => (0..n).map(|i| (i + 1) % 6 != 0).collect(),
        };
        if let Some(last) = kinds.last_mut() {
            *last = false;
        }
        Ok(kinds)
    }

    /// Layer `i`'s KV heads and head width.
    fn heads(&self, i: usize, windowed: bool) -> Result<(usize, usize)> {
        let (kv, dim) = (self.num_key_value_heads, self.head_dim);
        match &self.per_layer_config {
            Some(overrides) => {
                let found = overrides
                    .iter()
                    .map(|(k, v)| k.trim().parse::<usize>().map(|k| (k, v)))
                    .collect::<std::result::Result<Vec<_>, _>>()
                    .map_err(|e| bad(format!("per_layer_config has a key not a layer: {e}")))?;
                Ok(match found.iter().find(|(k, _)| *k == i) {
                    Some((_, o)) => (
                        o.num_key_value_heads.unwrap_or(kv),
                        o.head_dim.unwrap_or(dim),
                    ),
                    None => (kv, dim),
                })
            }
            None if windowed => Ok((kv, dim)),
            None => {
                let kv = match self.attention_k_eq_v {
                    true => self.num_global_key_value_heads.unwrap_or(kv),
                    false => kv,
                };
                Ok((kv, self.global_head_dim.unwrap_or(512)))
            }
        }
    }

    /// The windowed layers' heads and the global layers' heads (each kind must agree).
    fn geometry(&self, windowed: &[bool]) -> Result<((usize, usize), (usize, usize))> {
        let mut kinds: [Option<(usize, usize)>; 2] = [None, None];
        for (i, &w) in windowed.iter().enumerate() {
            let heads = self.heads(i, w)?;
            let kind = &mut kinds[usize::from(!w)];
            match kind {
                Some(seen) if *seen != heads => {
                    return Err(bad(format!(
                        "layer {i} has {heads:?} KV heads and widths, others of its kind \
                         {seen:?}: thicket holds one geometry for the windowed layers and one \
                         for the global"
                    )))
                }
                _ => *kind = Some(heads),
            }
        }
        let local = kinds[0].unwrap_or((self.num_key_value_heads, self.head_dim));
        let global = kinds[1].unwrap_or(local);
        Ok((local, global))
    }

    /// The RoPE of a layer kind: its base and, for a proportional one, the pairs that turn of
    /// a head of `head_dim`.
    fn rope(&self, kind: &str, head_dim: usize) -> Result<(f32, Option<usize>)> {
        let Some(p) = self.rope_parameters.as_ref().and_then(|r| r.get(kind)) else {
            // transformers' defaults.
            return Ok(match kind {
                "full_attention" => (1e6, Some(head_dim / 8)),
                _ => (1e4, None),
            });
        };
        if p.factor.is_some_and(|f| f != 1.0) {
            return Err(bad(format!(
                "rope_parameters.{kind}.factor {:?}: a scaled RoPE is not supported for Gemma 4",
                p.factor
            )));
        }
        let pairs = match p.rope_type.as_deref().unwrap_or("default") {
            "default" => None,
            "proportional" => {
                let f = p.partial_rotary_factor.unwrap_or(1.0);
                let turning = (f * head_dim as f64) as usize / 2;
                if !(0.0..=1.0).contains(&f) || turning == 0 {
                    return Err(bad(format!(
                        "rope_parameters.{kind}.partial_rotary_factor {f} turns no pair"
                    )));
                }
                (turning < head_dim / 2).then_some(turning)
            }
            other => {
                return Err(bad(format!(
                    "rope_parameters.{kind}.rope_type '{other}' is not supported for Gemma 4"
                )))
            }
        };
        Ok((p.rope_theta as f32, pairs))
    }
}

/// Loads the Gemma 4 text model of the checkpoint in `dir`, whose text config is `raw`.
pub(crate) fn load(
    dir: &Path,
    raw: serde_json::Value,
    st: &MmapedSafetensors,
    dtype: Option<DType>,
    device: &Device,
) -> Result<HfModel> {
    let hf: TextConfig = serde_json::from_value(raw)
        .map_err(|e| Error::Metadata(format!("{}: {e}", dir.join("config.json").display())))?;
    if hf.use_bidirectional_attention.as_deref() == Some("all") {
        return Err(bad(
            "use_bidirectional_attention 'all' (an encoder) is not supported".into(),
        ));
    }
    if hf.attention_bias {
        return Err(bad("attention_bias: Gemma 4 has no biases".into()));
    }
    if let Some(a) = hf.hidden_activation.as_deref() {
        if !matches!(a, "gelu_pytorch_tanh" | "gelu_new" | "gelu_fast") {
            return Err(bad(format!("hidden_activation '{a}' is not tanh GELU")));
        }
    }
    let n = hf.num_hidden_layers;
    let windowed = hf.windowed()?;
    let (local, global) = hf.geometry(&windowed)?;
    let (rope_theta, pairs) = hf.rope("full_attention", global.1)?;
    let (local_theta, local_pairs) = hf.rope("sliding_attention", local.1)?;
    if local_pairs.is_some() {
        return Err(bad(
            "a proportional RoPE on the windowed layers is not supported".into(),
        ));
    }
    let per_layer_width = hf.hidden_size_per_layer_input;
    if per_layer_width > 0
        && hf
            .vocab_size_per_layer_input
            .is_some_and(|v| v != hf.vocab_size)
    {
        return Err(bad(format!(
            "vocab_size_per_layer_input {:?} differs from vocab_size {}",
            hf.vocab_size_per_layer_input, hf.vocab_size
        )));
    }
    if hf.num_kv_shared_layers >= n {
        return Err(bad(format!(
            "num_kv_shared_layers {} leaves no layer of {n} that keeps keys and values",
            hf.num_kv_shared_layers
        )));
    }
    let first_shared = n - hf.num_kv_shared_layers;
    let mlp_widths: Vec<usize> = (0..n)
        .map(
            |i| match hf.use_double_wide_mlp && hf.num_kv_shared_layers > 0 && i >= first_shared {
                true => 2 * hf.intermediate_size,
                false => hf.intermediate_size,
            },
        )
        .collect();
    let experts = match hf.enable_moe_block {
        false => None,
        true => {
            let need = |v: Option<usize>, key: &str| {
                v.ok_or_else(|| bad(format!("enable_moe_block without {key}")))
            };
            Some(ExpertFacts {
                count: need(hf.num_experts, "num_experts")?,
                used: need(hf.top_k_experts, "top_k_experts")?,
                width: need(hf.moe_intermediate_size, "moe_intermediate_size")?,
                shared_width: None,
                normalize: Some(true),
                sparse_layers: None,
            })
        }
    };
    let prefix = match st.get("model.language_model.embed_tokens.weight") {
        Ok(_) => "model.language_model.",
        Err(_) => "model.",
    };
    let table_dtype = st
        .get(&format!("{prefix}embed_tokens.weight"))
        .map_err(|e| Error::Metadata(format!("tensor {prefix}embed_tokens.weight: {e}")))?
        .dtype();
    let table_dtype = DType::try_from(table_dtype)
        .map_err(|e| Error::Metadata(format!("tensor {prefix}embed_tokens.weight: {e}")))?;
    let facts = FileFacts {
        num_layers: n,
        hidden_size: hf.hidden_size,
        window: Some(hf.sliding_window),
        windowed_layers: Some(windowed),
        local_rope_theta: Some(local_theta),
        final_softcap: hf.final_logit_softcapping.map(|c| c as f32),
        experts,
        embedding_scale: Some(rounded_to((hf.hidden_size as f32).sqrt(), table_dtype)),
        global_heads: (global != local).then_some(global),
        proportional_pairs: pairs,
        shared_kv_layers: hf.num_kv_shared_layers,
        mlp_widths: Some(mlp_widths),
        ..FileFacts::default()
    };
    let family = Architecture::Gemma4.family();
    let config = ModelConfig {
        architecture: Architecture::Gemma4,
        vocab_size: hf.vocab_size,
        hidden_size: hf.hidden_size,
        intermediate_size: hf.intermediate_size,
        num_layers: n,
        num_heads: hf.num_attention_heads,
        num_kv_heads: local.0,
        head_dim: local.1,
        rope_theta,
        rope_style: RopeStyle::Halves,
        rms_norm_eps: hf.rms_norm_eps,
        max_position_embeddings: hf.max_position_embeddings,
        attention_bias: false,
        variant: family.variant(&facts)?,
    };
    config.validate()?;

    let untied = !hf.tie_word_embeddings && st.get("lm_head.weight").is_ok();
    let name_of = |gguf: &str| hf_name(gguf, prefix, untied);
    let has = |gguf: &str| name_of(gguf).is_some_and(|name| st.get(&name).is_ok());
    let tensor = |gguf: &str| -> Result<QTensor> {
        let name = name_of(gguf).ok_or_else(|| {
            Error::Metadata(format!("tensor {gguf} has no name in a Gemma 4 checkpoint"))
        })?;
        let t = st
            .load(&name, device)
            .map_err(|e| Error::Metadata(format!("tensor {name}: {e}")))?;
        // Projections are quantized where no dense type is asked for, as for any checkpoint.
        let kept = match dtype {
            None if t.rank() >= 2 && t.dims()[t.rank() - 1] % GgmlDType::Q8_0.block_size() == 0 => {
                GgmlDType::Q8_0
            }
            _ => GgmlDType::F32,
        };
        Ok(QTensor::quantize(&t.to_dtype(DType::F32)?, kept)?)
    };
    let dense = |t: QTensor| -> Result<Tensor> { Ok(t.dequantize(device)?.to_dtype(DType::F32)?) };
    let source = Source {
        tensor: &tensor,
        has: &has,
        dense: &dense,
        blocks: &|_| None,
        dtype,
        device,
        quantized_tables: dtype.is_none() && device.is_cpu(),
        prepared: None,
        per_layer_width,
    };
    let weights = assemble(&config, &source)?;
    Ok(HfModel {
        config,
        weights,
        eos_ids: eos_ids(hf.eos_token_id),
    })
}

/// The checkpoint's name of the tensor llama.cpp's converter names `gguf` (`None`: a tensor
/// a Gemma 4 checkpoint does not have).
fn hf_name(gguf: &str, prefix: &str, untied: bool) -> Option<String> {
    let top = |rest: &str| Some(format!("{prefix}{rest}"));
    match gguf {
        "token_embd.weight" => return top("embed_tokens.weight"),
        "output_norm.weight" => return top("norm.weight"),
        "output.weight" => return untied.then(|| "lm_head.weight".to_string()),
        "per_layer_token_embd.weight" => return top("embed_tokens_per_layer.weight"),
        "per_layer_model_proj.weight" => return top("per_layer_model_projection.weight"),
        "per_layer_proj_norm.weight" => return top("per_layer_projection_norm.weight"),
        _ => {}
    }
    let (layer, part) = gguf.strip_prefix("blk.")?.split_once('.')?;
    let own = match part {
        "attn_norm.weight" => "input_layernorm.weight",
        "attn_q.weight" => "self_attn.q_proj.weight",
        "attn_k.weight" => "self_attn.k_proj.weight",
        "attn_v.weight" => "self_attn.v_proj.weight",
        "attn_output.weight" => "self_attn.o_proj.weight",
        "attn_q_norm.weight" => "self_attn.q_norm.weight",
        "attn_k_norm.weight" => "self_attn.k_norm.weight",
        "post_attention_norm.weight" => "post_attention_layernorm.weight",
        "ffn_norm.weight" => "pre_feedforward_layernorm.weight",
        "ffn_gate.weight" => "mlp.gate_proj.weight",
        "ffn_up.weight" => "mlp.up_proj.weight",
        "ffn_down.weight" => "mlp.down_proj.weight",
        "post_ffw_norm.weight" => "post_feedforward_layernorm.weight",
        "pre_ffw_norm_2.weight" => "pre_feedforward_layernorm_2.weight",
        "post_ffw_norm_1.weight" => "post_feedforward_layernorm_1.weight",
        "post_ffw_norm_2.weight" => "post_feedforward_layernorm_2.weight",
        "ffn_gate_inp.weight" => "router.proj.weight",
        "ffn_gate_inp.scale" => "router.scale",
        "ffn_down_exps.scale" => "router.per_expert_scale",
        "ffn_gate_up_exps.weight" => "experts.gate_up_proj",
        "ffn_down_exps.weight" => "experts.down_proj",
        "inp_gate.weight" => "per_layer_input_gate.weight",
        "proj.weight" => "per_layer_projection.weight",
        "post_norm.weight" => "post_per_layer_input_norm.weight",
        "layer_output_scale.weight" => "layer_scalar",
        _ => return None,
    };
    top(&format!("layers.{layer}.{own}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedding_scale_is_rounded_as_transformers_rounds_it() {
        // The released widths: E2B, E4B, 26B-A4B, 31B.
        let scale = |h: usize| rounded_to((h as f32).sqrt(), DType::BF16);
        assert_eq!(
            [scale(1536), scale(2560), scale(2816), scale(5376)],
            [39.25, 50.5, 53.0, 73.5]
        );
        assert_eq!(rounded_to(50.596443, DType::F32), 50.596443);
    }

    #[test]
    fn every_converter_name_has_its_checkpoint_name() {
        let p = "model.language_model.";
        assert_eq!(
            hf_name("blk.3.layer_output_scale.weight", p, false).as_deref(),
            Some("model.language_model.layers.3.layer_scalar")
        );
        assert_eq!(
            hf_name("blk.0.ffn_gate_up_exps.weight", "model.", false).as_deref(),
            Some("model.layers.0.experts.gate_up_proj")
        );
        assert_eq!(hf_name("output.weight", p, false), None);
        assert_eq!(
            hf_name("output.weight", p, true).as_deref(),
            Some("lm_head.weight")
        );
        assert_eq!(hf_name("blk.1.attn_sinks.weight", p, false), None);
        assert_eq!(hf_name("rope_freqs.weight", p, false), None);
    }

    fn config(extra: serde_json::Value) -> TextConfig {
        let mut base = serde_json::json!({
            "vocab_size": 16, "hidden_size": 8, "intermediate_size": 16,
            "num_hidden_layers": 6, "num_attention_heads": 2, "num_key_value_heads": 2,
            "head_dim": 4,
        });
        for (k, v) in extra.as_object().unwrap() {
            base[k] = v.clone();
        }
        serde_json::from_value(base).unwrap()
    }

    #[test]
    fn both_layouts_of_the_global_heads_resolve_alike() {
        let flat = config(serde_json::json!({
            "global_head_dim": 8, "num_global_key_value_heads": 1, "attention_k_eq_v": true
        }));
        let kinds = flat.windowed().unwrap();
        assert_eq!(kinds, [true, true, true, true, true, false]);
        assert_eq!(flat.geometry(&kinds).unwrap(), ((2, 4), (1, 8)));
        // Without keys as values, the flat global KV head count is not read.
        let flat = config(serde_json::json!({
            "global_head_dim": 8, "num_global_key_value_heads": 1
        }));
        assert_eq!(flat.geometry(&kinds).unwrap(), ((2, 4), (2, 8)));
        let listed = config(serde_json::json!({
            "per_layer_config": {"05": {"head_dim": 8, "num_key_value_heads": 1}}
        }));
        assert_eq!(listed.geometry(&kinds).unwrap(), ((2, 4), (1, 8)));
        // A global layer missing from the list keeps the shared geometry: two kinds of
        // global layer, refused by layer.
        let uneven = config(serde_json::json!({
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention",
                            "sliding_attention", "sliding_attention", "full_attention"],
            "per_layer_config": {"5": {"head_dim": 8}}
        }));
        let kinds = uneven.windowed().unwrap();
        let err = uneven.geometry(&kinds).unwrap_err().to_string();
        assert!(err.contains("layer 5"), "{err}");
    }

    #[test]
    fn the_global_rope_turns_its_leading_pairs_and_others_are_refused() {
        let c = config(serde_json::json!({"rope_parameters": {
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                               "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}
        }}));
        assert_eq!(c.rope("full_attention", 512).unwrap(), (1e6, Some(64)));
        assert_eq!(c.rope("sliding_attention", 256).unwrap(), (1e4, None));
        let yarn = config(serde_json::json!({"rope_parameters": {
            "full_attention": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}
        }}));
        let err = yarn.rope("full_attention", 512).unwrap_err().to_string();
        assert!(err.contains("factor"), "{err}");
    }
}
