//! Loading a GGUF of any family in `crate::model::arch`: hyper-parameters from `{arch}.*`
//! metadata resolved through the family's declaration, weights by llama.cpp's tensor names
//! (`blk.N.attn_q.weight`, `attn_q_norm`, `post_attention_norm`, ...) checked against the
//! shapes the config implies, kept quantized or dequantized to the requested dtype. GGUF llama
//! weights are permuted for interleaved RoPE; the other families keep the halves layout; norm
//! weights are stored as the forward multiplies them (Gemma's `1 + w` is added at conversion).

use std::fs::File;
use std::io::BufReader;
use std::path::Path;

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::QTensor;
use candle_core::{DType, Device, Tensor};

use crate::model::arch::{ExpertFacts, FileFacts};
use crate::model::config::{Architecture, ModelConfig, RopeScaling};
use crate::model::experts::load::GgufTensors;
use crate::model::experts::prepared::PreparedExperts;
use crate::model::linear::Linear;
use crate::model::shapes::{split_quantized, unfused, Role, Shapes};
use crate::model::tokenizer::ModelTokenizer;
use crate::model::{DenseMlp, Embedding, LayerWeights, Mlp, ModelWeights};
use crate::{Error, Result};

/// Reads a GGUF header and metadata, with errors that name the file.
pub fn read_content(path: &Path) -> Result<(Content, BufReader<File>)> {
    let file = File::open(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::MissingFile(path.to_path_buf()),
        _ => Error::io(format!("open {}", path.display()), e),
    })?;
    let mut reader = BufReader::new(file);
    let content = Content::read(&mut reader).map_err(|e| Error::InvalidGguf {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    Ok((content, reader))
}

/// Hyper-parameters from GGUF metadata, with the family's declaration resolved.
pub fn config_from_gguf(content: &Content) -> Result<ModelConfig> {
    let md = &content.metadata;
    let arch_name = md
        .get("general.architecture")
        .and_then(|v| v.to_string().ok())
        .ok_or_else(|| Error::Metadata("missing general.architecture".into()))?;
    let architecture = Architecture::parse(arch_name)?;
    let family = architecture.family();
    let key = |k: &str| format!("{arch_name}.{k}");
    let get = |k: &str| {
        md.get(&key(k))
            .ok_or_else(|| Error::Metadata(format!("missing {}", key(k))))
    };
    let usize_of = |k: &str| -> Result<usize> { Ok(as_u64(get(k)?, &key(k))? as usize) };
    // Present keys must parse; absent optional keys are `None`.
    let optional_usize = |k: &str| -> Result<Option<usize>> {
        md.get(&key(k))
            .map(|v| as_u64(v, &key(k)).map(|x| x as usize))
            .transpose()
    };
    let optional_f32 = |k: &str| -> Result<Option<f32>> {
        md.get(&key(k)).map(|v| as_f32(v, &key(k))).transpose()
    };
    let hidden_size = usize_of("embedding_length")?;
    let num_heads = usize_of("attention.head_count")?;
    let num_kv_heads = optional_usize("attention.head_count_kv")?.unwrap_or(num_heads);
    let head_dim = match optional_usize("attention.key_length")? {
        Some(d) => d,
        None => optional_usize("rope.dimension_count")?.unwrap_or(hidden_size / num_heads.max(1)),
    };
    if let Some(v) = optional_usize("attention.value_length")? {
        if v != head_dim {
            return Err(Error::Metadata(format!(
                "{} is {v} but {} is {head_dim}: value heads of another width are not supported",
                key("attention.value_length"),
                key("attention.key_length")
            )));
        }
    }
    let rotary_dim = match optional_usize("rope.dimension_count")? {
        Some(rot) if rot == head_dim => None,
        Some(rot) if rot > 0 && rot < head_dim && rot.is_multiple_of(2) => Some(rot),
        Some(rot) => {
            return Err(Error::Metadata(format!(
                "{} is {rot} for heads of {head_dim}: it must be even and at most the head",
                key("rope.dimension_count")
            )))
        }
        None => None,
    };
    let vocab_size = match usize_of("vocab_size") {
        Ok(v) => v,
        Err(_) => md
            .get("tokenizer.ggml.tokens")
            .and_then(|v| v.to_vec().ok())
            .map(Vec::len)
            .ok_or_else(|| Error::Metadata("missing vocabulary size".into()))?,
    };
    let num_layers = usize_of("block_count")?;
    let facts = FileFacts {
        num_layers,
        hidden_size,
        window: optional_usize("attention.sliding_window")?,
        windowed_layers: None,
        window_period: None,
        local_rope_theta: optional_f32("rope.freq_base_swa")?,
        attention_scale: family
            .gguf_residual_query_scale_at
            .contains(&num_layers)
            .then(|| (1.0 / ((hidden_size / num_heads.max(1)) as f64).sqrt()) as f32),
        attention_softcap: optional_f32("attn_logit_softcapping")?,
        final_softcap: optional_f32("final_logit_softcapping")?,
        rope_scaling: rope_scaling(md, &key)?,
        rotary_dim,
        experts: expert_facts(md, &key, family)?,
    };
    let intermediate_size = match (&facts.experts, optional_usize("feed_forward_length")?) {
        (_, Some(width)) => width,
        // Every layer is a mixture: no dense MLP needs the width.
        (Some(experts), None) => experts.width,
        (None, None) => usize_of("feed_forward_length")?,
    };
    Ok(ModelConfig {
        architecture,
        vocab_size,
        hidden_size,
        intermediate_size,
        num_layers,
        num_heads,
        num_kv_heads,
        head_dim,
        rope_theta: optional_f32("rope.freq_base")?.unwrap_or(10_000.0),
        rope_style: family.gguf_rope_style,
        rms_norm_eps: f64::from(as_f32(
            get("attention.layer_norm_rms_epsilon")?,
            &key("attention.layer_norm_rms_epsilon"),
        )?),
        max_position_embeddings: optional_usize("context_length")?.unwrap_or(4096),
        attention_bias: family.attention_bias,
        variant: family.variant(&facts)?,
    })
}

/// `{arch}.expert_count` and its companions: the mixture a file declares (`None` where it
/// declares no experts). The router must be a softmax (`expert_gating_func` 1, as llama.cpp
/// numbers it) with unscaled weights; whether the chosen weights are normalized is
/// `expert_weights_norm` where the file says, else llama.cpp's choice for the family.
fn expert_facts(
    md: &std::collections::HashMap<String, Value>,
    key: &dyn Fn(&str) -> String,
    family: &crate::model::arch::Family,
) -> Result<Option<ExpertFacts>> {
    let number = |name: &str| -> Result<Option<usize>> {
        md.get(&key(name))
            .map(|v| as_u64(v, &key(name)).map(|x| x as usize))
            .transpose()
    };
    let count = match number("expert_count")? {
        None | Some(0) => return Ok(None),
        Some(n) => n,
    };
    let used = number("expert_used_count")?
        .ok_or_else(|| Error::Metadata(format!("missing {}", key("expert_used_count"))))?;
    let width = match number("expert_feed_forward_length")? {
        Some(w) => w,
        // Mixtral's experts are as wide as its `feed_forward_length`.
        None => number("feed_forward_length")?.ok_or_else(|| {
            Error::Metadata(format!("missing {}", key("expert_feed_forward_length")))
        })?,
    };
    if let Some(v) = md.get(&key("expert_gating_func")) {
        let func = as_u64(v, &key("expert_gating_func"))?;
        if func != 1 {
            let name = match func {
                2 => "sigmoid",
                _ => "an unknown function",
            };
            return Err(Error::Metadata(format!(
                "{} = {func} ({name}): only a softmax router is supported",
                key("expert_gating_func")
            )));
        }
    }
    if let Some(v) = md.get(&key("expert_weights_scale")) {
        let scale = as_f32(v, &key("expert_weights_scale"))?;
        if scale != 1.0 {
            return Err(Error::Metadata(format!(
                "{} = {scale}: scaled expert weights are not supported",
                key("expert_weights_scale")
            )));
        }
    }
    if let Some(v) = md.get(&key("expert_group_count")) {
        if as_u64(v, &key("expert_group_count"))? > 1 {
            return Err(Error::Metadata(format!(
                "{}: grouped expert routing is not supported",
                key("expert_group_count")
            )));
        }
    }
    let normalize = match md.get(&key("expert_weights_norm")) {
        Some(Value::Bool(b)) => Some(*b),
        Some(_) => {
            return Err(Error::Metadata(format!(
                "{} is not a boolean",
                key("expert_weights_norm")
            )))
        }
        None => family.experts.map(|e| e.gguf_normalize),
    };
    Ok(Some(ExpertFacts {
        count,
        used,
        width,
        shared_width: number("expert_shared_feed_forward_length")?,
        normalize,
        sparse_layers: None,
    }))
}

/// Phi-3's LongRoPE as llama.cpp's converter writes it: the two factor tensors, the original
/// context (`{arch}.rope.scaling.original_context_length`, required) and the factor on cos and
/// sin (`{arch}.rope.scaling.attn_factor`, 1 where absent, as llama.cpp reads it).
fn longrope(
    md: &std::collections::HashMap<String, Value>,
    config: &ModelConfig,
    factors: &dyn Fn(&str) -> Result<Vec<f32>>,
) -> Result<RopeScaling> {
    let arch = config.architecture.as_str();
    let original_key = format!("{arch}.rope.scaling.original_context_length");
    let original = md
        .get(&original_key)
        .and_then(|v| v.to_u64().ok().or_else(|| v.to_u32().ok().map(u64::from)))
        .map(|v| v as usize)
        .filter(|&v| v > 1)
        .ok_or_else(|| Error::Metadata(format!("{original_key} is missing: LongRoPE needs it")))?;
    let factor_key = format!("{arch}.rope.scaling.attn_factor");
    let attention_factor = md
        .get(&factor_key)
        .map(|v| as_f32(v, &factor_key))
        .transpose()?
        .unwrap_or(1.0);
    Ok(RopeScaling::LongRope {
        short: factors("rope_factors_short.weight")?,
        long: factors("rope_factors_long.weight")?,
        original,
        attention_factor,
        long_context: config.max_position_embeddings > original,
    })
}

/// `{arch}.rope.scaling.*`: none; linear with its factor; YaRN with its factor, original
/// context and bounds; LongRoPE (its factors are tensors: the weights' loader reads them); any
/// other type is refused.
fn rope_scaling(
    md: &std::collections::HashMap<String, Value>,
    key: &dyn Fn(&str) -> String,
) -> Result<RopeScaling> {
    let kind = match md.get(&key("rope.scaling.type")) {
        None => return Ok(RopeScaling::None),
        Some(v) => v
            .to_string()
            .map_err(|_| Error::Metadata(format!("{} is not a string", key("rope.scaling.type"))))?
            .clone(),
    };
    let factor = md
        .get(&key("rope.scaling.factor"))
        .map(|v| as_f32(v, &key("rope.scaling.factor")))
        .transpose()?;
    let u32_key = |name: &str| -> Option<usize> {
        let v = md.get(&key(name))?;
        v.to_u32()
            .map(|v| v as usize)
            .ok()
            .or_else(|| v.to_u64().ok().map(|v| v as usize))
    };
    let f32_key = |name: &str| -> Result<Option<f32>> {
        md.get(&key(name))
            .map(|v| as_f32(v, &key(name)))
            .transpose()
    };
    match (kind.as_str(), factor) {
        ("none", _) => Ok(RopeScaling::None),
        // Set from the factor tensors, which the weights' loader reads.
        ("longrope", _) => Ok(RopeScaling::None),
        ("yarn", Some(factor)) if factor > 0.0 => {
            if f32_key("rope.scaling.yarn_log_multiplier")?.is_some_and(|m| m != 0.0) {
                return Err(Error::Metadata(format!(
                    "{} (DeepSeek's YaRN) is not supported",
                    key("rope.scaling.yarn_log_multiplier")
                )));
            }
            if f32_key("rope.scaling.yarn_ext_factor")?.is_some_and(|e| e != 1.0) {
                return Err(Error::Metadata(format!(
                    "{} other than 1 is not supported",
                    key("rope.scaling.yarn_ext_factor")
                )));
            }
            let original = u32_key("rope.scaling.original_context_length")
                .or_else(|| u32_key("context_length"))
                .ok_or_else(|| {
                    Error::Metadata(format!(
                        "{} is missing: YaRN needs it",
                        key("rope.scaling.original_context_length")
                    ))
                })?;
            // As llama.cpp computes it: 0.1 ln(factor) + 1, times the file's attention factor.
            let mscale = if factor > 1.0 {
                0.1 * factor.ln() + 1.0
            } else {
                1.0
            };
            Ok(RopeScaling::Yarn {
                factor,
                original,
                beta_fast: f32_key("rope.scaling.yarn_beta_fast")?.unwrap_or(32.0),
                beta_slow: f32_key("rope.scaling.yarn_beta_slow")?.unwrap_or(1.0),
                attention_factor: mscale * f32_key("rope.scaling.attn_factor")?.unwrap_or(1.0),
            })
        }
        ("yarn", _) => Err(Error::Metadata(format!(
            "{} must be a positive number for YaRN",
            key("rope.scaling.factor")
        ))),
        ("linear", Some(1.0)) => Ok(RopeScaling::None),
        ("linear", Some(factor)) if factor > 0.0 => Ok(RopeScaling::Linear { factor }),
        ("linear", _) => Err(Error::Metadata(format!(
            "{} must be a positive number for linear RoPE scaling",
            key("rope.scaling.factor")
        ))),
        (other, _) => Err(Error::Metadata(format!(
            "{} = '{other}' is not supported (supported: none, linear, yarn, longrope, and \
             Llama 3.1's rope_freqs)",
            key("rope.scaling.type")
        ))),
    }
}

/// Loads weights and tokenizer from a GGUF. `dtype = None` keeps quantized weights.
pub fn load_gguf(
    path: &Path,
    dtype: Option<DType>,
    device: &Device,
) -> Result<(ModelConfig, ModelWeights, ModelTokenizer)> {
    load_gguf_with(path, dtype, device, None)
}

/// `load_gguf`, mapping a mixture's experts from a file prepared for the SIMD kernels in
/// `prepared_experts` (written there on first use; see `experts::prepared`) where the weights
/// stay quantized on the CPU.
pub fn load_gguf_with(
    path: &Path,
    dtype: Option<DType>,
    device: &Device,
    prepared_experts: Option<&Path>,
) -> Result<(ModelConfig, ModelWeights, ModelTokenizer)> {
    let (content, reader) = read_content(path)?;
    // The family and its keys first: an unsupported model is named as such.
    config_from_gguf(&content)?;
    let tokenizer = ModelTokenizer::from_gguf(&content)?;
    let (config, weights) = weights_from(path, &content, reader, dtype, device, prepared_experts)?;
    Ok((config, weights, tokenizer))
}

/// Loads config and weights only (a file whose tokenizer is not needed, or absent).
pub fn load_gguf_weights(
    path: &Path,
    dtype: Option<DType>,
    device: &Device,
) -> Result<(ModelConfig, ModelWeights)> {
    load_gguf_weights_with(path, dtype, device, None)
}

/// `load_gguf_weights` with a directory of prepared experts (see `load_gguf_with`).
pub fn load_gguf_weights_with(
    path: &Path,
    dtype: Option<DType>,
    device: &Device,
    prepared_experts: Option<&Path>,
) -> Result<(ModelConfig, ModelWeights)> {
    let (content, reader) = read_content(path)?;
    weights_from(path, &content, reader, dtype, device, prepared_experts)
}

fn weights_from(
    path: &Path,
    content: &Content,
    reader: BufReader<File>,
    dtype: Option<DType>,
    device: &Device,
    prepared_experts: Option<&Path>,
) -> Result<(ModelConfig, ModelWeights)> {
    let mut config = config_from_gguf(content)?;
    let reader = std::cell::RefCell::new(reader);
    let tensor = |name: &str| -> Result<QTensor> {
        if !content.tensor_infos.contains_key(name) {
            return Err(Error::Metadata(format!(
                "missing tensor {name} in {}",
                path.display()
            )));
        }
        content
            .tensor(&mut *reader.borrow_mut(), name, device)
            .map_err(|e| Error::InvalidGguf {
                path: path.to_path_buf(),
                reason: format!("tensor {name}: {e}"),
            })
    };
    let dense = |t: QTensor| -> Result<Tensor> { Ok(t.dequantize(device)?.to_dtype(DType::F32)?) };

    let embedding_q = tensor("token_embd.weight")?;
    // Kept in its blocks where the weights stay quantized on the CPU; dense otherwise.
    let embedding = if dtype.is_none() && device.is_cpu() {
        Embedding::Quantized(std::sync::Arc::new(tensor("token_embd.weight")?))
    } else {
        Embedding::Dense(embedding_q.dequantize(device)?.to_dtype(DType::F32)?)
    };
    let final_norm = dense(tensor("output_norm.weight")?)?;
    let lm_head_q = if content.tensor_infos.contains_key("output.weight") {
        tensor("output.weight")?
    } else {
        embedding_q
    };
    let lm_head = Linear::from_qtensor(lm_head_q, None, dtype)?;
    let family = config.architecture.family();
    let declared_longrope = content
        .metadata
        .get(&format!(
            "{}.rope.scaling.type",
            config.architecture.as_str()
        ))
        .and_then(|v| v.to_string().ok())
        .is_some_and(|t| t == "longrope");
    if declared_longrope
        && !content
            .tensor_infos
            .contains_key("rope_factors_long.weight")
    {
        return Err(Error::Metadata(format!(
            "{}: LongRoPE is declared but rope_factors_long.weight is missing",
            path.display()
        )));
    }
    if content
        .tensor_infos
        .contains_key("rope_factors_long.weight")
    {
        config.variant.rope_scaling = longrope(&content.metadata, &config, &|name| {
            Ok(dense(tensor(name)?)?.to_vec1::<f32>()?)
        })?;
    }
    if content.tensor_infos.contains_key("rope_freqs.weight") {
        // Llama 3.1's scaling, as per-frequency divisors.
        let factors = dense(tensor("rope_freqs.weight")?)?.to_vec1::<f32>()?;
        config.variant.rope_scaling = RopeScaling::Factors(factors);
    }
    let shapes = Shapes::of(&config);
    let has = |name: &str| content.tensor_infos.contains_key(name);
    let prepared = match prepared_experts {
        Some(dir) if dtype.is_none() && device.is_cpu() && config.variant.moe.is_some() => {
            PreparedExperts::open_or_prepare(dir, path, content, &mut reader.borrow_mut())
        }
        _ => None,
    };
    let expert_tensors = GgufTensors {
        read: &tensor,
        has: &has,
        dtype,
        device,
        prepared: prepared.as_ref(),
    };

    let mut layers = Vec::with_capacity(config.num_layers);
    for i in 0..config.num_layers {
        let p = format!("blk.{i}");
        let proj = |name: &str, role: Role, biased: bool| -> Result<Linear> {
            let bias = if biased {
                Some(dense(tensor(&format!("{p}.{name}.bias"))?)?)
            } else {
                None
            };
            let full = format!("{p}.{name}.weight");
            let weight = tensor(&full)?;
            shapes.check(&full, role, weight.shape().dims())?;
            Linear::from_qtensor(weight, bias, dtype)
        };
        let bias = config.attention_bias;
        let (q, k, v, mlp) = if family.fused_projections {
            let fused = |name: &str, role: Role| -> Result<Vec<Linear>> {
                let full = format!("{p}.{name}.weight");
                let weight = tensor(&full)?;
                shapes.check(&full, role, weight.shape().dims())?;
                split_quantized(&weight, &shapes.parts(role))?
                    .into_iter()
                    .map(|part| Linear::from_qtensor(part, None, dtype))
                    .collect()
            };
            let qkv = fused("attn_qkv", Role::Qkv)?;
            let gate_up = fused("ffn_up", Role::GateUp)?;
            let (q, k, v, gate, up) = unfused(qkv, gate_up)?;
            let down = proj("ffn_down", Role::Down, false)?;
            (q, k, v, Mlp::Dense(DenseMlp { gate, up, down }))
        } else {
            let mlp =
                match &config.variant.moe {
                    Some(moe) if moe.is_sparse(i) => Mlp::Experts(Box::new(
                        expert_tensors.mixture(&p, moe, config.hidden_size)?,
                    )),
                    _ => Mlp::Dense(DenseMlp {
                        gate: proj("ffn_gate", Role::Up, false)?,
                        up: proj("ffn_up", Role::Up, false)?,
                        down: proj("ffn_down", Role::Down, false)?,
                    }),
                };
            (
                proj("attn_q", Role::Q, bias)?,
                proj("attn_k", Role::Kv, bias)?,
                proj("attn_v", Role::Kv, bias)?,
                mlp,
            )
        };
        let o = proj("attn_output", Role::O, false)?;
        let norm = |name: &str, role: Role| -> Result<Tensor> {
            let full = format!("{p}.{name}.weight");
            let t = dense(tensor(&full)?)?;
            shapes.check(&full, role, t.dims())?;
            Ok(t)
        };
        let qk_norm = if config.variant.qk_norm {
            Some((
                norm("attn_q_norm", Role::HeadNorm)?,
                norm("attn_k_norm", Role::HeadNorm)?,
            ))
        } else {
            None
        };
        let post_norms = if config.variant.post_norms {
            Some((
                norm("post_attention_norm", Role::Norm)?,
                norm("post_ffw_norm", Role::Norm)?,
            ))
        } else {
            None
        };
        layers.push(LayerWeights {
            attn_norm: norm("attn_norm", Role::Norm)?,
            qk_norm,
            post_norms,
            q,
            k,
            v,
            o,
            mlp_norm: norm("ffn_norm", Role::Norm)?,
            mlp,
        });
    }
    let weights = ModelWeights {
        embedding,
        layers,
        final_norm,
        lm_head,
    };
    Ok((config, weights))
}

fn as_u64(v: &Value, key: &str) -> Result<u64> {
    let r = match v {
        Value::U8(x) => Ok(u64::from(*x)),
        Value::U16(x) => Ok(u64::from(*x)),
        Value::U32(x) => Ok(u64::from(*x)),
        Value::U64(x) => Ok(*x),
        Value::I32(x) => u64::try_from(*x).map_err(|_| ()),
        Value::I64(x) => u64::try_from(*x).map_err(|_| ()),
        _ => Err(()),
    };
    r.map_err(|_| Error::Metadata(format!("{key} is not a non-negative integer")))
}

fn as_f32(v: &Value, key: &str) -> Result<f32> {
    match v {
        Value::F32(x) => Ok(*x),
        Value::F64(x) => Ok(*x as f32),
        _ => Err(Error::Metadata(format!("{key} is not a float"))),
    }
}
