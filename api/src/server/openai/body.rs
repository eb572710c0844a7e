//! The envelope `/v1/completions` and `/v1/chat/completions` answer in, built from engine
//! events: one accumulator per choice (text, logprobs, finish reason, usage), the whole
//! response and the stream chunks with each endpoint's choices in them (built by
//! `completions::response` and `chat::response` / `chat::stream`), and the usage and
//! `thicket` speculation totals over every choice of a request. (The Responses API's objects
//! are `responses::response`'s.)

use crate::server::reasoning::Reasoning;
use crate::server::settings::ResponseOptions;
use crate::server::tools::Calls;
use engine::request::TokenLogprob;
use engine::{FinishReason, ModelTokenizer, Usage};
use serde::Serialize;

use super::chat::stream::ToolCallDelta;
use super::protocol::{ResponseBody, Skip, SpeculationStats, ThicketBody, UsageBody};
use super::{chat, completions};
use crate::server::unix_now;

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
    /// Its tokens so far (kept where its thinking tokens are to be counted).
    pub token_ids: Vec<u32>,
    /// Its thinking tokens, once it ended (with a reasoning parser).
    pub reasoning_tokens: usize,
}

impl ChoiceState {
    /// Records the end of the choice: why, its counts, and (with a reasoning parser) how
    /// many of its tokens were thinking.
    pub fn finish(
        &mut self,
        reason: FinishReason,
        usage: Usage,
        reasoning: Option<(Reasoning, &ModelTokenizer)>,
    ) {
        self.finish = Some(reason);
        self.usage = usage;
        if let Some((reasoning, tokenizer)) = reasoning {
            self.reasoning_tokens = reasoning.reasoning_tokens(tokenizer, &self.token_ids);
        }
    }
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
        details.reasoning_tokens += c.reasoning_tokens;
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
pub(crate) fn token_text(tokenizer: &ModelTokenizer, id: u32) -> String {
    tokenizer.decode(&[id]).unwrap_or_default()
}

/// The whole (non-streamed) response.
pub fn full_response(
    meta: &ResponseMeta,
    tokenizer: &ModelTokenizer,
    choices: &[ChoiceState],
    echo: &[Option<String>],
    options: &ResponseOptions,
    calls: Option<&Calls>,
) -> serde_json::Value {
    let (n, want_logprobs) = (options.n, options.logprobs);
    let tool_calls = calls.filter(|_| options.tool_calls);
    let reasoning = options.reasoning;
    let (usage, thicket) = totals(choices, n);
    match meta.endpoint {
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
                    completions::response::choice(index, c, prefix, tokenizer, want_logprobs)
                })
                .collect();
            whole(meta, "text_completion", list, usage, thicket)
        }
        Endpoint::Chat => {
            let list = choices
                .iter()
                .enumerate()
                .map(|(index, c)| {
                    chat::response::choice(
                        index,
                        c,
                        tokenizer,
                        want_logprobs,
                        tool_calls,
                        reasoning,
                    )
                })
                .collect();
            whole(meta, "chat.completion", list, usage, thicket)
        }
    }
}

/// A whole response of `choices`, with its totals.
fn whole<C: Serialize>(
    meta: &ResponseMeta,
    object: &'static str,
    choices: Vec<C>,
    usage: UsageBody,
    thicket: ThicketBody,
) -> serde_json::Value {
    let mut body = meta.body(object, choices);
    body.usage = Skip::Value(usage);
    body.thicket = Some(thicket);
    serde_json::to_value(body).unwrap_or_default()
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
    /// New thinking text (chat with a reasoning parser).
    pub reasoning: Option<String>,
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
    let finish = (finish_reason, stop_reason);
    let value = match meta.endpoint {
        Endpoint::Completion => {
            let choice = completions::response::chunk_choice(tokenizer, parts, finish);
            let mut body = meta.body("text_completion", vec![choice]);
            body.usage = usage;
            serde_json::to_value(body)
        }
        Endpoint::Chat => {
            let choice = chat::stream::chunk_choice(tokenizer, parts, finish);
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
