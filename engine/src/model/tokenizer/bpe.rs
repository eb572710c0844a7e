//! Byte-level BPE (`tokenizer.ggml.model = "gpt2"`): the vocabulary and the merges stored in
//! the file, with the pre-tokenizer `tokenizer.ggml.pre` names, as the upstream
//! `tokenizer.json` declares it (Qwen2's split pattern and NFC, the o200k split of GPT-4o and
//! gpt-oss that llama.cpp names "gpt-4o", SmolLM's digits, GPT-2's byte-level regex).

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::BPE;
use tokenizers::normalizers::unicode::NFC;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{PreTokenizerWrapper, SplitDelimiterBehavior, Tokenizer};

use super::metadata::{optional_string, string_array, GgufVocab, Metadata};
use crate::{Error, Result};

/// The Qwen2 pre-tokenizer split pattern, as in its upstream tokenizer.json.
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The o200k split pattern (GPT-4o, gpt-oss's o200k_harmony), as tiktoken and openai-harmony
/// use it: words with their leading punctuation and a trailing contraction, split at case
/// changes, digits in runs of up to three, punctuation runs, and whitespace.
const O200K_SPLIT: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
);

/// `tokenizer.ggml.merges`, each `"a b"` as the pair it merges.
pub(super) fn file_merges(md: &Metadata) -> Result<Vec<(String, String)>> {
    string_array(md, "tokenizer.ggml.merges")?
        .iter()
        .map(|m| {
            m.split_once(' ')
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .ok_or_else(|| Error::Tokenizer(format!("malformed merge '{m}'")))
        })
        .collect()
}

/// The byte-level BPE tokenizer of a "gpt2" GGUF (added tokens not yet registered).
pub(super) fn build(md: &Metadata, vocab: &GgufVocab) -> Result<Tokenizer> {
    let pre = optional_string(md, "tokenizer.ggml.pre")
        .map(String::as_str)
        .unwrap_or("default");
    let ids = vocab.ids();
    let merges = file_merges(md)?;
    let bpe = BPE::builder()
        .vocab_and_merges(ids, merges)
        .build()
        .map_err(|e| Error::Tokenizer(e.to_string()))?;

    let mut inner = Tokenizer::new(bpe);
    inner.with_pre_tokenizer(Some(pre_tokenizer(pre)?));
    if pre == "qwen2" {
        inner
            .with_normalizer(Some(NFC))
            .map_err(|e| Error::Tokenizer(e.to_string()))?;
    }
    inner.with_decoder(Some(ByteLevelDecoder::default()));
    Ok(inner)
}

fn pre_tokenizer(pre: &str) -> Result<Sequence> {
    let parts: Vec<PreTokenizerWrapper> = match pre {
        // A split by the pattern, then bytes to GPT-2's characters (no regex of its own).
        "qwen2" => vec![
            split(QWEN2_SPLIT)?,
            ByteLevel::new(false, false, false).into(),
        ],
        "gpt-4o" => vec![
            split(O200K_SPLIT)?,
            ByteLevel::new(false, false, false).into(),
        ],
        "smollm" => vec![
            Digits::new(true).into(),
            ByteLevel::new(false, true, true).into(),
        ],
        // GPT-2's own behaviour: byte-level with its regex.
        "default" | "gpt2" => vec![ByteLevel::new(false, true, true).into()],
        other => {
            return Err(Error::Tokenizer(format!(
                "pre-tokenizer '{other}' is not supported (supported: qwen2, gpt-4o, smollm, gpt2)"
            )))
        }
    };
    Ok(Sequence::new(parts))
}

/// A split that keeps every match of `pattern` as a piece of its own.
fn split(pattern: &str) -> Result<PreTokenizerWrapper> {
    Split::new(
        SplitPattern::Regex(pattern.to_string()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map(Into::into)
    .map_err(|e| Error::Tokenizer(e.to_string()))
}
