//! A streamed response: the Responses API's typed events, in order, each with its
//! `sequence_number`: `response.created` and `response.in_progress`; per output item
//! `response.output_item.added`, then for a message `response.content_part.added`,
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

use super::output::{
    assistant_message, call_item, final_status, message_item, new_id, text_part, Shell,
};
use super::store::{ResponseStore, Stored};
use crate::server::answer::{Answer, AnswerEvents, Outbox, Part};
use crate::server::error::ApiError;
use crate::server::protocol::ToolCallOut;

/// The message item being streamed.
struct OpenMessage {
    id: String,
    index: usize,
    text: String,
}

/// Where a streamed response stands.
pub struct ResponseEvents {
    shell: Shell,
    answer: Answer,
    /// Where the finished response goes (`store: false`: nowhere).
    store: Option<Arc<ResponseStore>>,
    /// The conversation before this response's output.
    conversation: Vec<Value>,
    sequence: u64,
    outbox: Outbox,
    output: Vec<Value>,
    message: Option<OpenMessage>,
    text: String,
    calls: Vec<ToolCallOut>,
}

impl ResponseEvents {
    /// The events of `answer` to the response `shell` opens.
    pub fn new(
        shell: Shell,
        answer: Answer,
        store: Option<Arc<ResponseStore>>,
        conversation: Vec<Value>,
    ) -> Self {
        let mut events = Self {
            shell,
            answer,
            store,
            conversation,
            sequence: 0,
            outbox: Outbox::default(),
            output: Vec::new(),
            message: None,
            text: String::new(),
            calls: Vec::new(),
        };
        let opening = events.shell.object("in_progress", Vec::new(), None);
        events.emit("response.created", json!({"response": opening}));
        events.emit("response.in_progress", json!({"response": opening}));
        events
    }

    fn emit(&mut self, kind: &str, mut data: Value) {
        data["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        self.outbox.push(kind, data);
    }

    fn text(&mut self, delta: String) {
        if self.message.is_none() {
            let id = new_id("msg");
            let index = self.output.len();
            let item = message_item(&id, "", "in_progress");
            self.emit(
                "response.output_item.added",
                json!({"output_index": index, "item": item}),
            );
            self.emit(
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
        self.emit(
            "response.output_text.delta",
            json!({"item_id": id, "output_index": index, "content_index": 0,
                   "delta": delta, "logprobs": []}),
        );
    }

    /// Ends the open message item (if any) with `status`: `completed`, or `incomplete`
    /// when the response failed inside it.
    fn close_message(&mut self, status: &str) {
        let Some(message) = self.message.take() else {
            return;
        };
        let (id, index, text) = (message.id, message.index, message.text);
        self.emit(
            "response.output_text.done",
            json!({"item_id": id, "output_index": index, "content_index": 0,
                   "text": text, "logprobs": []}),
        );
        self.emit(
            "response.content_part.done",
            json!({"item_id": id, "output_index": index, "content_index": 0,
                   "part": text_part(&text)}),
        );
        let item = message_item(&id, &text, status);
        self.emit(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        );
        if let Some(slot) = self.output.get_mut(index) {
            *slot = item;
        }
    }

    fn call(&mut self, call: ToolCallOut) {
        self.close_message("completed");
        let id = new_id("fc");
        let index = self.output.len();
        let arguments = call.function.arguments.clone();
        self.emit(
            "response.output_item.added",
            json!({"output_index": index, "item": call_item(&id, &call, "", "in_progress")}),
        );
        self.emit(
            "response.function_call_arguments.delta",
            json!({"item_id": id, "output_index": index, "delta": arguments}),
        );
        self.emit(
            "response.function_call_arguments.done",
            json!({"item_id": id, "output_index": index, "name": call.function.name,
                   "arguments": arguments}),
        );
        let item = call_item(&id, &call, &arguments, "completed");
        self.emit(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        );
        self.output.push(item);
        self.calls.push(call);
    }
}

impl AnswerEvents for ResponseEvents {
    fn answer(&mut self) -> &mut Answer {
        &mut self.answer
    }

    fn outbox(&mut self) -> &mut Outbox {
        &mut self.outbox
    }

    fn part(&mut self, part: Part) {
        match part {
            Part::Text(text) => self.text(text),
            Part::Call(call) => self.call(call),
            Part::End(ending) => {
                self.close_message("completed");
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
                self.emit(kind, json!({"response": response}));
                self.outbox.ended = true;
            }
        }
    }

    fn failed(&mut self, e: ApiError) {
        self.close_message("incomplete");
        let body = e.body();
        let error = &body["error"];
        let message = error["message"].clone();
        self.emit(
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
        self.emit("response.failed", json!({"response": response}));
        self.outbox.ended = true;
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
