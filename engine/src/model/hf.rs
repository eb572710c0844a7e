//! Loading a Hugging Face directory of any family in `crate::model::arch`: `config.json`
//! (resolved through the family's declaration: windows, layer kinds, soft-caps, RoPE scaling,
//! the activation checked), one or more `*.safetensors` (memory-mapped), `tokenizer.json` and
//! optional `tokenizer_config.json`. Tensor names follow transformers
//! (`model.layers.N.self_attn.q_proj.weight`, `q_norm`, `pre_feedforward_layernorm`, ...),
//! checked against the shapes the config implies; RoPE pairs halves. gpt-oss's own parts
//! (sinks, its biased router and experts, MXFP4) are in `hf_gptoss`, RoPE scaling in
//! `hf_rope`.

use std::path::{Path, PathBuf};

use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};
use serde::Deserialize;

use crate::model::arch::FileFacts;
use crate::model::config::{
    Activation, Architecture, KeyHeadsOfValues, LayerMixer, ModelConfig, RopeStyle,
};
use crate::model::experts;
use crate::model::hf_delta_net::{deal_dense, delta_net_parts};
use crate::model::hf_gemma4;
use crate::model::hf_gptoss::{self, HfGptOss};
use crate::model::hf_granite::HfGranite;
use crate::model::hf_hybrid::{windowed_layers, HfHybrid};
use crate::model::hf_rope::rope_scaling;
use crate::model::hf_text_config::text_model;
use crate::model::linear::Linear;
use crate::model::shapes::{split_dense, unfused, Role, Shapes};
use crate::model::{
    AttentionWeights, DeltaNetWeights, DenseMlp, Embedding, LayerWeights, Mamba2Weights, Mlp,
    ModelWeights, ShortConvWeights, TokenMixer,
};
use crate::{Error, Result};

#[derive(Debug, Deserialize)]
struct HfConfig {
    #[serde(default)]
    architectures: Vec<String>,
    #[serde(default)]
    model_type: Option<String>,
    vocab_size: usize,
    hidden_size: usize,
    /// The dense MLP's width (absent where every layer is a mixture: Qwen3.5-MoE).
    #[serde(default)]
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    #[serde(default = "default_rope_theta")]
    rope_theta: f64,
    #[serde(default = "default_rms_eps", alias = "norm_eps")]
    rms_norm_eps: f64,
    #[serde(default = "default_max_positions")]
    max_position_embeddings: usize,
    #[serde(default)]
    original_max_position_embeddings: Option<usize>,
    #[serde(default, alias = "tie_embedding")]
    tie_word_embeddings: bool,
    #[serde(default)]
    attention_bias: Option<bool>,
    #[serde(default)]
    eos_token_id: Option<serde_json::Value>,
    #[serde(default)]
    sliding_window: Option<usize>,
    #[serde(default)]
    use_sliding_window: Option<bool>,
    #[serde(default)]
    layer_types: Option<Vec<String>>,
    #[serde(default)]
    sliding_window_pattern: Option<usize>,
    #[serde(default)]
    rope_local_base_freq: Option<f64>,
    #[serde(default)]
    query_pre_attn_scalar: Option<f64>,
    #[serde(default)]
    attn_logit_softcapping: Option<f64>,
    #[serde(default)]
    final_logit_softcapping: Option<f64>,
    #[serde(default)]
    rope_scaling: Option<serde_json::Value>,
    #[serde(default)]
    hidden_act: Option<String>,
    #[serde(default)]
    partial_rotary_factor: Option<f64>,
    #[serde(default)]
    hidden_activation: Option<String>,
    #[serde(flatten)]
    experts: experts::load::HfExperts,
    #[serde(flatten)]
    hybrid: HfHybrid,
    #[serde(flatten)]
    granite: HfGranite,
    #[serde(flatten)]
    gptoss: HfGptOss,
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

/// Loads config and weights. `dtype = None` quantizes projections to Q8_0; with
/// `keep_quantized`, what the checkpoint holds quantized (MXFP4 experts) stays so on the CPU.
pub fn load_hf_dir(
    dir: &Path,
    (dtype, keep_quantized): (Option<DType>, bool),
    device: &Device,
) -> Result<HfModel> {
    let config_path = dir.join("config.json");
    let text = std::fs::read_to_string(&config_path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::MissingFile(config_path.clone()),
        _ => Error::io(format!("read {}", config_path.display()), e),
    })?;
    let raw: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| Error::Metadata(format!("{}: {e}", config_path.display())))?;
    let audio = raw.get("audio_config").is_some_and(|a| !a.is_null());
    let (raw, vision) = text_model(raw);
    if vision || audio {
        tracing::info!(
            "{}: the text model only (the {} weights are not read)",
            dir.display(),
            match audio {
                true => "vision and audio towers'",
                false => "vision tower's",
            }
        );
    }
    if named_architecture(&raw).is_some_and(|a| a == Architecture::Gemma4) {
        let files = safetensor_files(dir)?;
        // SAFETY: the files are mapped read-only and not modified while the model is loaded.
        let st = unsafe { MmapedSafetensors::multi(&files)? };
        return hf_gemma4::load(dir, raw, &st, dtype, device);
    }
    let hf: HfConfig = serde_json::from_value(raw)
        .map_err(|e| Error::Metadata(format!("{}: {e}", config_path.display())))?;
    let arch_name = hf
        .architectures
        .first()
        .cloned()
        .or(hf.model_type.clone())
        .ok_or_else(|| Error::Metadata("config.json names no architecture".into()))?;
    let architecture = Architecture::parse(&arch_name)?;
    hf.gptoss.check(architecture)?;
    let gptoss = architecture == Architecture::GptOss;
    let family = architecture.family();
    check_activation(&hf, family.activation)?;
    let head_dim = hf
        .head_dim
        .unwrap_or(hf.hidden_size / hf.num_attention_heads.max(1));
    let rotary_dim = match hf.partial_rotary_factor {
        None => None,
        Some(1.0) => None,
        Some(f) => {
            // As transformers computes it: the head's width times the factor, truncated.
            let rot = (head_dim as f64 * f) as usize;
            if f <= 0.0 || f > 1.0 || rot == 0 || !rot.is_multiple_of(2) {
                return Err(Error::Metadata(format!(
                    "partial_rotary_factor {f} gives {rot} rotated dimensions of {head_dim}: \
                     it must give an even number, at most the head"
                )));
            }
            Some(rot)
        }
    };
    let window = match hf.use_sliding_window {
        Some(false) => None,
        _ => hf.sliding_window,
    };
    let windowed_layers = windowed_layers(hf.layer_types.as_deref())?;
    let granite = architecture == Architecture::GraniteHybrid;
    let kv_heads = hf.num_key_value_heads.unwrap_or(hf.num_attention_heads);
    let mut facts = FileFacts {
        num_layers: hf.num_hidden_layers,
        hidden_size: hf.hidden_size,
        window,
        windowed_layers,
        window_period: hf.sliding_window_pattern,
        local_rope_theta: hf.rope_local_base_freq.map(|t| t as f32),
        attention_scale: hf.query_pre_attn_scalar.map(|s| (1.0 / s.sqrt()) as f32),
        attention_softcap: hf.attn_logit_softcapping.map(|c| c as f32),
        final_softcap: hf.final_logit_softcapping.map(|c| c as f32),
        rope_scaling: rope_scaling(
            hf.rope_scaling.as_ref(),
            hf.max_position_embeddings,
            hf.original_max_position_embeddings,
        )?,
        rotary_dim,
        experts: hf
            .experts
            .facts(hf.num_hidden_layers, hf.intermediate_size)?,
        kv_heads_per_layer: hf.hybrid.kv_heads_per_layer(
            hf.layer_types.as_deref(),
            hf.num_hidden_layers,
            kv_heads,
        )?,
        conv_kernel: hf.hybrid.conv_kernel(),
        delta_net: hf.hybrid.delta_net()?,
        recurrent_layers: hf
            .layer_types
            .as_ref()
            .filter(|kinds| kinds.iter().any(|k| k == "linear_attention"))
            .map(|kinds| kinds.iter().map(|k| k == "linear_attention").collect()),
        full_attention_interval: hf.hybrid.full_attention_interval(),
        key_heads_of_values: Some(KeyHeadsOfValues::Grouped),
        ..FileFacts::default()
    };
    if granite {
        hf.granite
            .apply(hf.layer_types.as_deref(), kv_heads, &mut facts)?;
    }
    let config = ModelConfig {
        architecture,
        vocab_size: hf.vocab_size,
        hidden_size: hf.hidden_size,
        intermediate_size: match (hf.intermediate_size, &facts.experts) {
            (0, Some(experts)) => experts.width,
            (_, None) if granite => hf.granite.dense_width().unwrap_or(hf.intermediate_size),
            (width, _) => hf.hybrid.ffn_width(width),
        },
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
        attention_bias: hf.attention_bias.unwrap_or(family.attention_bias),
        variant: family.variant(&facts)?,
    };
    config.validate()?;

    let files = safetensor_files(dir)?;
    // SAFETY: the files are mapped read-only and not modified while the model is loaded.
    let st = unsafe { MmapedSafetensors::multi(&files)? };
    // A multimodal checkpoint keeps its text model under `model.language_model`.
    let text_prefix = match st.get("model.language_model.embed_tokens.weight") {
        Ok(_) => "model.language_model.",
        Err(_) => "model.",
    };
    // A tensor by llama's name, as the family names it.
    let load = |name: &str| -> Result<Tensor> {
        let name = family
            .hf_renames
            .iter()
            .fold(name.to_string(), |n, (llama, own)| n.replace(llama, own));
        let name = match name.strip_prefix("model.") {
            Some(rest) => format!("{text_prefix}{rest}"),
            None => name,
        };
        st.load(&name, device)
            .map_err(|e| Error::Metadata(format!("tensor {name}: {e}")))
    };
    let f32_of = |name: &str| -> Result<Tensor> { Ok(load(name)?.to_dtype(DType::F32)?) };
    let shapes = Shapes::of(&config);
    let proj = |prefix: &str, role: Role, biased: bool| -> Result<Linear> {
        let bias = if biased {
            Some(f32_of(&format!("{prefix}.bias"))?)
        } else {
            None
        };
        let name = format!("{prefix}.weight");
        let weight = load(&name)?;
        shapes.check(&name, role, weight.dims())?;
        Linear::from_dense(weight, bias, dtype)
    };
    // Norm weights as the forward multiplies them (Gemma's checkpoints store `w - 1`).
    let norm = |name: &str, role: Role| -> Result<Tensor> {
        let name = format!("{name}.weight");
        let w = f32_of(&name)?;
        shapes.check(&name, role, w.dims())?;
        Ok(match family.hf_norm_offset {
            0.0 => w,
            offset => (w + f64::from(offset))?,
        })
    };

    let embedding = f32_of("model.embed_tokens.weight")?;
    let lm_head = if !hf.tie_word_embeddings && st.get("lm_head.weight").is_ok() {
        let weight = load("lm_head.weight")?;
        Linear::from_dense(weight, None, dtype)?
    } else {
        Linear::from_dense(embedding.clone(), None, dtype)?
    };
    let mut layers = Vec::with_capacity(config.num_layers);
    for i in 0..config.num_layers {
        let p = format!("model.layers.{i}");
        let bias = config.attention_bias;
        let attends = config.layer_mixer(i) == LayerMixer::Attention;
        let qk_norm = if config.variant.qk_norm && attends {
            Some((
                norm(&format!("{p}.self_attn.q_norm"), Role::HeadNorm)?,
                norm(&format!("{p}.self_attn.k_norm"), Role::HeadNorm)?,
            ))
        } else {
            None
        };
        // With post norms, `post_attention_layernorm` is the attention output's norm and the
        // MLP's input norm is `pre_feedforward_layernorm`; without, it is the MLP's input norm.
        let (mlp_norm, post_norms) = if config.variant.post_norms {
            (
                norm(&format!("{p}.pre_feedforward_layernorm"), Role::Norm)?,
                Some((
                    norm(&format!("{p}.post_attention_layernorm"), Role::Norm)?,
                    norm(&format!("{p}.post_feedforward_layernorm"), Role::Norm)?,
                )),
            )
        } else {
            (
                norm(&format!("{p}.post_attention_layernorm"), Role::Norm)?,
                None,
            )
        };
        let (q, k, v, mlp) = if family.fused_projections {
            let fused = |name: &str, role: Role| -> Result<Vec<Linear>> {
                let name = format!("{p}.{name}.weight");
                let weight = load(&name)?;
                shapes.check(&name, role, weight.dims())?;
                split_dense(&weight, &shapes.parts(role))?
                    .into_iter()
                    .map(|part| Linear::from_dense(part, None, dtype))
                    .collect()
            };
            let qkv = fused("self_attn.qkv_proj", Role::Qkv)?;
            let gate_up = fused("mlp.gate_up_proj", Role::GateUp)?;
            let (q, k, v, gate, up) = unfused(qkv, gate_up)?;
            let down = proj(&format!("{p}.mlp.down_proj"), Role::Down, false)?;
            let mlp = Mlp::Dense(DenseMlp { gate, up, down });
            ((Some(q), None), Some(k), Some(v), mlp)
        } else {
            let widths = (config.hidden_size, config.intermediate_size);
            let mlp = match &config.variant.moe {
                moe if granite => hf.granite.mlp(&p, moe.as_ref(), widths, &load, dtype)?,
                Some(moe) if gptoss => Mlp::Experts(Box::new(hf_gptoss::experts(
                    &p,
                    moe,
                    config.hidden_size,
                    &load,
                    (dtype, keep_quantized),
                    device,
                )?)),
                Some(moe) if moe.is_sparse(i) => Mlp::Experts(Box::new(experts::load::from_hf(
                    &p,
                    architecture,
                    moe,
                    config.hidden_size,
                    &|name| load(name),
                    dtype,
                )?)),
                _ => Mlp::Dense(DenseMlp {
                    gate: proj(&format!("{p}.mlp.gate_proj"), Role::Up, false)?,
                    up: proj(&format!("{p}.mlp.up_proj"), Role::Up, false)?,
                    down: proj(&format!("{p}.mlp.down_proj"), Role::Down, false)?,
                }),
            };
            let attention = |name: &str, role: Role| -> Result<Option<Linear>> {
                attends
                    .then(|| proj(&format!("{p}.self_attn.{name}"), role, bias))
                    .transpose()
            };
            let q = match config.variant.gated_attention && attends {
                // Each head's query, then its gate.
                true => {
                    let name = format!("{p}.self_attn.q_proj.weight");
                    let weight = load(&name)?;
                    shapes.check(&name, Role::GatedQ, weight.dims())?;
                    Some(deal_dense(&weight, config.head_dim)?)
                }
                false => None,
            };
            let (q, output_gate) = match q {
                Some([q, gate]) => (
                    Some(Linear::from_dense(q, None, dtype)?),
                    Some(Linear::from_dense(gate, None, dtype)?),
                ),
                None => (attention("q_proj", Role::Q)?, None),
            };
            (
                (q, output_gate),
                attention("k_proj", Role::Kv)?,
                attention("v_proj", Role::Kv)?,
                mlp,
            )
        };
        let (q, output_gate) = q;
        let mixer: Box<dyn TokenMixer> = match (q, k, v, config.layer_mixer(i)) {
            (Some(q), Some(k), Some(v), _) => Box::new(AttentionWeights {
                qk_norm,
                q,
                k,
                v,
                o: proj(&format!("{p}.self_attn.o_proj"), Role::O, gptoss)?,
                output_gate,
                sinks: gptoss
                    .then(|| hf_gptoss::sinks(&p, config.num_heads, &load))
                    .transpose()?,
            }),
            (_, _, _, LayerMixer::DeltaNet(shape)) => Box::new(DeltaNetWeights::new(
                shape,
                delta_net_parts(&p, shape, &shapes, &load, dtype)?,
            )?),
            (_, _, _, LayerMixer::Mamba2(shape)) => Box::new(Mamba2Weights::new(
                shape,
                (hf.granite).mamba2_parts(&p, shape, config.hidden_size, &load, dtype)?,
            )?),
            _ => {
                let conv = f32_of(&format!("{p}.conv.conv.weight"))?;
                let in_proj = proj(&format!("{p}.conv.in_proj"), Role::ConvIn, false)?;
                let out_proj = proj(&format!("{p}.conv.out_proj"), Role::ConvOut, false)?;
                let h = config.hidden_size;
                Box::new(ShortConvWeights::new(in_proj, &conv, out_proj, h)?)
            }
        };
        layers.push(LayerWeights {
            attn_norm: norm(&format!("{p}.input_layernorm"), Role::Norm)?,
            post_norms,
            mixer,
            mlp_norm,
            mlp,
            per_layer_input: None,
            output_scale: None,
        });
    }
    let weights = ModelWeights {
        per_layer: None,
        embedding: Embedding::Dense(embedding),
        layers,
        final_norm: norm("model.norm", Role::Norm)?,
        lm_head,
    };
    Ok(HfModel {
        config,
        weights,
        eos_ids: eos_ids(hf.eos_token_id),
    })
}

/// `eos_token_id` of config.json (one id or a list) as ids.
pub(crate) fn eos_ids(value: Option<serde_json::Value>) -> Vec<u32> {
    match value {
        Some(serde_json::Value::Number(n)) => n.as_u64().map(|x| x as u32).into_iter().collect(),
        Some(serde_json::Value::Array(xs)) => xs
            .iter()
            .filter_map(|x| x.as_u64())
            .map(|x| x as u32)
            .collect(),
        _ => Vec::new(),
    }
}

/// The architecture a text config names, where it names one thicket knows.
fn named_architecture(raw: &serde_json::Value) -> Option<Architecture> {
    let named = raw
        .get("architectures")
        .and_then(|a| a.get(0))
        .or_else(|| raw.get("model_type"))?;
    Architecture::parse(named.as_str()?).ok()
}

/// Refuses a config whose activation is not the one the family's forward computes.
fn check_activation(hf: &HfConfig, declared: Activation) -> Result<()> {
    let (key, named) = match (&hf.hidden_activation, &hf.hidden_act) {
        (Some(a), _) => ("hidden_activation", a.as_str()),
        (None, Some(a)) => ("hidden_act", a.as_str()),
        (None, None) => return Ok(()),
    };
    let ok = match declared {
        Activation::Silu => matches!(named, "silu" | "swish"),
        Activation::GeluTanh => matches!(named, "gelu_pytorch_tanh" | "gelu_new" | "gelu_fast"),
        // transformers' gpt-oss names its experts' activation `silu` and clamps it itself.
        Activation::SwigluOai => named == "silu",
    };
    if ok {
        Ok(())
    } else {
        Err(Error::Metadata(format!(
            "{key} = '{named}' is not this family's activation ({declared:?})"
        )))
    }
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
