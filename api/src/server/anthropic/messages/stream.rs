//! A streamed message: the Messages API's events, in order: `message_start`, `ping`; per
//! content block `content_block_start`, `content_block_delta`s (`thinking_delta` in the
//! model's thinking, `text_delta`, or one `input_json_delta` with a tool call's whole input)
//! and `content_block_stop`; last
//! `message_delta` with the stop reason and usage, and `message_stop`. A failure ends the
//! stream with an `error` event in Anthropic's error shape.

use serde_json::json;

use super::response::{input_json, renamed_calls, stop, tool_use, usage, ID_DIGITS};
use crate::server::adapter::answer::Part;
use crate::server::adapter::events::{AnswerEvents, Outbox};
use crate::server::adapter::new_id;
use crate::server::anthropic::error::anthropic_error;
use crate::server::error::ApiError;

/// A streamed message.
pub struct MessageEvents {
    /// The model the message is from.
    model: String,
    /// The open thinking or text block: its index, and whether it is thinking.
    open_block: Option<(usize, bool)>,
    blocks: usize,
}

impl MessageEvents {
    /// The events of a message from `model`.
    pub fn new(model: &str) -> Self {
        Self {
            model: model.to_string(),
            open_block: None,
            blocks: 0,
        }
    }

    fn close_text(&mut self, out: &mut Outbox) {
        if let Some((index, _)) = self.open_block.take() {
            out.push("content_block_stop", json!({"index": index}));
        }
    }

    /// Text for a thinking block (`thinking`) or a text block, opening it (and closing the
    /// other kind) where needed.
    fn text(&mut self, text: String, thinking: bool, out: &mut Outbox) {
        let index = match self.open_block {
            Some((index, kind)) if kind == thinking => index,
            _ => {
                self.close_text(out);
                let index = self.blocks;
                self.blocks += 1;
                self.open_block = Some((index, thinking));
                let block = if thinking {
                    json!({"type": "thinking", "thinking": "", "signature": ""})
                } else {
                    json!({"type": "text", "text": ""})
                };
                out.push(
                    "content_block_start",
                    json!({"index": index, "content_block": block}),
                );
                index
            }
        };
        let delta = if thinking {
            json!({"type": "thinking_delta", "thinking": text})
        } else {
            json!({"type": "text_delta", "text": text})
        };
        out.push(
            "content_block_delta",
            json!({"index": index, "delta": delta}),
        );
    }
}

impl AnswerEvents for MessageEvents {
    fn open(&mut self, out: &mut Outbox) {
        let start = json!({"message": {
            "id": new_id("msg", ID_DIGITS), "type": "message", "role": "assistant",
            "model": self.model, "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }});
        out.push("message_start", start);
        out.push("ping", json!({}));
    }

    fn part(&mut self, part: Part, out: &mut Outbox) {
        match part {
            Part::Thinking(text) => self.text(text, true, out),
            Part::Text(text) => self.text(text, false, out),
            Part::Call(call) => {
                self.close_text(out);
                let call = renamed_calls(vec![call]).remove(0);
                let index = self.blocks;
                self.blocks += 1;
                out.push(
                    "content_block_start",
                    json!({"index": index, "content_block": tool_use(&call, false)}),
                );
                out.push(
                    "content_block_delta",
                    json!({"index": index, "delta": {"type": "input_json_delta",
                           "partial_json": input_json(&call.function.arguments)}}),
                );
                out.push("content_block_stop", json!({"index": index}));
            }
            Part::End(ending) => {
                self.close_text(out);
                let (stop_reason, stop_sequence) = stop(&ending);
                out.push(
                    "message_delta",
                    json!({"delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                           "usage": usage(&ending)}),
                );
                out.push("message_stop", json!({}));
                out.ended = true;
            }
        }
    }

    fn failed(&mut self, e: ApiError, out: &mut Outbox) {
        out.push("error", anthropic_error(&e));
        out.ended = true;
    }
}
