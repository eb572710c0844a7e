//! The bodies `/v1/completions` and `/v1/chat/completions` answer with, built from engine
//! events: one accumulator per choice (text, logprobs, finish reason, usage), the
//! whole-response objects of both endpoints, stream chunks, and the usage and `thicket`
//! speculation totals over every choice of a request. (The Responses API's objects are
//! `responses_api`'s.)

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use engine::request::TokenLogprob;
use engine::{FinishReason, ModelTokenizer, Usage};

use super::protocol::{
    ChatChoice, ChatChunkChoice, ChatDelta, ChatLogprobs, ChatMessageOut, ChatTokenLogprob,
    CompletionChoice, CompletionLogprobs, ResponseBody, Skip, SpeculationStats, ThicketBody,
    ToolCallDelta, UsageBody,
};
use super::tools::parse_calls;

/// Which endpoint a response belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/completions`.
    Completion,
    /// `/v1/chat/completions`.
    Chat,
}

impl Endpoint {
    fn id_prefix(self) -> &'static str {
        match self {
            Endpoint::Completion => "cmpl",
            Endpoint::Chat => "chatcmpl",
        }
    }
}

/// Identity shared by every chunk of one response.
#[derive(Debug, Clone)]
pub struct ResponseMeta {
    /// The endpoint.
    pub endpoint: Endpoint,
    /// `cmpl-...` / `chatcmpl-...`.
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    /// Served model name.
    pub model: String,
}

impl ResponseMeta {
    /// A fresh id for `endpoint`.
    pub fn new(endpoint: Endpoint, model: &str) -> Self {
        Self {
            endpoint,
            id: format!("{}-{:032x}", endpoint.id_prefix(), rand::random::<u128>()),
            created: unix_now(),
            model: model.to_string(),
        }
    }

    fn body<C>(&self, object: &'static str, choices: Vec<C>) -> ResponseBody<C> {
        ResponseBody {
            id: self.id.clone(),
            object,
            created: self.created,
            model: self.model.clone(),
            choices,
            usage: Skip::Absent,
            thicket: None,
        }
    }
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Everything one choice produced so far.
#[derive(Debug, Clone, Default)]
pub struct ChoiceState {
    /// Text (after the echoed prompt, if any).
    pub text: String,
    /// Log-probabilities of its tokens.
    pub logprobs: Vec<TokenLogprob>,
    /// Set once it ended.
    pub finish: Option<FinishReason>,
    /// Token counts, once it ended.
    pub usage: Usage,
}

/// `finish_reason` and `stop_reason` of a finished choice.
pub fn finish_fields(
    finish: Option<&FinishReason>,
) -> (Option<&'static str>, Option<serde_json::Value>) {
    match finish {
        None => (None, None),
        Some(reason) => {
            let stop_reason = match reason {
                FinishReason::StopString(s) => Some(serde_json::Value::from(s.clone())),
                FinishReason::StopToken(t) => Some(serde_json::Value::from(*t)),
                _ => None,
            };
            (Some(reason.as_openai()), stop_reason)
        }
    }
}

/// Usage and speculation totals over `choices`, with `n` choices per prompt (each prompt's
/// tokens are counted once).
pub fn totals(choices: &[ChoiceState], n: usize) -> (UsageBody, ThicketBody) {
    let mut usage = UsageBody::default();
    let mut spec = SpeculationStats::default();
    for (i, c) in choices.iter().enumerate() {
        if i % n.max(1) == 0 {
            usage.prompt_tokens += c.usage.prompt_tokens;
            usage.prompt_tokens_details.cached_tokens += c.usage.cached_tokens;
        }
        usage.completion_tokens += c.usage.completion_tokens;
        spec.verify_steps += c.usage.spec_steps;
        spec.draft_tokens += c.usage.draft_tokens;
        spec.accepted_tokens += c.usage.accepted_tokens;
        let details = &mut usage.completion_tokens_details;
        details.accepted_prediction_tokens += c.usage.accepted_prediction_tokens();
        details.rejected_prediction_tokens += c.usage.rejected_prediction_tokens();
        for source in &c.usage.sources {
            let totals = spec.sources.entry(source.method.as_str()).or_default();
            totals.verify_steps += source.steps;
            totals.draft_tokens += source.drafted;
            totals.accepted_tokens += source.accepted;
        }
    }
    usage.total_tokens = usage.prompt_tokens + usage.completion_tokens;
    // Every step yields one token plus the accepted drafts.
    let steps = usage.completion_tokens.saturating_sub(spec.accepted_tokens);
    spec.mean_accepted_tokens = if steps == 0 {
        0.0
    } else {
        usage.completion_tokens as f64 / steps as f64
    };
    (usage, ThicketBody { speculation: spec })
}

/// Text of one token (as the model would print it alone).
fn token_text(tokenizer: &ModelTokenizer, id: u32) -> String {
    tokenizer.decode(&[id]).unwrap_or_default()
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

/// Log-probabilities in the chat shape.
pub fn chat_logprobs(tokenizer: &ModelTokenizer, logprobs: &[TokenLogprob]) -> ChatLogprobs {
    let entry = |id: u32, logprob: f32, top: Option<Vec<ChatTokenLogprob>>| {
        let token = token_text(tokenizer, id);
        ChatTokenLogprob {
            bytes: token.as_bytes().to_vec(),
            token,
            logprob,
            top_logprobs: top,
        }
    };
    ChatLogprobs {
        content: logprobs
            .iter()
            .map(|lp| {
                let top = lp.top.iter().map(|&(id, l)| entry(id, l, None)).collect();
                entry(lp.token_id, lp.logprob, Some(top))
            })
            .collect(),
        refusal: None,
    }
}

/// The whole (non-streamed) response.
pub fn full_response(
    meta: &ResponseMeta,
    tokenizer: &ModelTokenizer,
    choices: &[ChoiceState],
    echo: &[Option<String>],
    n: usize,
    want_logprobs: bool,
    tool_calls: Option<&[String]>,
) -> serde_json::Value {
    let (usage, thicket) = totals(choices, n);
    let value = match meta.endpoint {
        Endpoint::Completion => {
            let list = choices
                .iter()
                .enumerate()
                .map(|(index, c)| {
                    let prefix = echo
                        .get(index / n.max(1))
                        .cloned()
                        .flatten()
                        .unwrap_or_default();
                    let (finish_reason, stop_reason) = finish_fields(c.finish.as_ref());
                    CompletionChoice {
                        index,
                        logprobs: want_logprobs.then(|| {
                            completion_logprobs(tokenizer, &c.logprobs, prefix.chars().count())
                        }),
                        text: prefix + &c.text,
                        finish_reason,
                        stop_reason,
                    }
                })
                .collect();
            let mut body = meta.body("text_completion", list);
            body.usage = Skip::Value(usage);
            body.thicket = Some(thicket);
            serde_json::to_value(body)
        }
        Endpoint::Chat => {
            let list = choices
                .iter()
                .enumerate()
                .map(|(index, c)| {
                    let (mut finish_reason, stop_reason) = finish_fields(c.finish.as_ref());
                    let (content, calls) = match tool_calls.map(|names| parse_calls(&c.text, names))
                    {
                        Some(Some((content, calls))) => {
                            if finish_reason == Some("stop") {
                                finish_reason = Some("tool_calls");
                            }
                            (content, calls)
                        }
                        _ => (Some(c.text.clone()), Vec::new()),
                    };
                    ChatChoice {
                        index,
                        message: ChatMessageOut {
                            role: "assistant",
                            content,
                            refusal: None,
                            tool_calls: calls,
                        },
                        logprobs: want_logprobs.then(|| chat_logprobs(tokenizer, &c.logprobs)),
                        finish_reason,
                        stop_reason,
                    }
                })
                .collect();
            let mut body = meta.body("chat.completion", list);
            body.usage = Skip::Value(usage);
            body.thicket = Some(thicket);
            serde_json::to_value(body)
        }
    };
    value.unwrap_or_default()
}

/// One stream chunk for choice `index`: new `text` (and its tokens' log-probabilities), the
/// chat role on a choice's first chunk, and the finish reason on its last.
pub struct ChunkParts<'a> {
    /// The choice.
    pub index: usize,
    /// New text.
    pub text: String,
    /// Log-probabilities of the new tokens, when asked for.
    pub logprobs: Option<&'a [TokenLogprob]>,
    /// Characters of this choice already sent (completions' text offsets).
    pub offset: usize,
    /// Send the assistant role (a chat choice's first chunk).
    pub role: bool,
    /// Set on the choice's last chunk.
    pub finish: Option<&'a FinishReason>,
    /// Tool-call pieces (chat).
    pub tool_calls: Option<Vec<ToolCallDelta>>,
    /// The choice called tools: a `stop` finish is reported as `tool_calls`.
    pub called: bool,
}

/// A stream chunk; `usage_null` adds `"usage": null` (streams with `include_usage`).
pub fn chunk(
    meta: &ResponseMeta,
    tokenizer: &ModelTokenizer,
    parts: ChunkParts<'_>,
    usage_null: bool,
) -> serde_json::Value {
    let (mut finish_reason, stop_reason) = finish_fields(parts.finish);
    if parts.called && finish_reason == Some("stop") {
        finish_reason = Some("tool_calls");
    }
    let usage = if usage_null { Skip::Null } else { Skip::Absent };
    let value = match meta.endpoint {
        Endpoint::Completion => {
            let choice = CompletionChoice {
                index: parts.index,
                logprobs: parts
                    .logprobs
                    .map(|l| completion_logprobs(tokenizer, l, parts.offset)),
                text: parts.text,
                finish_reason,
                stop_reason,
            };
            let mut body = meta.body("text_completion", vec![choice]);
            body.usage = usage;
            serde_json::to_value(body)
        }
        Endpoint::Chat => {
            let content = (parts.role || !parts.text.is_empty()).then_some(parts.text);
            let choice = ChatChunkChoice {
                index: parts.index,
                delta: ChatDelta {
                    role: parts.role.then_some("assistant"),
                    content,
                    tool_calls: parts.tool_calls,
                },
                logprobs: parts.logprobs.map(|l| chat_logprobs(tokenizer, l)),
                finish_reason,
                stop_reason,
            };
            let mut body = meta.body("chat.completion.chunk", vec![choice]);
            body.usage = usage;
            serde_json::to_value(body)
        }
    };
    value.unwrap_or_default()
}

/// The last chunk of a stream with `include_usage`: no choices, the totals.
pub fn usage_chunk(meta: &ResponseMeta, choices: &[ChoiceState], n: usize) -> serde_json::Value {
    let (usage, thicket) = totals(choices, n);
    let object = match meta.endpoint {
        Endpoint::Completion => "text_completion",
        Endpoint::Chat => "chat.completion.chunk",
    };
    let mut body = meta.body::<serde_json::Value>(object, Vec::new());
    body.usage = Skip::Value(usage);
    body.thicket = Some(thicket);
    serde_json::to_value(body).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn choice(prompt: usize, completion: usize, accepted: usize) -> ChoiceState {
        ChoiceState {
            usage: Usage {
                prompt_tokens: prompt,
                completion_tokens: completion,
                accepted_tokens: accepted,
                ..Usage::default()
            },
            ..ChoiceState::default()
        }
    }

    #[test]
    fn usage_counts_each_prompt_once_and_every_completion() {
        // Two prompts (5 and 7 tokens), two choices each.
        let choices = [
            choice(5, 4, 0),
            choice(5, 6, 3),
            choice(7, 2, 0),
            choice(7, 8, 0),
        ];
        let (usage, thicket) = totals(&choices, 2);
        assert_eq!(usage.prompt_tokens, 12);
        assert_eq!(usage.completion_tokens, 20);
        assert_eq!(usage.total_tokens, 32);
        // 20 tokens in 17 steps.
        assert!((thicket.speculation.mean_accepted_tokens - 20.0 / 17.0).abs() < 1e-9);
    }

    #[test]
    fn stop_reasons_are_reported() {
        let s = FinishReason::StopString("END".into());
        assert_eq!(finish_fields(Some(&s)), (Some("stop"), Some("END".into())));
        assert_eq!(
            finish_fields(Some(&FinishReason::Length)),
            (Some("length"), None)
        );
        assert_eq!(finish_fields(None), (None, None));
    }
}
