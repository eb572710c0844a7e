//! What `/v1/completions` answers with: each choice's text (after the echoed prompt, if any)
//! and its `logprobs` in the legacy completions shape, in a whole response and in stream
//! chunks alike.

use std::collections::BTreeMap;

use engine::request::TokenLogprob;
use engine::ModelTokenizer;
use serde::Serialize;

use crate::server::openai::choice::{finish_fields, token_text, ChoiceState, ChunkParts};

/// A completion choice's `logprobs` (the legacy completions shape).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct CompletionLogprobs {
    /// Each token's text.
    pub tokens: Vec<String>,
    /// Each token's log-probability.
    pub token_logprobs: Vec<f32>,
    /// The most likely alternatives at each position, text to log-probability.
    pub top_logprobs: Vec<BTreeMap<String, f32>>,
    /// Character offset of each token in the choice's text.
    pub text_offset: Vec<usize>,
}

/// A completion choice.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CompletionChoice {
    /// Position among all choices (prompt * n + sample).
    pub index: usize,
    /// The text (with the prompt first under `echo`).
    pub text: String,
    /// Log-probabilities, when asked for.
    pub logprobs: Option<CompletionLogprobs>,
    /// `stop` or `length`; null until the last chunk of a stream.
    pub finish_reason: Option<&'static str>,
    /// The stop string or token id that ended the choice.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<serde_json::Value>,
}

/// Log-probabilities in the completions shape; offsets start at `offset` characters.
pub fn completion_logprobs(
    tokenizer: &ModelTokenizer,
    logprobs: &[TokenLogprob],
    mut offset: usize,
) -> CompletionLogprobs {
    let mut out = CompletionLogprobs::default();
    for lp in logprobs {
        let text = token_text(tokenizer, lp.token_id);
        out.text_offset.push(offset);
        offset += text.chars().count();
        out.tokens.push(text);
        out.token_logprobs.push(lp.logprob);
        let top: BTreeMap<String, f32> = lp
            .top
            .iter()
            .map(|&(id, l)| (token_text(tokenizer, id), l))
            .collect();
        out.top_logprobs.push(top);
    }
    out
}

/// Choice `index` of a whole response, `prefix` (the echoed prompt) before its text.
pub fn choice(
    index: usize,
    c: &ChoiceState,
    prefix: String,
    tokenizer: &ModelTokenizer,
    want_logprobs: bool,
) -> CompletionChoice {
    let (finish_reason, stop_reason) = finish_fields(c.finish.as_ref());
    CompletionChoice {
        index,
        logprobs: want_logprobs
            .then(|| completion_logprobs(tokenizer, &c.logprobs, prefix.chars().count())),
        text: prefix + &c.text,
        finish_reason,
        stop_reason,
    }
}

/// The choice of one stream chunk, with its `finish_reason` and `stop_reason`.
pub fn chunk_choice(
    tokenizer: &ModelTokenizer,
    parts: ChunkParts<'_>,
    (finish_reason, stop_reason): (Option<&'static str>, Option<serde_json::Value>),
) -> CompletionChoice {
    CompletionChoice {
        index: parts.index,
        logprobs: parts
            .logprobs
            .map(|l| completion_logprobs(tokenizer, l, parts.offset)),
        text: parts.text,
        finish_reason,
        stop_reason,
    }
}
