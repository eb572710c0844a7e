//! The Messages API's objects: the `message` object (content blocks, `stop_reason`,
//! `stop_sequence`, usage with `cache_read_input_tokens`), its `text` and `tool_use`
//! blocks, and its streamed events (`message_start`, `ping`, `content_block_start`,
//! `content_block_delta` with `text_delta` or `input_json_delta`, `content_block_stop`,
//! `message_delta` with the stop reason and usage, `message_stop`; an `error` event where
//! the answer fails).

use engine::FinishReason;
use serde_json::{json, Value};

use super::anthropic_error;
use crate::server::answer::{Answer, AnswerEvents, Collected, Ending, Outbox, Part};
use crate::server::error::ApiError;
use crate::server::protocol::ToolCallOut;

/// A fresh id with `prefix` (`msg`, `toolu`).
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}_{:024x}", rand::random::<u128>() >> 32)
}

/// `stop_reason` and `stop_sequence` of an answer.
fn stop(ending: &Ending) -> (&'static str, Value) {
    match &ending.reason {
        FinishReason::Length => ("max_tokens", Value::Null),
        _ if ending.calls > 0 => ("tool_use", Value::Null),
        FinishReason::StopString(s) => ("stop_sequence", json!(s)),
        _ => ("end_turn", Value::Null),
    }
}

/// The usage object of an answer: input tokens not read from the cache, those read from it,
/// output tokens.
fn usage(ending: &Ending) -> Value {
    let usage = &ending.usage;
    json!({
        "input_tokens": usage.prompt_tokens.saturating_sub(usage.cached_tokens),
        "cache_read_input_tokens": usage.cached_tokens,
        "cache_creation_input_tokens": 0,
        "output_tokens": usage.completion_tokens,
    })
}

/// A `tool_use` block of `call` (`input` empty while it is announced in a stream).
fn tool_use(call: &ToolCallOut, whole: bool) -> Value {
    let input = if whole {
        serde_json::from_str::<Value>(&call.function.arguments)
            .ok()
            .filter(Value::is_object)
            .unwrap_or_else(|| json!({}))
    } else {
        json!({})
    };
    json!({"type": "tool_use", "id": call.id, "name": call.function.name, "input": input})
}

/// Calls with Anthropic-style ids (`toolu_...`).
fn renamed_calls(calls: Vec<ToolCallOut>) -> Vec<ToolCallOut> {
    calls
        .into_iter()
        .map(|mut c| {
            c.id = new_id("toolu");
            c
        })
        .collect()
}

/// The whole `message` object of an answer.
pub fn message(model: &str, answer: Collected) -> Value {
    let calls = renamed_calls(answer.calls);
    let mut content = Vec::with_capacity(1 + calls.len());
    let blank = answer.text.trim().is_empty();
    if !answer.text.is_empty() && (!blank || calls.is_empty()) {
        content.push(json!({"type": "text", "text": answer.text}));
    }
    content.extend(calls.iter().map(|c| tool_use(c, true)));
    let (stop_reason, stop_sequence) = stop(&answer.ending);
    let (_, thicket) = answer.ending.totals();
    json!({
        "id": new_id("msg"),
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

/// A streamed message.
pub struct MessageEvents {
    answer: Answer,
    outbox: Outbox,
    /// The open text block's index.
    text_block: Option<usize>,
    blocks: usize,
}

impl MessageEvents {
    /// The events of `answer`, a message from `model`.
    pub fn new(model: &str, answer: Answer) -> Self {
        let mut events = Self {
            answer,
            outbox: Outbox::default(),
            text_block: None,
            blocks: 0,
        };
        let start = json!({"message": {
            "id": new_id("msg"), "type": "message", "role": "assistant", "model": model,
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }});
        events.emit("message_start", start);
        events.emit("ping", json!({}));
        events
    }

    fn emit(&mut self, kind: &str, data: Value) {
        self.outbox.push(kind, data);
    }

    fn close_text(&mut self) {
        if let Some(index) = self.text_block.take() {
            self.emit("content_block_stop", json!({"index": index}));
        }
    }
}

impl AnswerEvents for MessageEvents {
    fn answer(&mut self) -> &mut Answer {
        &mut self.answer
    }

    fn outbox(&mut self) -> &mut Outbox {
        &mut self.outbox
    }

    fn part(&mut self, part: Part) {
        match part {
            Part::Text(text) => {
                let index = match self.text_block {
                    Some(index) => index,
                    None => {
                        let index = self.blocks;
                        self.blocks += 1;
                        self.text_block = Some(index);
                        self.emit(
                            "content_block_start",
                            json!({"index": index, "content_block": {"type": "text", "text": ""}}),
                        );
                        index
                    }
                };
                self.emit(
                    "content_block_delta",
                    json!({"index": index, "delta": {"type": "text_delta", "text": text}}),
                );
            }
            Part::Call(call) => {
                self.close_text();
                let call = renamed_calls(vec![call]).remove(0);
                let index = self.blocks;
                self.blocks += 1;
                self.emit(
                    "content_block_start",
                    json!({"index": index, "content_block": tool_use(&call, false)}),
                );
                self.emit(
                    "content_block_delta",
                    json!({"index": index, "delta": {"type": "input_json_delta",
                           "partial_json": call.function.arguments}}),
                );
                self.emit("content_block_stop", json!({"index": index}));
            }
            Part::End(ending) => {
                self.close_text();
                let (stop_reason, stop_sequence) = stop(&ending);
                self.emit(
                    "message_delta",
                    json!({"delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                           "usage": usage(&ending)}),
                );
                self.emit("message_stop", json!({}));
                self.outbox.ended = true;
            }
        }
    }

    fn failed(&mut self, e: ApiError) {
        self.emit("error", anthropic_error(&e));
        self.outbox.ended = true;
    }
}
