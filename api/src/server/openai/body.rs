//! The envelope `/v1/completions` and `/v1/chat/completions` answer in: which endpoint and
//! response it is ([`ResponseMeta`]), the whole response and the stream chunks with each
//! endpoint's choices in them (built by `completions::response` and `chat::response` /
//! `chat::stream` from the choices' accumulators, `choice`), and the usage chunk. (The
//! Responses API's objects are `responses::response`'s.)

use crate::server::settings::ResponseOptions;
use crate::server::tools::Calls;
use engine::ModelTokenizer;
use serde::Serialize;

use super::chat::{response as chat_response, stream as chat_stream};
use super::choice::{finish_fields, totals, ChoiceState, ChunkParts};
use super::completions::response as completions_response;
use super::protocol::{ResponseBody, Skip, ThicketBody, UsageBody};
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
                    completions_response::choice(index, c, prefix, tokenizer, want_logprobs)
                })
                .collect();
            whole(meta, "text_completion", list, usage, thicket)
        }
        Endpoint::Chat => {
            let list = choices
                .iter()
                .enumerate()
                .map(|(index, c)| {
                    chat_response::choice(index, c, tokenizer, want_logprobs, tool_calls, reasoning)
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
            let choice = completions_response::chunk_choice(tokenizer, parts, finish);
            let mut body = meta.body("text_completion", vec![choice]);
            body.usage = usage;
            serde_json::to_value(body)
        }
        Endpoint::Chat => {
            let choice = chat_stream::chunk_choice(tokenizer, parts, finish);
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
