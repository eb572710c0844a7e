//! A streamed message: the Messages API's events, in order: `message_start`, `ping`; per
//! content block `content_block_start`, `content_block_delta`s (`thinking_delta` in the
//! model's thinking, `text_delta`, or `input_json_delta`s with a tool call's input as the
//! model writes it) and `content_block_stop`; last `message_delta` with the stop reason and
//! usage, and `message_stop`. A failure ends the stream with an `error` event in Anthropic's
//! error shape. A call's input streams only as far as it is settled ([`settled`]: a key or a
//! number waits for its value to be whole), so the fragments of a call cut off by the token
//! limit, closed by the last one, join to the `input` the whole message has.

use serde_json::json;

use super::response::{input_json, renamed_calls, stop, tool_use, usage, ID_DIGITS};
use crate::server::adapter::events::{AnswerEvents, Outbox};
use crate::server::adapter::new_id;
use crate::server::answer::Part;
use crate::server::anthropic::error::anthropic_error;
use crate::server::error::ApiError;
use crate::server::tools::partial_json::{closing, settled};
use crate::server::tools::Piece;

/// A streamed message.
pub struct MessageEvents {
    /// The model the message is from.
    model: String,
    /// The open thinking or text block: its index, and whether it is thinking.
    open_block: Option<(usize, bool)>,
    /// The streamed call's block: its index, its arguments so far, and how much of them
    /// went out.
    open_call: Option<(usize, String, usize)>,
    blocks: usize,
}

impl MessageEvents {
    /// The events of a message from `model`.
    pub fn new(model: &str) -> Self {
        Self {
            model: model.to_string(),
            open_block: None,
            open_call: None,
            blocks: 0,
        }
    }

    fn close_text(&mut self, out: &mut Outbox) {
        if let Some((index, _)) = self.open_block.take() {
            out.push("content_block_stop", json!({"index": index}));
        }
    }

    /// A new block's index.
    fn next_block(&mut self) -> usize {
        self.blocks += 1;
        self.blocks - 1
    }

    fn input_delta(index: usize, json: &str, out: &mut Outbox) {
        if !json.is_empty() {
            out.push(
                "content_block_delta",
                json!({"index": index, "delta": {"type": "input_json_delta", "partial_json": json}}),
            );
        }
    }

    /// A call announced: its `tool_use` block opens, its input to follow.
    fn call_start(&mut self, name: String, out: &mut Outbox) {
        self.close_text(out);
        self.end_call(None, out);
        let index = self.next_block();
        let block = json!({"type": "tool_use", "id": new_id("toolu", ID_DIGITS), "name": name,
                           "input": {}});
        out.push(
            "content_block_start",
            json!({"index": index, "content_block": block}),
        );
        self.open_call = Some((index, String::new(), 0));
    }

    /// More of the streamed call's arguments: what of them is settled goes out.
    fn arguments(&mut self, text: &str, out: &mut Outbox) {
        let Some((index, arguments, sent)) = self.open_call.as_mut() else {
            return;
        };
        arguments.push_str(text);
        let settled = settled(arguments);
        if settled > *sent {
            Self::input_delta(*index, &arguments[*sent..settled], out);
            *sent = settled;
        }
    }

    /// Ends the streamed call's block, its input as `whole` (the call's arguments; else
    /// those it streamed) closes it: the rest of it, or, for arguments cut off, what closes
    /// them as the whole message closes them.
    fn end_call(&mut self, whole: Option<&str>, out: &mut Outbox) {
        let Some((index, streamed, sent)) = self.open_call.take() else {
            return;
        };
        let arguments = whole.unwrap_or(&streamed);
        let rest = if sent == 0 {
            input_json(arguments)
        } else if serde_json::from_str::<serde_json::Value>(arguments).is_ok_and(|v| v.is_object())
            && arguments.starts_with(&streamed[..sent])
        {
            arguments[sent..].to_string()
        } else {
            // Cut off: closed as the whole message closes it, or, should that drop what
            // was sent, as far as it was sent.
            match closing(arguments)
                .filter(|c| c.keep >= sent && arguments.starts_with(&streamed[..sent]))
            {
                Some(c) => format!("{}{}", &arguments[sent..c.keep], c.suffix),
                None => closing(&streamed[..sent])
                    .map(|c| c.suffix)
                    .unwrap_or_default(),
            }
        };
        Self::input_delta(index, &rest, out);
        out.push("content_block_stop", json!({"index": index}));
    }

    /// Text for a thinking block (`thinking`) or a text block, opening it (and closing the
    /// other kind) where needed.
    fn text(&mut self, text: String, thinking: bool, out: &mut Outbox) {
        let index = match self.open_block {
            Some((index, kind)) if kind == thinking => index,
            _ => {
                self.close_text(out);
                self.end_call(None, out);
                let index = self.next_block();
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
            Part::Answer(Piece::Text(text)) => self.text(text, false, out),
            Part::Answer(Piece::Call { call, .. }) => {
                self.close_text(out);
                self.end_call(None, out);
                let call = renamed_calls(vec![call]).remove(0);
                let index = self.next_block();
                out.push(
                    "content_block_start",
                    json!({"index": index, "content_block": tool_use(&call, false)}),
                );
                Self::input_delta(index, &input_json(&call.function.arguments), out);
                out.push("content_block_stop", json!({"index": index}));
            }
            Part::Answer(Piece::CallStart { name, .. }) => self.call_start(name, out),
            Part::Answer(Piece::Arguments { text, .. }) => self.arguments(&text, out),
            Part::Answer(Piece::CallEnd { call, .. }) => {
                self.end_call(Some(&call.function.arguments), out)
            }
            Part::End(ending) => {
                self.close_text(out);
                self.end_call(None, out);
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
