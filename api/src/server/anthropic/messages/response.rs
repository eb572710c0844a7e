//! The Messages API's objects: the `message` object (content blocks, `stop_reason`,
//! `stop_sequence`, usage with `cache_read_input_tokens`) and its `thinking`, `text` and
//! `tool_use` blocks, with tool calls under Anthropic-style ids (`toolu_...`).

use engine::FinishReason;
use serde_json::{json, Value};

use crate::server::adapter::new_id;
use crate::server::answer::{Collected, Ending};
use crate::server::openai::choice::ending_totals;
use crate::server::tools::partial_json::close_json;
use crate::server::tools::ToolCallOut;

/// Hex digits of the API's ids after their prefix (`msg_`, `toolu_`).
pub const ID_DIGITS: usize = 24;

/// `stop_reason` and `stop_sequence` of an answer.
pub(super) fn stop(ending: &Ending) -> (&'static str, Value) {
    match &ending.reason {
        FinishReason::Length => ("max_tokens", Value::Null),
        _ if ending.calls > 0 => ("tool_use", Value::Null),
        FinishReason::StopString(s) => ("stop_sequence", json!(s)),
        _ => ("end_turn", Value::Null),
    }
}

/// The usage object of an answer: input tokens not read from the cache, those read from it,
/// output tokens.
pub(super) fn usage(ending: &Ending) -> Value {
    let usage = &ending.usage;
    json!({
        "input_tokens": usage.prompt_tokens.saturating_sub(usage.cached_tokens),
        "cache_read_input_tokens": usage.cached_tokens,
        "cache_creation_input_tokens": 0,
        "output_tokens": usage.completion_tokens,
    })
}

/// A `tool_use` block of `call` (`input` empty while it is announced in a stream).
pub(super) fn tool_use(call: &ToolCallOut, whole: bool) -> Value {
    let input = if whole {
        input_of(&call.function.arguments)
    } else {
        json!({})
    };
    json!({"type": "tool_use", "id": call.id, "name": call.function.name, "input": input})
}

/// A call's `input` object from its arguments: as written, or, for arguments cut off by the
/// token limit, closed where they were cut (`{}` when nothing of an object is there).
pub(super) fn input_of(arguments: &str) -> Value {
    serde_json::from_str::<Value>(arguments)
        .ok()
        .or_else(|| close_json(arguments))
        .filter(Value::is_object)
        .unwrap_or_else(|| json!({}))
}

/// The `input_json_delta` text of a call: its arguments as written when they are an object,
/// else the object [`input_of`] makes of them, so a client that joins the deltas reads the
/// same `input` as the whole answer has.
pub(super) fn input_json(arguments: &str) -> String {
    match serde_json::from_str::<Value>(arguments) {
        Ok(value) if value.is_object() => arguments.to_string(),
        _ => input_of(arguments).to_string(),
    }
}

/// Calls with Anthropic-style ids (`toolu_...`).
pub(super) fn renamed_calls(calls: Vec<ToolCallOut>) -> Vec<ToolCallOut> {
    calls
        .into_iter()
        .map(|mut c| {
            c.id = new_id("toolu", ID_DIGITS);
            c
        })
        .collect()
}

/// The whole `message` object of an answer.
pub fn message(model: &str, answer: Collected) -> Value {
    let calls = renamed_calls(answer.calls);
    let mut content = Vec::with_capacity(2 + calls.len());
    if !answer.thinking.is_empty() {
        content.push(json!({"type": "thinking", "thinking": answer.thinking, "signature": ""}));
    }
    let blank = answer.text.trim().is_empty();
    if !answer.text.is_empty() && (!blank || calls.is_empty()) {
        content.push(json!({"type": "text", "text": answer.text}));
    }
    content.extend(calls.iter().map(|c| tool_use(c, true)));
    let (stop_reason, stop_sequence) = stop(&answer.ending);
    let (_, thicket) = ending_totals(&answer.ending);
    json!({
        "id": new_id("msg", ID_DIGITS),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": usage(&answer.ending),
        "thicket": thicket,
    })
}
