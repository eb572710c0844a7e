//! `config.json`'s RoPE scaling (`rope_scaling`, or transformers 5's `rope_parameters` with a
//! `rope_type`) as thicket's `RopeScaling`: the types transformers computes (default, linear,
//! Llama 3.1's, YaRN with or without its rounded bounds, LongRoPE), each parameter read as
//! transformers reads it; any other type refused by name.

use crate::model::config::RopeScaling;
use crate::{Error, Result};

/// `rope_scaling`: absent, null or `default`; `linear` with its factor; `llama3` with its
/// four parameters; `yarn` with its factor (and its optional bounds and attention factor, as
/// transformers reads them); `longrope` (or its old name `su`) with its two factor lists,
/// against the model's `max_position_embeddings` and `original_max_position_embeddings`. Any
/// other type is refused by name.
pub(crate) fn rope_scaling(
    value: Option<&serde_json::Value>,
    max_positions: usize,
    original: Option<usize>,
) -> Result<RopeScaling> {
    let Some(obj) = value.and_then(|v| v.as_object()) else {
        return match value {
            None | Some(serde_json::Value::Null) => Ok(RopeScaling::None),
            Some(_) => Err(Error::Metadata("rope_scaling is not an object".into())),
        };
    };
    let kind = obj
        .get("rope_type")
        .or_else(|| obj.get("type"))
        .and_then(|v| v.as_str())
        .unwrap_or("default");
    let num = |k: &str| -> Result<f64> {
        obj.get(k)
            .and_then(|v| v.as_f64())
            .ok_or_else(|| Error::Metadata(format!("rope_scaling.{k} is missing or not a number")))
    };
    match kind {
        "default" => Ok(RopeScaling::None),
        "linear" => Ok(RopeScaling::Linear {
            factor: num("factor")? as f32,
        }),
        "llama3" => Ok(RopeScaling::Llama3 {
            factor: num("factor")? as f32,
            low_freq_factor: num("low_freq_factor")? as f32,
            high_freq_factor: num("high_freq_factor")? as f32,
            original_max_position_embeddings: num("original_max_position_embeddings")? as usize,
        }),
        "longrope" | "su" => {
            let factors = |k: &str| -> Result<Vec<f32>> {
                obj.get(k)
                    .and_then(|v| v.as_array())
                    .and_then(|a| a.iter().map(|x| x.as_f64().map(|f| f as f32)).collect())
                    .ok_or_else(|| {
                        Error::Metadata(format!(
                            "rope_scaling.{k} is missing or not a list of numbers"
                        ))
                    })
            };
            let original = original
                .or_else(|| {
                    obj.get("original_max_position_embeddings")?
                        .as_u64()
                        .map(|v| v as usize)
                })
                .filter(|&o| o > 1)
                .ok_or_else(|| {
                    Error::Metadata(
                        "original_max_position_embeddings is missing: LongRoPE needs it".into(),
                    )
                })?;
            // As transformers computes it where the config does not give it.
            let scale = max_positions as f64 / original as f64;
            let attention_factor = match obj.get("attention_factor").and_then(|v| v.as_f64()) {
                Some(f) => f,
                None if scale > 1.0 => (1.0 + scale.ln() / (original as f64).ln()).sqrt(),
                None => 1.0,
            };
            Ok(RopeScaling::LongRope {
                short: factors("short_factor")?,
                long: factors("long_factor")?,
                original,
                attention_factor: attention_factor as f32,
                long_context: max_positions > original,
            })
        }
        "yarn" => {
            let factor = num("factor")?;
            let opt = |k: &str| obj.get(k).and_then(|v| v.as_f64());
            let original = opt("original_max_position_embeddings")
                .map(|v| v as usize)
                .or(original)
                .unwrap_or(max_positions);
            // transformers' `get_mscale`.
            let mscale = |scale: f64, m: f64| {
                if scale <= 1.0 {
                    1.0
                } else {
                    0.1 * m * scale.ln() + 1.0
                }
            };
            let attention_factor = match (
                opt("attention_factor"),
                opt("mscale"),
                opt("mscale_all_dim"),
            ) {
                (Some(f), _, _) => f,
                (None, Some(m), Some(all)) if m != 0.0 && all != 0.0 => {
                    mscale(factor, m) / mscale(factor, all)
                }
                _ => mscale(factor, 1.0),
            };
            Ok(RopeScaling::Yarn {
                factor: factor as f32,
                original,
                beta_fast: opt("beta_fast").unwrap_or(32.0) as f32,
                beta_slow: opt("beta_slow").unwrap_or(1.0) as f32,
                attention_factor: attention_factor as f32,
                // gpt-oss's configs turn the rounding off.
                truncate: obj
                    .get("truncate")
                    .and_then(|v| v.as_bool())
                    .unwrap_or(true),
            })
        }
        other => Err(Error::Metadata(format!(
            "rope_scaling type '{other}' is not supported (supported: default, linear, \
             llama3, yarn, longrope)"
        ))),
    }
}
