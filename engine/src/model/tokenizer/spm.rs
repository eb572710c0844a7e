//! SentencePiece BPE (`tokenizer.ggml.model = "llama"`: Llama 2, Gemma), rebuilt as
//! Hugging Face converts a SentencePiece model: a BPE model over the pieces with byte
//! fallback to the `<0xNN>` pieces, whose merges come from the scores (pieces `a` and `b`
//! merge when `a`, `b` and `ab` are all pieces, the merge ranked by `ab`'s score, ties by
//! `ab`'s id and then by the ids of `a` and `b`, as `transformers`' `SentencePieceExtractor`
//! orders them). SentencePiece merges the adjacent pair whose union scores highest, which
//! is what these ranks make BPE do.
//!
//! Spaces are written as `▁` before the model sees the text. With
//! `tokenizer.ggml.add_space_prefix` (true when the file does not say, as llama.cpp reads
//! it) a `▁` is also put before the text, and again after every token matched whole, as
//! llama.cpp does; decoding then strips one leading space. Gemma says false.

use std::collections::HashMap;

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::BPE;
use tokenizers::normalizers::replace::Replace;
use tokenizers::normalizers::{Prepend, Sequence as NormalizerSequence};
use tokenizers::{DecoderWrapper, NormalizerWrapper, Tokenizer};

use super::metadata::{bool_or, f32_array, GgufVocab, Metadata};
use crate::{Error, Result};

/// SentencePiece's stand-in for a space.
const SPACE: &str = "\u{2581}";

/// The SentencePiece tokenizer of a "llama" GGUF (added tokens not yet registered).
pub(super) fn build(md: &Metadata, vocab: &GgufVocab) -> Result<Tokenizer> {
    let scores = f32_array(md, "tokenizer.ggml.scores")?;
    if scores.len() != vocab.tokens.len() {
        return Err(Error::Metadata(format!(
            "tokenizer.ggml.scores has {} entries for {} tokens",
            scores.len(),
            vocab.tokens.len()
        )));
    }
    let space_prefix = bool_or(md, "tokenizer.ggml.add_space_prefix", true)?;
    let unk = vocab
        .token_id(md, "tokenizer.ggml.unknown_token_id")?
        .map(|id| vocab.tokens[id as usize].clone());
    let ids = vocab.ids();
    let mut builder = BPE::builder()
        .vocab_and_merges(ids, merges(&vocab.tokens, &scores))
        .byte_fallback(true)
        .fuse_unk(true);
    if let Some(unk) = unk {
        builder = builder.unk_token(unk);
    }
    let bpe = builder
        .build()
        .map_err(|e| Error::Tokenizer(e.to_string()))?;

    let mut inner = Tokenizer::new(bpe);
    let spaces = Replace::new(" ", SPACE).map_err(|e| Error::Tokenizer(e.to_string()))?;
    let normalizer: NormalizerWrapper = if space_prefix {
        NormalizerSequence::new(vec![Prepend::new(SPACE.into()).into(), spaces.into()]).into()
    } else {
        spaces.into()
    };
    inner
        .with_normalizer(Some(normalizer))
        .map_err(|e| Error::Tokenizer(e.to_string()))?;
    let mut decoders: Vec<DecoderWrapper> = vec![
        Replace::new(SPACE, " ")
            .map_err(|e| Error::Tokenizer(e.to_string()))?
            .into(),
        ByteFallback::default().into(),
        Fuse::default().into(),
    ];
    if space_prefix {
        decoders.push(Strip::new(' ', 1, 0).into());
    }
    inner.with_decoder(Some(DecoderSequence::new(decoders)));
    Ok(inner)
}

/// The merges of a SentencePiece vocabulary, best first.
fn merges(tokens: &[String], scores: &[f32]) -> Vec<(String, String)> {
    let ids: HashMap<&str, u32> = tokens
        .iter()
        .enumerate()
        .map(|(id, tok)| (tok.as_str(), id as u32))
        .collect();
    // (piece, left id, right id, byte offset of the split)
    let mut found: Vec<(u32, u32, u32, usize)> = Vec::new();
    for (id, piece) in tokens.iter().enumerate() {
        for (at, _) in piece.char_indices().skip(1) {
            let (left, right) = piece.split_at(at);
            if let (Some(&a), Some(&b)) = (ids.get(left), ids.get(right)) {
                found.push((id as u32, a, b, at));
            }
        }
    }
    found.sort_by(|x, y| {
        scores[y.0 as usize]
            .total_cmp(&scores[x.0 as usize])
            .then(x.0.cmp(&y.0))
            .then(x.1.cmp(&y.1))
            .then(x.2.cmp(&y.2))
    });
    found
        .into_iter()
        .map(|(id, _, _, at)| {
            let (left, right) = tokens[id as usize].split_at(at);
            (left.to_string(), right.to_string())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use candle_core::quantized::gguf_file::{Content, Value, VersionedMagic};

    use super::*;
    use crate::model::tokenizer::ModelTokenizer;

    /// Control tokens, then the 256 byte pieces, then the normal pieces and a user-defined
    /// one: (text, score, type).
    fn pieces() -> Vec<(String, f32, i32)> {
        let mut pieces: Vec<(String, f32, i32)> = ["<unk>", "<s>", "</s>", "<end_of_turn>"]
            .iter()
            .map(|t| (t.to_string(), 0.0, if *t == "<unk>" { 2 } else { 3 }))
            .collect();
        pieces.extend((0..=255u8).map(|b| (format!("<0x{b:02X}>"), 0.0, 6)));
        let normal = [
            ("▁", -1.0),
            ("a", -2.0),
            ("b", -3.0),
            ("c", -4.0),
            ("bc", -5.0),
            ("ab", -6.0),
            ("▁a", -7.0),
        ];
        pieces.extend(normal.iter().map(|(t, s)| (t.to_string(), *s, 1)));
        pieces.push(("<hr>".into(), 0.0, 4));
        pieces
    }

    fn content(pieces: &[(String, f32, i32)], extra: Vec<(&str, Value)>) -> Content {
        let array =
            |f: &dyn Fn(&(String, f32, i32)) -> Value| Value::Array(pieces.iter().map(f).collect());
        let mut metadata: HashMap<String, Value> = [
            ("tokenizer.ggml.model", Value::String("llama".into())),
            (
                "tokenizer.ggml.tokens",
                array(&|p| Value::String(p.0.clone())),
            ),
            ("tokenizer.ggml.scores", array(&|p| Value::F32(p.1))),
            ("tokenizer.ggml.token_type", array(&|p| Value::I32(p.2))),
            ("tokenizer.ggml.unknown_token_id", Value::U32(0)),
            ("tokenizer.ggml.bos_token_id", Value::U32(1)),
            ("tokenizer.ggml.eos_token_id", Value::U32(2)),
        ]
        .into_iter()
        .chain(extra)
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        metadata.retain(|_, v| !matches!(v, Value::Array(a) if a.is_empty()));
        Content {
            magic: VersionedMagic::GgufV3,
            metadata,
            tensor_infos: HashMap::new(),
            tensor_data_offset: 0,
        }
    }

    fn tokenizer(extra: Vec<(&str, Value)>) -> ModelTokenizer {
        ModelTokenizer::from_gguf(&content(&pieces(), extra)).unwrap()
    }

    fn id(tok: &ModelTokenizer, piece: &str) -> u32 {
        tok.token_to_id(piece).unwrap()
    }

    #[test]
    fn merges_are_every_split_into_pieces_ranked_by_the_union_score() {
        let tokens: Vec<String> = ["a", "b", "c", "ab", "bc", "abc", "▁", "▁a"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let scores = [0.0, 0.0, 0.0, -2.0, -1.0, -3.0, 0.0, -0.5];
        let pair = |a: &str, b: &str| (a.to_string(), b.to_string());
        assert_eq!(
            merges(&tokens, &scores),
            vec![
                pair("▁", "a"),
                pair("b", "c"),
                pair("a", "b"),
                // "abc" splits both ways; its left pieces' ids order them.
                pair("a", "bc"),
                pair("ab", "c"),
            ]
        );
    }

    #[test]
    fn the_best_scoring_pair_merges_first_and_unknown_characters_fall_back_to_bytes() {
        let no_prefix = ("tokenizer.ggml.add_space_prefix", Value::Bool(false));
        let tok = tokenizer(vec![no_prefix]);
        // "bc" (-5) outscores "ab" (-6): SentencePiece merges b+c, leaving a alone.
        assert_eq!(
            tok.encode_plain("abc").unwrap(),
            [id(&tok, "a"), id(&tok, "bc")]
        );
        // Spaces become the piece "▁", which no neighbour merges with here.
        let ids = tok.encode_plain("a b").unwrap();
        assert_eq!(ids, [id(&tok, "a"), id(&tok, "▁"), id(&tok, "b")]);
        assert_eq!(tok.decode(&ids).unwrap(), "a b");
        // 'é' is no piece: its UTF-8 bytes are, and decode joins them again.
        let ids = tok.encode_plain("é").unwrap();
        assert_eq!(ids, [id(&tok, "<0xC3>"), id(&tok, "<0xA9>")]);
        assert_eq!(tok.decode(&ids).unwrap(), "é");
        // BOS is added when the file does not say otherwise (llama.cpp's default).
        assert_eq!(tok.encode("a").unwrap(), [1, id(&tok, "a")]);
    }

    #[test]
    fn a_space_prefix_is_added_to_the_text_and_after_whole_tokens_and_stripped_on_decode() {
        // No add_space_prefix key: true, as llama.cpp reads a "llama" vocabulary.
        let tok = tokenizer(Vec::new());
        let ids = tok.encode_plain("abc").unwrap();
        assert_eq!(ids, [id(&tok, "▁a"), id(&tok, "bc")]);
        assert_eq!(tok.decode(&ids).unwrap(), "abc");
        let ids = tok.encode_plain("<hr>a").unwrap();
        assert_eq!(ids, [id(&tok, "<hr>"), id(&tok, "▁a")]);
    }

    #[test]
    fn control_and_user_defined_tokens_are_matched_whole() {
        let tok = tokenizer(vec![
            ("tokenizer.ggml.add_space_prefix", Value::Bool(false)),
            ("tokenizer.ggml.add_bos_token", Value::Bool(false)),
        ]);
        let ids = tok.encode("a<hr>b<end_of_turn>").unwrap();
        assert_eq!(
            ids,
            [
                id(&tok, "a"),
                id(&tok, "<hr>"),
                id(&tok, "b"),
                id(&tok, "<end_of_turn>")
            ]
        );
        assert_eq!(tok.decode(&ids).unwrap(), "a<hr>b<end_of_turn>");
        assert_eq!(tok.decode_skip_special(&ids).unwrap(), "a<hr>b");
        assert_eq!(tok.eos_ids(), &[2, id(&tok, "<end_of_turn>")]);
    }

    #[test]
    fn malformed_vocabularies_are_clear_errors() {
        let err = |content: Content| ModelTokenizer::from_gguf(&content).unwrap_err().to_string();
        let msg = err(content(
            &pieces(),
            vec![("tokenizer.ggml.model", Value::String("bert".into()))],
        ));
        assert!(
            msg.contains("'bert' is not supported") && msg.contains("'llama'"),
            "{msg}"
        );
        let msg = err(content(
            &pieces(),
            vec![("tokenizer.ggml.scores", Value::Array(Vec::new()))],
        ));
        assert!(msg.contains("missing tokenizer.ggml.scores"), "{msg}");
        let msg = err(content(
            &pieces(),
            vec![("tokenizer.ggml.scores", Value::Array(vec![Value::F32(0.0)]))],
        ));
        assert!(msg.contains("scores has 1 entries for 268 tokens"), "{msg}");
        let msg = err(content(
            &pieces(),
            vec![("tokenizer.ggml.bos_token_id", Value::U32(9999))],
        ));
        assert!(
            msg.contains("bos_token_id is 9999, past the vocabulary"),
            "{msg}"
        );
        let msg = err(content(
            &pieces(),
            vec![(
                "tokenizer.ggml.token_type",
                Value::Array(vec![Value::I32(1)]),
            )],
        ));
        assert!(
            msg.contains("token_type has 1 entries for 268 tokens"),
            "{msg}"
        );
    }
}
