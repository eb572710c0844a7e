//! What goes into the engine and what comes out: a [`Request`] (prompt token ids, sampling
//! parameters, stop conditions, `n`), validated in the caller's thread before it is queued,
//! and the [`Event`]s streamed back per request (text and tokens, then a finish per sample).

use std::sync::Arc;

use crate::constraint::{ConstraintSpec, ThinkingSpec, MAX_THINKING_MARKER_BYTES};
use crate::sampler::SamplingParams;
pub use crate::sampler::TokenLogprob;
use crate::spec::coordinator::SourceTotals;
use crate::spec::{SpecMethod, SpecRequest};
use crate::validation::invalid;
pub use crate::validation::InvalidRequest;

/// Most draft tokens a request may ask for per step.
pub const MAX_DRAFT_TOKENS: usize = 256;

/// When a sample stops.
#[derive(Debug, Clone, PartialEq)]
pub struct StopConditions {
    /// Output tokens at most.
    pub max_tokens: usize,
    /// Output tokens before any stop condition may end the sample (EOS and stop tokens are
    /// suppressed until then).
    pub min_tokens: usize,
    /// Token ids that end the sample (not emitted as text).
    pub stop_token_ids: Vec<u32>,
    /// Strings that end the sample when they appear in the output text (not emitted).
    pub stop: Vec<String>,
    /// Keep going past the model's end-of-sequence tokens.
    pub ignore_eos: bool,
    /// Leave the model's special tokens out of the text (vLLM's `skip_special_tokens`; a
    /// tool-call format marked by one, such as Mistral's `[TOOL_CALLS]`, needs them in).
    pub skip_special_tokens: bool,
}

impl Default for StopConditions {
    fn default() -> Self {
        Self {
            max_tokens: 16,
            min_tokens: 0,
            stop_token_ids: Vec::new(),
            stop: Vec::new(),
            ignore_eos: false,
            skip_special_tokens: true,
        }
    }
}

/// Most stop strings one request may carry.
pub const MAX_STOP_STRINGS: usize = 16;
/// Longest stop string, in bytes.
pub const MAX_STOP_STRING_BYTES: usize = 256;

/// One generation request.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Request {
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// How tokens are chosen.
    pub sampling: SamplingParams,
    /// When each sample stops.
    pub stop: StopConditions,
    /// Samples of this prompt (they share its KV).
    pub n: usize,
    /// Speculation for this request (the engine's default when absent).
    pub speculation: Option<SpecRequest>,
    /// A format the output must follow (`response_format`); none when absent.
    pub constraint: Option<ConstraintSpec>,
    /// A thinking phase before the answer (a reasoning model's): its budget is enforced,
    /// and `constraint` applies to the answer after it.
    pub thinking: Option<ThinkingSpec>,
    /// What the client expects the output to be, tokenized (OpenAI's `prediction`): drafted
    /// from first under every speculation method but `none`. Output is the same with or
    /// without it; only its speed changes. At most the model's length.
    pub prediction: Option<Arc<[u32]>>,
    /// vLLM's `cache_salt`: the request reads cached prompt blocks (the model's, and a draft
    /// model's) and drafts from a Token Recycling matrix taught only by requests with the
    /// same salt, or by requests without one when it has none. Non-empty, at most
    /// `MAX_CACHE_SALT_BYTES`.
    pub cache_salt: Option<Arc<str>>,
    /// What to read off the prompt's last token instead of generating (an embedding, or
    /// some of its logits): the request then ends after its prompt with one
    /// [`Event::Pooled`], and neither drafts nor samples.
    pub pooling: Option<Pooling>,
}

/// What a pooling request reads off its prompt's last token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pooling {
    /// The final-normed state (a decoder's last-token embedding, not normalized).
    State,
    /// The logits of these tokens, in this order (a reranker's `no` and `yes`).
    Logits(Arc<[u32]>),
}

/// Longest cache salt, in bytes.
pub const MAX_CACHE_SALT_BYTES: usize = 1024;

/// Why a sample ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// The model produced an end-of-sequence token.
    Eos,
    /// A stop token id was produced.
    StopToken(u32),
    /// A stop string appeared in the text.
    StopString(String),
    /// `max_tokens` or the model length was reached.
    Length,
}

impl FinishReason {
    /// The OpenAI `finish_reason`: `stop` or `length`.
    pub fn as_openai(&self) -> &'static str {
        match self {
            FinishReason::Length => "length",
            _ => "stop",
        }
    }
}

/// Token counts of a finished sample.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens of this sample.
    pub completion_tokens: usize,
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: usize,
    /// Verification steps that had draft tokens.
    pub spec_steps: usize,
    /// Draft tokens verified.
    pub draft_tokens: usize,
    /// Draft tokens accepted.
    pub accepted_tokens: usize,
    /// The same per draft source (`SpecMethod::Prediction` for the request's prediction).
    pub sources: Vec<SourceTotals>,
}

impl Usage {
    /// Draft tokens from the request's prediction that verification accepted.
    pub fn accepted_prediction_tokens(&self) -> usize {
        self.source(SpecMethod::Prediction).accepted
    }

    /// Draft tokens from the request's prediction that verification rejected.
    pub fn rejected_prediction_tokens(&self) -> usize {
        let p = self.source(SpecMethod::Prediction);
        p.drafted - p.accepted
    }

    /// `method`'s part of the speculation counts.
    pub fn source(&self, method: SpecMethod) -> SourceTotals {
        self.sources
            .iter()
            .find(|s| s.method == method)
            .copied()
            .unwrap_or(SourceTotals::none(method))
    }
}

/// What the engine streams back for a request.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// New output of sample `index`: tokens, and the text that is now safe to show (text
    /// can lag tokens: an incomplete UTF-8 character or a possible stop string is held back).
    Output {
        /// Which of the `n` samples.
        index: usize,
        /// New token ids.
        token_ids: Vec<u32>,
        /// New text.
        text: String,
        /// Log-probabilities of the new tokens, when asked for.
        logprobs: Vec<TokenLogprob>,
    },
    /// Sample `index` ended; no more output for it follows.
    Finished {
        /// Which of the `n` samples.
        index: usize,
        /// Why.
        reason: FinishReason,
        /// Its token counts.
        usage: Usage,
    },
    /// A pooling request's answer ([`Request::pooling`]); nothing follows.
    Pooled {
        /// The state, or the logits asked for.
        values: Vec<f32>,
        /// Its token counts (no completion tokens).
        usage: Usage,
    },
    /// The request failed; nothing follows.
    Error(Failure),
}

/// Why a request failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// What went wrong.
    pub message: String,
    /// Whether the request's own output format failed it (a format that compiled but
    /// exceeded the grammar engine's limits later on): the client's error, which another
    /// try or another replica would meet again. Otherwise the engine failed it.
    pub format: bool,
}

impl Failure {
    /// A failure of the engine's (shutting down, no room, an internal error).
    pub fn engine(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            format: false,
        }
    }

    /// A failure for `error`: the output format's when it is [`crate::Error::FormatFailed`].
    pub fn from_error(error: &crate::Error) -> Self {
        Self {
            message: error.to_string(),
            format: matches!(error, crate::Error::FormatFailed(_)),
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// Limits a request is validated against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestLimits {
    /// Logits per row.
    pub vocab_size: usize,
    /// Prompt plus output tokens at most.
    pub max_model_len: usize,
    /// Largest `n`.
    pub max_n: usize,
    /// The speculation methods the engine can draft with (besides `none`).
    pub methods: Vec<SpecMethod>,
}

/// An error naming `field` unless every one of `ids` is a token of a vocabulary of `vocab`.
fn in_vocabulary(field: &'static str, ids: &[u32], vocab: usize) -> Result<(), InvalidRequest> {
    match ids.iter().find(|&&t| t as usize >= vocab) {
        Some(bad) => Err(invalid(
            field,
            format!("token id {bad} outside the vocabulary of {vocab}"),
        )),
        None => Ok(()),
    }
}

impl Request {
    /// One greedy sample of at most `max_tokens` tokens after `prompt`, speculating as
    /// `method` asks (the engine's default when `None`), no format.
    pub fn greedy(prompt: Vec<u32>, max_tokens: usize, method: Option<SpecMethod>) -> Self {
        Self {
            prompt,
            sampling: SamplingParams::greedy(),
            stop: StopConditions {
                max_tokens,
                ..StopConditions::default()
            },
            n: 1,
            speculation: method.map(|method| SpecRequest {
                method,
                max_draft_tokens: None,
            }),
            constraint: None,
            thinking: None,
            prediction: None,
            cache_salt: None,
            pooling: None,
        }
    }

    /// A request for `pooling` of `prompt`: one sequence, no drafting.
    pub fn pooling(prompt: Vec<u32>, pooling: Pooling) -> Self {
        Self {
            pooling: Some(pooling),
            speculation: Some(SpecRequest {
                method: SpecMethod::None,
                max_draft_tokens: None,
            }),
            ..Self::greedy(prompt, 1, None)
        }
    }

    /// A pooling request reads its prompt and nothing else: one sample, no format, no
    /// prediction, logits of tokens in the vocabulary.
    fn validate_pooling(
        &self,
        pooling: &Pooling,
        limits: &RequestLimits,
    ) -> Result<(), InvalidRequest> {
        if self.n != 1 {
            return Err(invalid("n", "a pooling request has one sample"));
        }
        if self.constraint.is_some() || self.thinking.is_some() {
            return Err(invalid(
                "response_format",
                "a pooling request generates nothing to format",
            ));
        }
        if self.prediction.is_some() {
            return Err(invalid(
                "prediction",
                "a pooling request generates nothing to predict",
            ));
        }
        if let Pooling::Logits(ids) = pooling {
            if ids.is_empty() {
                return Err(invalid("pooling", "no token's logit asked for"));
            }
            in_vocabulary("pooling", ids, limits.vocab_size)?;
        }
        Ok(())
    }

    /// The prefix-cache scope of the request's cache salt (`None` without one).
    pub fn cache_scope(&self) -> Option<kvcache::BlockHash> {
        self.cache_salt
            .as_deref()
            .map(|salt| kvcache::BlockHash::scope(salt.as_bytes()))
    }

    /// Checks every field against `limits`; the first problem is returned.
    pub fn validate(&self, limits: &RequestLimits) -> Result<(), InvalidRequest> {
        if self.prompt.is_empty() {
            return Err(invalid("prompt", "the prompt has no tokens"));
        }
        in_vocabulary("prompt", &self.prompt, limits.vocab_size)?;
        if self.prompt.len() >= limits.max_model_len {
            return Err(invalid(
                "prompt",
                format!(
                    "the prompt has {} tokens; the model length is {} including at least one generated token",
                    self.prompt.len(),
                    limits.max_model_len
                ),
            ));
        }
        if let Some(prediction) = &self.prediction {
            if prediction.len() > limits.max_model_len {
                return Err(invalid(
                    "prediction",
                    format!(
                        "the prediction has {} tokens; this model's maximum length is {} tokens",
                        prediction.len(),
                        limits.max_model_len
                    ),
                ));
            }
            in_vocabulary("prediction", prediction, limits.vocab_size)?;
        }
        if let Some(thinking) = &self.thinking {
            let markers = [Some(&thinking.end), thinking.start.as_ref()];
            for marker in markers.into_iter().flatten() {
                if marker.is_empty() || marker.len() > MAX_THINKING_MARKER_BYTES {
                    return Err(invalid(
                        "thinking",
                        format!("start and end strings are 1 to {MAX_THINKING_MARKER_BYTES} bytes"),
                    ));
                }
            }
        }
        if let Some(salt) = &self.cache_salt {
            if salt.is_empty() {
                return Err(invalid("cache_salt", "must be a non-empty string"));
            }
            if salt.len() > MAX_CACHE_SALT_BYTES {
                return Err(invalid(
                    "cache_salt",
                    format!("at most {MAX_CACHE_SALT_BYTES} bytes"),
                ));
            }
        }
        if let Some(pooling) = &self.pooling {
            self.validate_pooling(pooling, limits)?;
        }
        if self.n == 0 || self.n > limits.max_n {
            return Err(invalid(
                "n",
                format!("must be between 1 and {}", limits.max_n),
            ));
        }
        let stop = &self.stop;
        if stop.max_tokens == 0 {
            return Err(invalid("max_tokens", "must be at least 1"));
        }
        if stop.min_tokens > stop.max_tokens {
            return Err(invalid("min_tokens", "must not exceed max_tokens"));
        }
        if stop.stop.len() > MAX_STOP_STRINGS {
            return Err(invalid(
                "stop",
                format!("at most {MAX_STOP_STRINGS} stop strings"),
            ));
        }
        if stop.stop.iter().any(String::is_empty) {
            return Err(invalid("stop", "stop strings must not be empty"));
        }
        if stop.stop.iter().any(|s| s.len() > MAX_STOP_STRING_BYTES) {
            return Err(invalid(
                "stop",
                format!("stop strings are at most {MAX_STOP_STRING_BYTES} bytes"),
            ));
        }
        if let Some(bad) = stop
            .stop_token_ids
            .iter()
            .find(|&&t| t as usize >= limits.vocab_size)
        {
            return Err(invalid(
                "stop_token_ids",
                format!("token id {bad} outside the vocabulary"),
            ));
        }
        if let Some(spec) = &self.speculation {
            let known = spec.method == SpecMethod::None || limits.methods.contains(&spec.method);
            if !known && spec.method == SpecMethod::DraftModel {
                return Err(invalid(
                    "speculation.method",
                    "draft_model needs an engine started with a draft model (--draft-model)",
                ));
            }
            if !known {
                return Err(invalid(
                    "speculation.method",
                    format!("this engine has no method '{}'", spec.method.as_str()),
                ));
            }
            if spec.max_draft_tokens.is_some_and(|n| n > MAX_DRAFT_TOKENS) {
                return Err(invalid(
                    "speculation.max_draft_tokens",
                    format!("at most {MAX_DRAFT_TOKENS}"),
                ));
            }
        }
        self.sampling.validate(limits.vocab_size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> RequestLimits {
        RequestLimits {
            vocab_size: 100,
            max_model_len: 10,
            max_n: 4,
            methods: vec![SpecMethod::Recycling, SpecMethod::Auto],
        }
    }

    fn request() -> Request {
        Request {
            prompt: vec![1, 2, 3],
            n: 1,
            ..Request::default()
        }
    }

    #[test]
    fn each_bad_field_is_named() {
        assert_eq!(request().validate(&limits()), Ok(()));
        let cases: Vec<(&str, Request)> = vec![
            (
                "prompt",
                Request {
                    prompt: vec![],
                    ..request()
                },
            ),
            (
                "prompt",
                Request {
                    prompt: vec![100],
                    ..request()
                },
            ),
            (
                "prompt",
                Request {
                    prompt: vec![1; 10],
                    ..request()
                },
            ),
            ("n", Request { n: 5, ..request() }),
            ("n", Request { n: 0, ..request() }),
            (
                "max_tokens",
                Request {
                    stop: StopConditions {
                        max_tokens: 0,
                        ..StopConditions::default()
                    },
                    ..request()
                },
            ),
            (
                "min_tokens",
                Request {
                    stop: StopConditions {
                        min_tokens: 17,
                        ..StopConditions::default()
                    },
                    ..request()
                },
            ),
            (
                "stop",
                Request {
                    stop: StopConditions {
                        stop: vec!["x".into(); 17],
                        ..StopConditions::default()
                    },
                    ..request()
                },
            ),
            (
                "stop",
                Request {
                    stop: StopConditions {
                        stop: vec![String::new()],
                        ..StopConditions::default()
                    },
                    ..request()
                },
            ),
            (
                "stop_token_ids",
                Request {
                    stop: StopConditions {
                        stop_token_ids: vec![1000],
                        ..StopConditions::default()
                    },
                    ..request()
                },
            ),
            (
                "temperature",
                Request {
                    sampling: SamplingParams {
                        temperature: f32::NAN,
                        ..SamplingParams::default()
                    },
                    ..request()
                },
            ),
            (
                "speculation.method",
                Request {
                    speculation: Some(SpecRequest {
                        method: SpecMethod::DraftModel,
                        max_draft_tokens: None,
                    }),
                    ..request()
                },
            ),
            (
                "speculation.method",
                Request {
                    speculation: Some(SpecRequest {
                        method: SpecMethod::Named("medusa"),
                        max_draft_tokens: None,
                    }),
                    ..request()
                },
            ),
        ];
        for (field, case) in cases {
            assert_eq!(
                case.validate(&limits()).unwrap_err().field,
                field,
                "{case:?}"
            );
        }
    }
}
