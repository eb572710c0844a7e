//! Typed readers of a GGUF file's `{arch}.*` metadata beyond plain numbers: the mixture of
//! experts a file declares, RoPE scaling (linear, YaRN, Phi-3's LongRoPE), per-layer KV head
//! counts (a hybrid's layers without KV), a Gated DeltaNet layer's shape and which layers
//! are recurrent, and integers and floats of whichever width the converter wrote.

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value;

use crate::model::arch::ExpertFacts;
use crate::model::config::{DeltaNetShape, ModelConfig, RopeScaling};
use crate::{Error, Result};

/// `{arch}.ssm.*` as a Gated DeltaNet layer's shape (llama.cpp's names: `conv_kernel`,
/// `group_count` key heads, `time_step_rank` value heads, `state_size` the key head's width,
/// `inner_size` every value head's), or `None` where the file has no `ssm.conv_kernel`.
pub(super) fn delta_net_shape(
    md: &HashMap<String, Value>,
    key: &dyn Fn(&str) -> String,
) -> Result<Option<DeltaNetShape>> {
    let number = |name: &str| -> Result<Option<usize>> {
        md.get(&key(name))
            .map(|v| as_u64(v, &key(name)).map(|x| x as usize))
            .transpose()
    };
    let Some(kernel) = number("ssm.conv_kernel")? else {
        return Ok(None);
    };
    let need = |name: &str| -> Result<usize> {
        number(name)?.ok_or_else(|| Error::Metadata(format!("missing {}", key(name))))
    };
    let (key_heads, value_heads) = (need("ssm.group_count")?, need("ssm.time_step_rank")?);
    let (key_dim, inner) = (need("ssm.state_size")?, need("ssm.inner_size")?);
    if value_heads == 0 || !inner.is_multiple_of(value_heads) {
        return Err(Error::Metadata(format!(
            "{} = {inner} is not a whole number of {value_heads} value heads",
            key("ssm.inner_size")
        )));
    }
    Ok(Some(DeltaNetShape {
        kernel,
        key_heads,
        value_heads,
        key_dim,
        value_dim: inner / value_heads,
        ..DeltaNetShape::default()
    }))
}

/// `{arch}.attention.recurrent_layers`: per layer, whether it is recurrent, where the file
/// lists them (booleans or integers).
pub(super) fn recurrent_layers(
    md: &HashMap<String, Value>,
    key: &dyn Fn(&str) -> String,
) -> Result<Option<Vec<bool>>> {
    let name = key("attention.recurrent_layers");
    match md.get(&name) {
        None => Ok(None),
        Some(Value::Array(list)) => list
            .iter()
            .map(|v| match v {
                Value::Bool(b) => Ok(*b),
                other => Ok(as_u64(other, &name)? != 0),
            })
            .collect::<Result<Vec<bool>>>()
            .map(Some),
        Some(_) => Err(Error::Metadata(format!("{name} is not an array"))),
    }
}

/// `{arch}.attention.sliding_window_pattern`, as llama.cpp reads it: per layer whether it is
/// windowed (an array), or a period `n` whose every `n`-th layer attends globally and the rest
/// through the window (an integer; 0: every layer windowed). Returns the per-layer kinds, or
/// the period; `(None, None)` where the file does not say.
pub(super) fn window_pattern(
    md: &HashMap<String, Value>,
    key: &dyn Fn(&str) -> String,
    num_layers: usize,
) -> Result<(Option<Vec<bool>>, Option<usize>)> {
    let name = key("attention.sliding_window_pattern");
    match md.get(&name) {
        None => Ok((None, None)),
        Some(Value::Array(list)) => {
            let kinds = list
                .iter()
                .map(|v| match v {
                    Value::Bool(b) => Ok(*b),
                    other => Ok(as_u64(other, &name)? != 0),
                })
                .collect::<Result<Vec<bool>>>()?;
            Ok((Some(kinds), None))
        }
        Some(v) => match as_u64(v, &name)? {
            0 => Ok((Some(vec![true; num_layers]), None)),
            n => Ok((None, Some(n as usize))),
        },
    }
}

/// `{arch}.expert_count` and its companions: the mixture a file declares (`None` where it
/// declares no experts). The router must be a softmax (`expert_gating_func` 1, as llama.cpp
/// numbers it) with unscaled weights; whether the chosen weights are normalized is
/// `expert_weights_norm` where the file says, else llama.cpp's choice for the family.
pub(super) fn expert_facts(
    md: &HashMap<String, Value>,
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
pub(super) fn longrope(
    md: &HashMap<String, Value>,
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
pub(super) fn rope_scaling(
    md: &HashMap<String, Value>,
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
                truncate: true,
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

/// The KV heads of the layers that attend, from a per-layer list (0: a layer that does not):
/// one count for all of them (`None` where no layer attends).
/// `rope_freqs.weight`'s divisors split where they turn a pair no more (llama.cpp's
/// converter writes 1e30 for Gemma 4's pairs that do not turn): the pairs that turn, where
/// some do not, and their divisors.
pub(super) fn turning_factors(mut factors: Vec<f32>) -> Result<(Option<usize>, Vec<f32>)> {
    const STILL: f32 = 1e20;
    let Some(turning) = factors.iter().position(|&f| f >= STILL) else {
        return Ok((None, factors));
    };
    if turning == 0 || factors[turning..].iter().any(|&f| f < STILL) {
        return Err(Error::Metadata(
            "rope_freqs.weight: the pairs that do not turn must follow every pair that does".into(),
        ));
    }
    factors.truncate(turning);
    Ok((Some(turning), factors))
}

pub(super) fn attending_kv_heads(list: &[usize], key: &str) -> Result<Option<usize>> {
    let mut attending = list.iter().copied().filter(|&h| h > 0);
    let first = attending.next();
    match (first, attending.find(|&h| Some(h) != first)) {
        (Some(a), Some(b)) => Err(Error::Metadata(format!(
            "{key}: layers with {a} and with {b} KV heads; one count for every attending layer \
             is supported"
        ))),
        _ => Ok(first),
    }
}

pub(super) fn as_u64(v: &Value, key: &str) -> Result<u64> {
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

pub(super) fn as_f32(v: &Value, key: &str) -> Result<f32> {
    match v {
        Value::F32(x) => Ok(*x),
        Value::F64(x) => Ok(*x as f32),
        _ => Err(Error::Metadata(format!("{key} is not a float"))),
    }
}
