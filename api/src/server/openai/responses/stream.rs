//! A streamed response: the Responses API's typed events, in order, each with its
//! `sequence_number`: `response.created` and `response.in_progress`; per output item
//! `response.output_item.added`, then for the model's thinking (a `reasoning` item)
//! `response.content_part.added`, `response.reasoning_text.delta`s,
//! `response.reasoning_text.done` and `response.content_part.done`, for a message
//! `response.content_part.added`,
//! `response.output_text.delta`s, `response.output_text.done` and
//! `response.content_part.done`, for a function call `response.function_call_arguments.delta`
//! and `.done`; `response.output_item.done`; and last `response.completed` (or
//! `response.incomplete` when the output ran out of tokens) with the whole response. A
//! failure ends the stream with an `error` event, then `response.failed` with the response as
//! far as it got (`status: failed`, its `error`, an open message item `incomplete`). The
//! finished response, or the failed one, is stored as a whole one would be, so the id the
//! stream announced can be fetched.

use std::sync::Arc;

use serde_json::{json, Value};

use super::response::{
    assistant_message, call_item, final_status, message_item, reasoning_item, reasoning_part,
    text_part, Shell, ID_DIGITS,
};
use super::store::{ResponseStore, Stored};
use crate::server::adapter::answer::Part;
use crate::server::adapter::events::{AnswerEvents, Outbox};
use crate::server::adapter::new_id;
use crate::server::error::ApiError;
use crate::server::openai::chat::response::ToolCallOut;

/// The message item being streamed.
struct OpenMessage {
    id: String,
    index: usize,
    text: String,
}

/// Where a streamed response stands.
pub struct ResponseEvents {
    shell: Shell,
    /// Where the finished response goes (`store: false`: nowhere).
    store: Option<Arc<ResponseStore>>,
    /// The conversation before this response's output.
    conversation: Vec<Value>,
    output: Vec<Value>,
    /// The reasoning item being streamed.
    reasoning: Option<OpenMessage>,
    message: Option<OpenMessage>,
    text: String,
    calls: Vec<ToolCallOut>,
}

impl ResponseEvents {
    /// The events of the response `shell` opens.
    pub fn new(shell: Shell, store: Option<Arc<ResponseStore>>, conversation: Vec<Value>) -> Self {
        Self {
            shell,
            store,
            conversation,
            output: Vec::new(),
            reasoning: None,
            message: None,
            text: String::new(),
            calls: Vec::new(),
        }
    }

    fn thinking(&mut self, delta: String, out: &mut Outbox) {
        if self.reasoning.is_none() {
            let id = new_id("rs", ID_DIGITS);
            let index = self.output.len();
            out.push(
                "response.output_item.added",
                json!({"output_index": index, "item": reasoning_item(&id, "", "in_progress")}),
            );
            out.push(
                "response.content_part.added",
                json!({"item_id": id, "output_index": index, "content_index": 0,
                       "part": reasoning_part("")}),
            );
            self.output.push(Value::Null);
            self.reasoning = Some(OpenMessage {
                id,
                index,
                text: String::new(),
            });
        }
        let Some(reasoning) = self.reasoning.as_mut() else {
            return;
        };
        reasoning.text.push_str(&delta);
        out.push(
            "response.reasoning_text.delta",
            json!({"item_id": reasoning.id, "output_index": reasoning.index,
                   "content_index": 0, "delta": delta}),
        );
    }

    /// Ends the open reasoning item (if any) with `status`.
    fn close_reasoning(&mut self, status: &str, out: &mut Outbox) {
        let Some(reasoning) = self.reasoning.take() else {
            return;
        };
        let (id, index, text) = (reasoning.id, reasoning.index, reasoning.text);
        out.push(
            "response.reasoning_text.done",
            json!({"item_id": id, "output_index": index, "content_index": 0, "text": text}),
        );
        out.push(
            "response.content_part.done",
            json!({"item_id": id, "output_index": index, "content_index": 0,
                   "part": reasoning_part(&text)}),
        );
        let item = reasoning_item(&id, &text, status);
        out.push(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        );
        if let Some(slot) = self.output.get_mut(index) {
            *slot = item;
        }
    }

    fn text(&mut self, delta: String, out: &mut Outbox) {
        self.close_reasoning("completed", out);
        if self.message.is_none() {
            let id = new_id("msg", ID_DIGITS);
            let index = self.output.len();
            let item = message_item(&id, "", "in_progress");
            out.push(
                "response.output_item.added",
                json!({"output_index": index, "item": item}),
            );
            out.push(
                "response.content_part.added",
                json!({"item_id": id, "output_index": index, "content_index": 0,
                       "part": text_part("")}),
            );
            // A placeholder keeps the output's indices; replaced when the message closes.
            self.output.push(Value::Null);
            self.message = Some(OpenMessage {
                id,
                index,
                text: String::new(),
            });
        }
        let Some(message) = self.message.as_mut() else {
            return;
        };
        message.text.push_str(&delta);
        self.text.push_str(&delta);
        let (id, index) = (message.id.clone(), message.index);
        out.push(
            "response.output_text.delta",
            json!({"item_id": id, "output_index": index, "content_index": 0,
                   "delta": delta, "logprobs": []}),
        );
    }

    /// Ends the open message item (if any) with `status`: `completed`, or `incomplete`
    /// when the response failed inside it.
    fn close_message(&mut self, status: &str, out: &mut Outbox) {
        let Some(message) = self.message.take() else {
            return;
        };
        let (id, index, text) = (message.id, message.index, message.text);
        out.push(
            "response.output_text.done",
            json!({"item_id": id, "output_index": index, "content_index": 0,
                   "text": text, "logprobs": []}),
        );
        out.push(
            "response.content_part.done",
            json!({"item_id": id, "output_index": index, "content_index": 0,
                   "part": text_part(&text)}),
        );
        let item = message_item(&id, &text, status);
        out.push(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        );
        if let Some(slot) = self.output.get_mut(index) {
            *slot = item;
        }
    }

    fn call(&mut self, call: ToolCallOut, out: &mut Outbox) {
        self.close_reasoning("completed", out);
        self.close_message("completed", out);
        let id = new_id("fc", ID_DIGITS);
        let index = self.output.len();
        let arguments = call.function.arguments.clone();
        out.push(
            "response.output_item.added",
            json!({"output_index": index, "item": call_item(&id, &call, "", "in_progress")}),
        );
        out.push(
            "response.function_call_arguments.delta",
            json!({"item_id": id, "output_index": index, "delta": arguments}),
        );
        out.push(
            "response.function_call_arguments.done",
            json!({"item_id": id, "output_index": index, "name": call.function.name,
                   "arguments": arguments}),
        );
        let item = call_item(&id, &call, &arguments, "completed");
        out.push(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        );
        self.output.push(item);
        self.calls.push(call);
    }
}

impl AnswerEvents for ResponseEvents {
    const NUMBERED: bool = true;

    fn open(&mut self, out: &mut Outbox) {
        let opening = self.shell.object("in_progress", Vec::new(), None);
        out.push("response.created", json!({"response": opening}));
        out.push("response.in_progress", json!({"response": opening}));
    }

    fn part(&mut self, part: Part, out: &mut Outbox) {
        match part {
            Part::Thinking(text) => self.thinking(text, out),
            Part::Text(text) => self.text(text, out),
            Part::Call(call) => self.call(call, out),
            Part::End(ending) => {
                self.close_reasoning("completed", out);
                self.close_message("completed", out);
                let output = std::mem::take(&mut self.output);
                let status = final_status(&ending);
                let response = self.shell.object(status, output, Some(&ending));
                if let Some(store) = &self.store {
                    let mut conversation = std::mem::take(&mut self.conversation);
                    conversation.push(assistant_message(&self.text, &self.calls));
                    store.put(
                        self.shell.id.clone(),
                        Stored::new(response.clone(), conversation),
                    );
                }
                let kind = match status {
                    "incomplete" => "response.incomplete",
                    _ => "response.completed",
                };
                out.push(kind, json!({"response": response}));
                out.ended = true;
            }
        }
    }

    fn failed(&mut self, e: ApiError, out: &mut Outbox) {
        self.close_reasoning("incomplete", out);
        self.close_message("incomplete", out);
        let body = e.body();
        let error = &body["error"];
        let message = error["message"].clone();
        out.push(
            "error",
            json!({"code": error["code"].as_str().unwrap_or(error["type"].as_str().unwrap_or("server_error")),
                   "message": message, "param": error["param"]}),
        );
        let output = std::mem::take(&mut self.output);
        let response = self
            .shell
            .failed(output, failure_code(e.status.as_u16()), message);
        if let Some(store) = &self.store {
            let conversation = std::mem::take(&mut self.conversation);
            store.put(
                self.shell.id.clone(),
                Stored::failed(response.clone(), conversation),
            );
        }
        out.push("response.failed", json!({"response": response}));
        out.ended = true;
    }
}

/// The response object's `error.code` for a failure with HTTP `status`: the API's codes
/// name a few client faults and `server_error` for the rest.
fn failure_code(status: u16) -> &'static str {
    match status {
        429 => "rate_limit_exceeded",
        _ => "server_error",
    }
}
