//! Per-layer shapes a GGUF file gives beyond one count per model, as llama.cpp reads Gemma 4's:
//! global layers with heads of their own (`attention.key_length` and `value_length` for them,
//! `key_length_swa` and `value_length_swa` for the windowed ones, `attention.head_count_kv`
//! per layer), the last layers sharing earlier layers' keys and values
//! (`attention.shared_kv_layers`), and an MLP width per layer (`feed_forward_length` as an
//! array). Which layers are windowed comes from the file's pattern.

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value;

use crate::model::gguf_keys::as_u64;
use crate::{Error, Result};

/// The heads of a file whose windowed and global layers differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SplitHeads {
    /// The windowed layers' KV heads.
    pub kv_heads: usize,
    /// The windowed layers' head width.
    pub head_dim: usize,
    /// The global layers' KV heads and head width.
    pub global: (usize, usize),
}

/// A key's integers: one, or one per layer.
fn integers(md: &HashMap<String, Value>, name: &str) -> Result<Option<Vec<usize>>> {
    match md.get(name) {
        None => Ok(None),
        Some(Value::Array(list)) => list
            .iter()
            .map(|v| as_u64(v, name).map(|x| x as usize))
            .collect::<Result<Vec<usize>>>()
            .map(Some),
        Some(v) => Ok(Some(vec![as_u64(v, name)? as usize])),
    }
}

/// The heads of windowed and global layers where the file gives the windowed ones a width of
/// their own (`key_length_swa`); `None` otherwise. `windowed` is per layer whether it is.
pub(super) fn split_heads(
    md: &HashMap<String, Value>,
    key: &dyn Fn(&str) -> String,
    windowed: &[bool],
) -> Result<Option<SplitHeads>> {
    let one = |name: &str| -> Result<Option<usize>> {
        match integers(md, &key(name))? {
            None => Ok(None),
            Some(list) if list.len() == 1 => Ok(Some(list[0])),
            Some(_) => Err(Error::Metadata(format!("{} is not one integer", key(name)))),
        }
    };
    let Some(head_dim) = one("attention.key_length_swa")? else {
        return Ok(None);
    };
    let need =
        |name: &str| one(name)?.ok_or_else(|| Error::Metadata(format!("missing {}", key(name))));
    let global_dim = need("attention.key_length")?;
    for (value, of) in [
        ("attention.value_length_swa", head_dim),
        ("attention.value_length", global_dim),
    ] {
        if one(value)?.is_some_and(|v| v != of) {
            return Err(Error::Metadata(format!(
                "{} differs from the key width {of}: values of another width are not supported",
                key(value)
            )));
        }
    }
    let name = key("attention.head_count_kv");
    let counts = integers(md, &name)?.ok_or_else(|| Error::Metadata(format!("missing {name}")))?;
    let count_of = |kind: bool| -> Result<usize> {
        let mut counts: Vec<usize> = match counts.len() {
            1 => vec![counts[0]],
            n if n == windowed.len() => windowed
                .iter()
                .zip(&counts)
                .filter(|(w, _)| **w == kind)
                .map(|(_, c)| *c)
                .collect(),
            n => {
                return Err(Error::Metadata(format!(
                    "{name} lists {n} layers of {}",
                    windowed.len()
                )))
            }
        };
        counts.dedup();
        match counts.as_slice() {
            [] => Ok(0),
            [one] if *one > 0 => Ok(*one),
            _ => Err(Error::Metadata(format!(
                "{name}: the {} layers have {counts:?} KV heads; one count per kind is supported",
                if kind { "windowed" } else { "global" }
            ))),
        }
    };
    let kv_heads = count_of(true)?;
    let global_kv = count_of(false)?;
    // A kind no layer has takes the other's count.
    let (kv_heads, global_kv) = match (kv_heads, global_kv) {
        (0, g) => (g, g),
        (w, 0) => (w, w),
        pair => pair,
    };
    Ok(Some(SplitHeads {
        kv_heads,
        head_dim,
        global: (global_kv, global_dim),
    }))
}

/// `feed_forward_length` where the file gives one per layer (`None` where it gives one for
/// every layer or none).
pub(super) fn mlp_widths(
    md: &HashMap<String, Value>,
    key: &dyn Fn(&str) -> String,
    num_layers: usize,
) -> Result<Option<Vec<usize>>> {
    let name = key("feed_forward_length");
    match md.get(&name) {
        Some(Value::Array(_)) => {
            let list = integers(md, &name)?.unwrap_or_default();
            if list.len() < num_layers {
                return Err(Error::Metadata(format!(
                    "{name} lists {} layers of {num_layers}",
                    list.len()
                )));
            }
            Ok(Some(list[..num_layers].to_vec()))
        }
        _ => Ok(None),
    }
}
