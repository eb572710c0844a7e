//! Request settings: a validated request body turned into engine requests. The sampling
//! parameters, stop conditions, `n`, speculation, output format ([`output_format`]),
//! prediction ([`prediction`]) and cache salt of every prompt, checked against the engine's
//! limits (prompt plus `max_tokens` within the model length), with a 400 naming the field for
//! every value thicket cannot honour; and what the response needs to know besides
//! ([`ResponseOptions`]).

pub mod fields;
pub mod output_format;
pub mod prediction;
pub mod template;

use std::sync::Arc;

use engine::constraint::{ConstraintSpec, ThinkingSpec};
use engine::request::RequestLimits;
use engine::{Request, SamplingParams, SpecMethod, SpecRequest, StopConditions};

use self::fields::CommonFields;
use self::output_format::structured_outputs;
use crate::server::error::{ApiError, ApiResult};
use crate::server::reasoning::Reasoning;

/// Default `max_tokens` of `/v1/completions` (OpenAI's).
pub const DEFAULT_COMPLETION_TOKENS: usize = 16;

/// What the response needs to know about the request besides the engine requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponseOptions {
    /// Choices per prompt.
    pub n: usize,
    /// Stream server-sent events.
    pub stream: bool,
    /// Send a usage chunk at the end of a stream.
    pub include_usage: bool,
    /// Return log-probabilities.
    pub logprobs: bool,
    /// Read chat answers for tool calls.
    pub tool_calls: bool,
    /// The field the output format came from, named when the format fails mid-way.
    pub format_field: &'static str,
    /// How chat answers are split into thinking and answer (`--reasoning-parser`).
    pub reasoning: Option<Reasoning>,
}

/// Per-request settings, before the prompt is known.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Sampling.
    pub sampling: SamplingParams,
    /// Stop conditions (`max_tokens` still to be resolved per prompt).
    pub stop: StopConditions,
    /// `max_tokens` as given.
    pub max_tokens: Option<usize>,
    /// Speculation.
    pub speculation: Option<SpecRequest>,
    /// A format the output must follow.
    pub constraint: Option<ConstraintSpec>,
    /// The field it came from (`structured_outputs` or `response_format`), for errors.
    pub constraint_field: &'static str,
    /// The prediction's text (`prediction`), tokenized by [`Settings::predict`].
    pub prediction_text: Option<String>,
    /// The prediction, tokenized; `None` when there is none or it is empty.
    pub prediction: Option<Arc<[u32]>>,
    /// The cache salt (`cache_salt`).
    pub cache_salt: Option<Arc<str>>,
    /// The thinking phase the engine follows (a budget, or a format for the answer after
    /// it), set once the prompt is rendered.
    pub thinking: Option<ThinkingSpec>,
    /// How to respond.
    pub options: ResponseOptions,
}

/// Reads the shared fields; `top_logprobs` is `Some(k)` when log-probabilities are wanted.
pub fn settings(
    common: &CommonFields,
    max_tokens: Option<usize>,
    top_logprobs: Option<usize>,
    limits: &RequestLimits,
) -> ApiResult<Settings> {
    let n = common.n.unwrap_or(1);
    if n == 0 || n > limits.max_n {
        return Err(ApiError::invalid(
            "n",
            format!("must be between 1 and {}", limits.max_n),
        ));
    }
    let top_k = match common.top_k {
        None | Some(-1) | Some(0) => None,
        Some(k) if k > 0 => Some(usize::try_from(k).unwrap_or(usize::MAX)),
        Some(_) => {
            return Err(ApiError::invalid(
                "top_k",
                "must be positive, or -1 / 0 to disable",
            ))
        }
    };
    let seed = match common.seed {
        None => None,
        Some(s) => {
            Some(u64::try_from(s).map_err(|_| ApiError::invalid("seed", "must not be negative"))?)
        }
    };
    let mut logit_bias = Vec::new();
    for (key, &bias) in common.logit_bias.iter().flatten() {
        let token: u32 = key.parse().map_err(|_| {
            ApiError::invalid("logit_bias", format!("keys must be token ids, got {key:?}"))
        })?;
        logit_bias.push((token, bias));
    }
    let sampling = SamplingParams {
        temperature: common.temperature.unwrap_or(1.0),
        top_k,
        top_p: common.top_p.unwrap_or(1.0),
        min_p: common.min_p.unwrap_or(0.0),
        presence_penalty: common.presence_penalty.unwrap_or(0.0),
        frequency_penalty: common.frequency_penalty.unwrap_or(0.0),
        repetition_penalty: common.repetition_penalty.unwrap_or(1.0),
        logit_bias,
        seed,
        logprobs: top_logprobs,
    };
    sampling.validate(limits.vocab_size)?;
    let stop = StopConditions {
        max_tokens: 0,
        min_tokens: common.min_tokens.unwrap_or(0),
        stop_token_ids: common.stop_token_ids.clone().unwrap_or_default(),
        stop: common
            .stop
            .clone()
            .map(|s| s.into_vec())
            .unwrap_or_default(),
        ignore_eos: common.ignore_eos.unwrap_or(false),
        skip_special_tokens: common.skip_special_tokens.unwrap_or(true),
    };
    if max_tokens == Some(0) {
        return Err(ApiError::invalid("max_tokens", "must be at least 1"));
    }
    let speculation = common
        .speculation
        .as_ref()
        .map(|s| -> ApiResult<SpecRequest> {
            let method = match &s.method {
                None => SpecMethod::Auto,
                Some(name) => SpecMethod::parse(name)
                    .or_else(|| {
                        // Methods an embedding program registered, by their names.
                        limits.methods.iter().copied().find(|m| m.as_str() == name)
                    })
                    .ok_or_else(|| {
                        ApiError::invalid(
                            "speculation.method",
                            format!(
                                "unknown method {name:?}: use suffix, recycling, ngram_trie, prompt_lookup, draft_model, auto or none"
                            ),
                        )
                    })?,
            };
            Ok(SpecRequest {
                method,
                max_draft_tokens: s.max_draft_tokens,
            })
        })
        .transpose()?;
    let stream = common.stream.unwrap_or(false);
    let include_usage = common
        .stream_options
        .as_ref()
        .and_then(|o| o.include_usage)
        .unwrap_or(false);
    if common.stream_options.is_some() && !stream {
        return Err(ApiError::invalid(
            "stream_options",
            "only allowed when stream is true",
        ));
    }
    Ok(Settings {
        sampling,
        stop,
        max_tokens,
        speculation,
        constraint: structured_outputs(common.structured_outputs.as_ref())?,
        constraint_field: "structured_outputs",
        prediction_text: prediction::prediction(common.prediction.as_ref())?,
        prediction: None,
        cache_salt: cache_salt(common.cache_salt.as_ref())?,
        thinking: None,
        options: ResponseOptions {
            n,
            stream,
            include_usage,
            logprobs: top_logprobs.is_some(),
            tool_calls: false,
            format_field: "structured_outputs",
            reasoning: None,
        },
    })
}

/// `cache_salt` as given: a string (its length is checked with the rest of the request, by
/// `Request::validate`), or none.
fn cache_salt(value: Option<&serde_json::Value>) -> ApiResult<Option<Arc<str>>> {
    match value {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(s)) => Ok(Some(Arc::from(s.as_str()))),
        Some(_) => Err(ApiError::invalid(
            "cache_salt",
            "must be a non-empty string",
        )),
    }
}

impl Settings {
    /// The engine request for one tokenized prompt; `default_max_tokens` applies when the
    /// body has none (`None`: up to the model length).
    pub fn request(
        &self,
        prompt: Vec<u32>,
        default_max_tokens: Option<usize>,
        limits: &RequestLimits,
    ) -> ApiResult<Request> {
        if prompt.is_empty() {
            return Err(ApiError::invalid("prompt", "the prompt is empty"));
        }
        let room = limits.max_model_len.saturating_sub(prompt.len());
        if room == 0 {
            return Err(ApiError::invalid(
                "prompt",
                format!(
                    "the prompt has {} tokens; this model's maximum length is {} tokens including the output",
                    prompt.len(),
                    limits.max_model_len
                ),
            ));
        }
        let max_tokens = match (self.max_tokens, default_max_tokens) {
            (Some(m), _) => {
                // `m > room`, not `prompt + m > max`: a huge `m` must not overflow.
                if m > room {
                    return Err(ApiError::invalid(
                        "max_tokens",
                        format!(
                            "the prompt ({} tokens) plus max_tokens ({m}) is more than this model's maximum length of {} tokens",
                            prompt.len(),
                            limits.max_model_len
                        ),
                    ));
                }
                m
            }
            (None, Some(d)) => d.min(room),
            (None, None) => room,
        };
        let request = Request {
            prompt,
            sampling: self.sampling.clone(),
            stop: StopConditions {
                max_tokens,
                ..self.stop.clone()
            },
            n: self.options.n,
            speculation: self.speculation,
            constraint: self.constraint.clone(),
            thinking: self.thinking.clone(),
            prediction: self.prediction.clone(),
            cache_salt: self.cache_salt.clone(),
            pooling: None,
        };
        request.validate(limits)?;
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> RequestLimits {
        RequestLimits {
            vocab_size: 100,
            max_model_len: 32,
            max_n: 4,
            methods: vec![SpecMethod::NgramTrie, SpecMethod::Named("echo")],
        }
    }

    fn param_of(e: ApiError) -> String {
        e.param.unwrap_or_default()
    }

    #[test]
    fn fields_map_onto_the_engine_request() {
        let common: CommonFields = serde_json::from_value(serde_json::json!({
            "n": 2, "temperature": 0.5, "top_k": -1, "top_p": 0.9, "seed": 7,
            "logit_bias": {"5": 3.0}, "stop": "END", "speculation": {"method": "ngram_trie"}
        }))
        .unwrap();
        let s = settings(&common, Some(8), None, &limits()).unwrap();
        let r = s.request(vec![1, 2, 3], None, &limits()).unwrap();
        assert_eq!(r.n, 2);
        assert_eq!(r.sampling.top_k, None);
        assert_eq!(r.sampling.seed, Some(7));
        assert_eq!(r.sampling.logit_bias, vec![(5, 3.0)]);
        assert_eq!(r.stop.stop, vec!["END".to_string()]);
        assert_eq!(r.stop.max_tokens, 8);
        assert_eq!(r.speculation.map(|s| s.method), Some(SpecMethod::NgramTrie));
        // A method the engine registered is found by its name.
        let named: CommonFields =
            serde_json::from_value(serde_json::json!({"speculation": {"method": "echo"}})).unwrap();
        let s = settings(&named, Some(8), None, &limits()).unwrap();
        let r = s.request(vec![1, 2, 3], None, &limits()).unwrap();
        assert_eq!(
            r.speculation.map(|s| s.method),
            Some(SpecMethod::Named("echo"))
        );
        // Without max_tokens the output may fill the model length.
        let s = settings(&common, None, None, &limits()).unwrap();
        assert_eq!(
            s.request(vec![1; 30], None, &limits())
                .unwrap()
                .stop
                .max_tokens,
            2
        );
        assert_eq!(
            s.request(vec![1; 3], Some(16), &limits())
                .unwrap()
                .stop
                .max_tokens,
            16
        );
    }

    #[test]
    fn bad_values_name_their_field() {
        let cases = [
            (serde_json::json!({"n": 0}), "n"),
            (serde_json::json!({"n": 5}), "n"),
            (serde_json::json!({"temperature": 3.0}), "temperature"),
            (serde_json::json!({"top_p": 0.0}), "top_p"),
            (serde_json::json!({"top_k": -3}), "top_k"),
            (serde_json::json!({"seed": -1}), "seed"),
            (serde_json::json!({"logit_bias": {"x": 1.0}}), "logit_bias"),
            (
                serde_json::json!({"logit_bias": {"500": 1.0}}),
                "logit_bias",
            ),
            (
                serde_json::json!({"speculation": {"method": "magic"}}),
                "speculation.method",
            ),
            (
                serde_json::json!({"stream_options": {"include_usage": true}}),
                "stream_options",
            ),
        ];
        for (body, field) in cases {
            let common: CommonFields = serde_json::from_value(body.clone()).unwrap();
            let e = settings(&common, None, None, &limits()).unwrap_err();
            assert_eq!(param_of(e), field, "{body}");
        }
        let ok: CommonFields = serde_json::from_value(serde_json::json!({})).unwrap();
        let s = settings(&ok, Some(10), None, &limits()).unwrap();
        let e = s.request(vec![1; 30], None, &limits()).unwrap_err();
        assert_eq!(param_of(e), "max_tokens");
        // A max_tokens near usize::MAX must not wrap around past the length check.
        let huge = settings(&ok, Some(usize::MAX), None, &limits()).unwrap();
        let e = huge.request(vec![1; 3], None, &limits()).unwrap_err();
        assert_eq!(param_of(e), "max_tokens");
        let e = s.request(vec![1; 32], None, &limits()).unwrap_err();
        assert_eq!(param_of(e), "prompt");
        let e = s.request(vec![100], None, &limits()).unwrap_err();
        assert_eq!(param_of(e), "prompt");
        assert_eq!(
            param_of(settings(&ok, Some(0), None, &limits()).unwrap_err()),
            "max_tokens"
        );
    }
}
