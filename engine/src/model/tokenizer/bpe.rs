//! Byte-level BPE (`tokenizer.ggml.model = "gpt2"`): the vocabulary and the merges stored in
//! the file, with the pre-tokenizer `tokenizer.ggml.pre` names, as the upstream
//! `tokenizer.json` declares it (Qwen2's split pattern and NFC, SmolLM's digits, GPT-2's
//! byte-level regex).

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

/// The byte-level BPE tokenizer of a "gpt2" GGUF (added tokens not yet registered).
pub(super) fn build(md: &Metadata, vocab: &GgufVocab) -> Result<Tokenizer> {
    let merges = string_array(md, "tokenizer.ggml.merges")?;
    let pre = optional_string(md, "tokenizer.ggml.pre")
        .map(String::as_str)
        .unwrap_or("default");
    let ids: tokenizers::models::bpe::Vocab = vocab
        .tokens
        .iter()
        .enumerate()
        .map(|(id, tok)| (tok.clone(), id as u32))
        .collect();
    let merges = merges
        .iter()
        .map(|m| {
            m.split_once(' ')
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .ok_or_else(|| Error::Tokenizer(format!("malformed merge '{m}'")))
        })
        .collect::<Result<Vec<_>>>()?;
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
        "qwen2" => {
            let split = Split::new(
                SplitPattern::Regex(QWEN2_SPLIT.to_string()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(|e| Error::Tokenizer(e.to_string()))?;
            vec![split.into(), ByteLevel::new(false, false, false).into()]
        }
        "smollm" => vec![
            Digits::new(true).into(),
            ByteLevel::new(false, true, true).into(),
        ],
        // GPT-2's own behaviour: byte-level with its regex.
        "default" | "gpt2" => vec![ByteLevel::new(false, true, true).into()],
        other => {
            return Err(Error::Tokenizer(format!(
                "pre-tokenizer '{other}' is not supported (supported: qwen2, smollm, gpt2)"
            )))
        }
    };
    Ok(Sequence::new(parts))
}
