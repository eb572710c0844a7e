//! The pooling routes, served by an encoder beside (or instead of) generation:
//! `/v1/embeddings` (OpenAI's shape, in [`embeddings`]), `/v1/rerank`, `/rerank` and
//! `/v2/rerank` (the Cohere / Jina shape vLLM and llama.cpp take) and `/v1/score` (vLLM's),
//! both in [`rerank`]. What they share lives here: reading `truncate_prompt_tokens`, turning
//! texts and token ids into encoder inputs with errors that name the field, running a job on
//! the encoder and mapping its failures to HTTP, and a pair's relevance score (the cosine of
//! two embeddings for a bi-encoder, the sigmoid of a cross-encoder's logit).

pub mod embeddings;
pub mod rerank;

use engine::encoder::pooling::cosine;
use engine::encoder::{EncodeError, EncoderHandle, EncoderInput, EncoderTask};
use serde_json::Value;

use super::error::{ApiError, ApiResult};

/// Most inputs one request may carry (OpenAI's limit for embeddings).
pub const MAX_INPUTS: usize = 2048;

/// `truncate_prompt_tokens`: absent (refuse over-long inputs), `-1` (the model's limit) or a
/// positive count no larger than it.
pub fn truncation(value: Option<&Value>, encoder: &EncoderHandle) -> ApiResult<Option<usize>> {
    const FIELD: &str = "truncate_prompt_tokens";
    let limit = encoder.tokenizer().max_length();
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_i64() {
            Some(-1) => Ok(Some(limit)),
            Some(n) if n >= 1 && (n as u64) <= limit as u64 => Ok(Some(n as usize)),
            Some(n) if n >= 1 => Err(ApiError::invalid(
                FIELD,
                format!(
                    "truncate_prompt_tokens {n} is more than the {limit} tokens this model reads"
                ),
            )),
            _ => Err(ApiError::invalid(
                FIELD,
                "truncate_prompt_tokens must be -1 (the model's limit) or a positive integer",
            )),
        },
    }
}

/// `instruction`: absent, or a non-empty string for a model that reads pairs under one (a
/// decoder reranker's template).
pub fn instruction<'a>(
    value: Option<&'a Value>,
    encoder: &EncoderHandle,
) -> ApiResult<Option<&'a str>> {
    const FIELD: &str = "instruction";
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => {
            Err(ApiError::invalid(FIELD, "instruction is an empty string"))
        }
        Some(Value::String(_)) if !encoder.tokenizer().takes_instruction() => {
            Err(ApiError::invalid(
                FIELD,
                "this model reads pairs as they are and takes no instruction (a decoder \
                 reranker's template does)",
            ))
        }
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(ApiError::invalid(FIELD, "instruction must be a string")),
    }
}

/// One text input, tokenized with the model's special tokens; `field` names it in errors.
pub fn text_input(
    encoder: &EncoderHandle,
    text: &str,
    truncate: Option<usize>,
    field: &str,
) -> ApiResult<EncoderInput> {
    if text.is_empty() {
        return Err(ApiError::invalid(
            field,
            format!("{field} is an empty string"),
        ));
    }
    encoder
        .tokenizer()
        .text(text, truncate)
        .map_err(|e| ApiError::invalid(field, format!("{field}: {e}")))
}

/// A list of strings: a JSON array whose items are all non-empty strings, at most
/// [`MAX_INPUTS`] of them, at least one.
pub fn strings(value: &Value, field: &str) -> ApiResult<Vec<String>> {
    let Value::Array(items) = value else {
        return Err(ApiError::invalid(
            field,
            format!("{field} must be a list of strings"),
        ));
    };
    if items.is_empty() {
        return Err(ApiError::invalid(
            field,
            format!("{field} is an empty list"),
        ));
    }
    if items.len() > MAX_INPUTS {
        return Err(ApiError::invalid(
            field,
            format!(
                "{field} has {} items; at most {MAX_INPUTS} are accepted",
                items.len()
            ),
        ));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, item)| match item {
            Value::String(s) => Ok(s.clone()),
            // Cohere's older shape: a document as `{"text": ...}`.
            Value::Object(o) if o.get("text").is_some_and(Value::is_string) => Ok(o
                .get("text")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()),
            _ => Err(ApiError::invalid(
                format!("{field}[{i}]"),
                format!("{field}[{i}] must be a string"),
            )),
        })
        .collect()
}

/// Runs `inputs` on the encoder; a full queue is a 429, a stopped encoder a 503.
pub async fn run(encoder: &EncoderHandle, inputs: Vec<EncoderInput>) -> ApiResult<Vec<Vec<f32>>> {
    encoder.encode(inputs).await.map_err(|e| match e {
        EncodeError::Invalid(message) => ApiError::invalid("input", message),
        EncodeError::Overloaded(pending) => ApiError::overloaded(pending),
        EncodeError::Stopped(message) => {
            ApiError::unavailable(format!("the encoder stopped: {message}"))
        }
    })
}

/// Tokens across `inputs` (what `usage` reports).
pub fn token_count(inputs: &[EncoderInput]) -> usize {
    inputs.iter().map(|i| i.ids.len()).sum()
}

/// How pairs are scored by this model.
#[derive(Debug, Clone, Copy)]
pub enum Scorer {
    /// Embed both sides; the score is their cosine similarity.
    BiEncoder,
    /// Read each pair at once; the score is the sigmoid of the single logit.
    CrossEncoder,
}

impl Scorer {
    /// The scorer of `encoder`'s model, or a 400 for a classifier with several labels.
    pub fn of(encoder: &EncoderHandle) -> ApiResult<Self> {
        match encoder.task() {
            EncoderTask::Embed(_) => Ok(Self::BiEncoder),
            EncoderTask::Classify { labels: 1 } => Ok(Self::CrossEncoder),
            EncoderTask::Classify { labels } => Err(ApiError::invalid(
                "model",
                format!(
                    "the model classifies into {labels} labels; scoring needs one score per pair"
                ),
            )),
        }
    }
}

/// Scores each `(first, second)` pair (indices into `firsts` and `seconds`); returns the
/// scores and the tokens read.
pub async fn score_pairs(
    encoder: &EncoderHandle,
    firsts: &[String],
    seconds: &[String],
    pairs: &[(usize, usize)],
    (truncate, instruction): (Option<usize>, Option<&str>),
    (first_field, second_field): (&str, &str),
) -> ApiResult<(Vec<f32>, usize)> {
    match Scorer::of(encoder)? {
        Scorer::BiEncoder => {
            let mut inputs = Vec::with_capacity(firsts.len() + seconds.len());
            for (i, text) in firsts.iter().enumerate() {
                inputs.push(text_input(
                    encoder,
                    text,
                    truncate,
                    &indexed(first_field, i, firsts.len()),
                )?);
            }
            for (i, text) in seconds.iter().enumerate() {
                inputs.push(text_input(
                    encoder,
                    text,
                    truncate,
                    &indexed(second_field, i, seconds.len()),
                )?);
            }
            let tokens = token_count(&inputs);
            let vectors = run(encoder, inputs).await?;
            let (a, b) = vectors.split_at(firsts.len());
            Ok((
                pairs.iter().map(|&(i, j)| cosine(&a[i], &b[j])).collect(),
                tokens,
            ))
        }
        Scorer::CrossEncoder => {
            let mut inputs = Vec::with_capacity(pairs.len());
            for &(i, j) in pairs {
                let input = encoder
                    .tokenizer()
                    .pair_instructed(&firsts[i], &seconds[j], truncate, instruction)
                    .map_err(|e| {
                        let field = indexed(second_field, j, seconds.len());
                        ApiError::invalid(field.clone(), format!("{field}: {e}"))
                    })?;
                inputs.push(input);
            }
            let tokens = token_count(&inputs);
            let logits = run(encoder, inputs).await?;
            let scores = logits
                .iter()
                .map(|l| 1.0 / (1.0 + (-l.first().copied().unwrap_or(0.0)).exp()))
                .collect();
            Ok((scores, tokens))
        }
    }
}

/// `field[i]`, or `field` when it held one string.
fn indexed(field: &str, i: usize, len: usize) -> String {
    match len {
        1 => field.to_string(),
        _ => format!("{field}[{i}]"),
    }
}
