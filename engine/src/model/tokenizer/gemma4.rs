//! Gemma 4's BPE (`tokenizer.ggml.model = "gemma4"`): the vocabulary and merges stored in the
//! file over raw UTF-8 (no byte-level alphabet), spaces written as `▁` before the merges, the
//! text split only into runs of newlines and runs of anything else, and bytes no piece covers
//! falling back to the `<0xNN>` pieces; no space is put before the text. (llama.cpp also takes
//! a run of newlines that is a piece of its own whole; on Gemma 4's merges that is what they
//! give anyway, for runs of 1 to 100: `tests/model/gemma4_tokenizer.rs`.) Decoding turns `▁`
//! back into spaces and fuses byte pieces.

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::models::bpe::BPE;
use tokenizers::normalizers::replace::Replace;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{DecoderWrapper, SplitDelimiterBehavior, Tokenizer};

use super::bpe::file_merges;
use super::metadata::{GgufVocab, Metadata};
use crate::{Error, Result};

/// SentencePiece's stand-in for a space, which Gemma 4's pieces use.
const SPACE: &str = "\u{2581}";

/// The BPE tokenizer of a "gemma4" GGUF (added tokens not yet registered).
pub(super) fn build(md: &Metadata, vocab: &GgufVocab) -> Result<Tokenizer> {
    let failed = |e: &dyn std::fmt::Display| Error::Tokenizer(e.to_string());
    let merges = file_merges(md)?;
    let ids = vocab.ids();
    let bpe = BPE::builder()
        .vocab_and_merges(ids, merges)
        .byte_fallback(true)
        .build()
        .map_err(|e| failed(&e))?;
    let mut inner = Tokenizer::new(bpe);
    inner
        .with_normalizer(Some(Replace::new(" ", SPACE).map_err(|e| failed(&e))?))
        .map_err(|e| failed(&e))?;
    let lines = Split::new(
        SplitPattern::Regex(r"[^\n]+|[\n]+".into()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map_err(|e| failed(&e))?;
    inner.with_pre_tokenizer(Some(lines));
    let decoder: Vec<DecoderWrapper> = vec![
        Replace::new(SPACE, " ").map_err(|e| failed(&e))?.into(),
        ByteFallback::default().into(),
        Fuse::default().into(),
    ];
    inner.with_decoder(Some(DecoderSequence::new(decoder)));
    Ok(inner)
}
