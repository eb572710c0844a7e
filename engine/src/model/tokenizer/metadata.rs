//! Reading the tokenizer's `tokenizer.ggml.*` keys out of GGUF metadata: the vocabulary with
//! each token's type, and typed scalars and arrays, each missing or mistyped key reported by
//! name.

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value;

use crate::{Error, Result};

/// GGUF metadata, key to value.
pub(super) type Metadata = HashMap<String, Value>;

/// Token type 2 in `tokenizer.ggml.token_type`: the unknown token.
pub(super) const UNKNOWN: i32 = 2;
/// Token type 3: a control token (BOS, EOS, chat markers).
pub(super) const CONTROL: i32 = 3;
/// Token type 4: a user-defined token, matched whole in text and shown to users.
pub(super) const USER_DEFINED: i32 = 4;

/// The vocabulary of a GGUF tokenizer: token texts by id and the type of each.
pub(super) struct GgufVocab {
    /// Token text by id.
    pub tokens: Vec<String>,
    /// Token type by id (1 normal when the file gives none).
    pub types: Vec<i32>,
}

impl GgufVocab {
    /// Each token's id by its text, as the `tokenizers` BPE model takes them.
    pub(super) fn ids(&self) -> tokenizers::models::bpe::Vocab {
        self.tokens
            .iter()
            .enumerate()
            .map(|(id, tok)| (tok.clone(), id as u32))
            .collect()
    }

    /// `tokenizer.ggml.tokens` and `tokenizer.ggml.token_type`, checked to be the same length.
    pub fn read(md: &Metadata) -> Result<Self> {
        let tokens = string_array(md, "tokenizer.ggml.tokens")?;
        if tokens.is_empty() {
            return Err(Error::Metadata("tokenizer.ggml.tokens is empty".into()));
        }
        let types = match md.get("tokenizer.ggml.token_type") {
            Some(v) => {
                let types = v
                    .to_vec()
                    .map_err(|e| Error::Metadata(format!("tokenizer.ggml.token_type: {e}")))?
                    .iter()
                    .map(|t| integer(t).and_then(|t| i32::try_from(t).ok()))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| {
                        Error::Metadata("tokenizer.ggml.token_type holds a non-integer".into())
                    })?;
                if types.len() != tokens.len() {
                    return Err(Error::Metadata(format!(
                        "tokenizer.ggml.token_type has {} entries for {} tokens",
                        types.len(),
                        tokens.len()
                    )));
                }
                types
            }
            None => vec![1; tokens.len()],
        };
        Ok(Self { tokens, types })
    }

    /// The texts of the tokens of type `kind`, in id order.
    pub fn of_type(&self, kind: i32) -> impl Iterator<Item = &String> {
        self.tokens
            .iter()
            .zip(&self.types)
            .filter(move |(_, &ty)| ty == kind)
            .map(|(tok, _)| tok)
    }

    /// The token id stored at `key`, if present; an id past the vocabulary is an error.
    pub fn token_id(&self, md: &Metadata, key: &str) -> Result<Option<u32>> {
        let Some(value) = md.get(key) else {
            return Ok(None);
        };
        let id = integer(value)
            .and_then(|id| u32::try_from(id).ok())
            .ok_or_else(|| Error::Metadata(format!("{key} is not a token id: {value:?}")))?;
        if id as usize >= self.tokens.len() {
            return Err(Error::Metadata(format!(
                "{key} is {id}, past the vocabulary of {} tokens",
                self.tokens.len()
            )));
        }
        Ok(Some(id))
    }
}

/// The string at `key`.
pub(super) fn string<'a>(md: &'a Metadata, key: &str) -> Result<&'a String> {
    md.get(key)
        .ok_or_else(|| Error::Metadata(format!("missing {key}")))?
        .to_string()
        .map_err(|e| Error::Metadata(format!("{key}: {e}")))
}

/// The string at `key`, if present and a string.
pub(super) fn optional_string<'a>(md: &'a Metadata, key: &str) -> Option<&'a String> {
    md.get(key).and_then(|v| v.to_string().ok())
}

/// The boolean at `key`, or `default` when the file does not say.
pub(super) fn bool_or(md: &Metadata, key: &str, default: bool) -> Result<bool> {
    match md.get(key) {
        Some(v) => v
            .to_bool()
            .map_err(|e| Error::Metadata(format!("{key}: {e}"))),
        None => Ok(default),
    }
}

/// The array of strings at `key`.
pub(super) fn string_array(md: &Metadata, key: &str) -> Result<Vec<String>> {
    array(md, key)?
        .iter()
        .map(|v| {
            v.to_string()
                .cloned()
                .map_err(|e| Error::Metadata(format!("{key}: {e}")))
        })
        .collect()
}

/// The array of f32 at `key`.
pub(super) fn f32_array(md: &Metadata, key: &str) -> Result<Vec<f32>> {
    array(md, key)?
        .iter()
        .map(|v| {
            v.to_f32()
                .map_err(|e| Error::Metadata(format!("{key}: {e}")))
        })
        .collect()
}

/// An integer of any width.
fn integer(v: &Value) -> Option<i64> {
    match *v {
        Value::U8(x) => Some(x.into()),
        Value::I8(x) => Some(x.into()),
        Value::U16(x) => Some(x.into()),
        Value::I16(x) => Some(x.into()),
        Value::U32(x) => Some(x.into()),
        Value::I32(x) => Some(x.into()),
        Value::U64(x) => i64::try_from(x).ok(),
        Value::I64(x) => Some(x),
        _ => None,
    }
}

fn array<'a>(md: &'a Metadata, key: &str) -> Result<&'a Vec<Value>> {
    md.get(key)
        .ok_or_else(|| Error::Metadata(format!("missing {key}")))?
        .to_vec()
        .map_err(|e| Error::Metadata(format!("{key}: {e}")))
}
