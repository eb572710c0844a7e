//! A streamed response: the Responses API's typed events, in order, each with its
//! `sequence_number`: `response.created` and `response.in_progress`; per output item
//! `response.output_item.added`, then for the model's thinking (a `reasoning` item)
//! `response.content_part.added`, `response.reasoning_text.delta`s,
//! `response.reasoning_text.done` and `response.content_part.done`, for a message
//! `response.content_part.added`,
//! `response.output_text.delta`s, `response.output_text.done` and
//! `response.content_part.done`, for a function call `response.function_call_arguments.delta`s
//! (its arguments as the model writes them, the call announced once its name is whole)
//! and `.done`; `response.output_item.done`; and last `response.completed` (or
//! `response.incomplete` when the output ran out of tokens) with the whole response. A
//! failure ends the stream with an `error` event, then `response.failed` with the response as
//! far as it got (`status: failed`, its `error`, an open item `incomplete`). The
//! finished response, or the failed one, is stored as a whole one would be, so the id the
//! stream announced can be fetched.

use std::sync::Arc;

use serde_json::{json, Value};

use super::response::{
    assistant_message, call_item, final_status, message_item, reasoning_item, reasoning_part,
    text_part, Shell, ID_DIGITS,
};
use super::store::{ResponseStore, Stored};
use crate::server::adapter::events::{AnswerEvents, Outbox};
use crate::server::adapter::new_id;
use crate::server::answer::Part;
use crate::server::error::ApiError;
use crate::server::request::ChatMessageIn;
use crate::server::tools::{FunctionCallOut, Piece, ToolCallOut};

/// The kind of a streamed item with text: the model's thinking or its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Reasoning,
    Message,
}

impl Kind {
    fn item(self, id: &str, text: &str, status: &str) -> Value {
        match self {
            Kind::Reasoning => reasoning_item(id, text, status),
            Kind::Message => message_item(id, text, status),
        }
    }

    fn part(self, text: &str) -> Value {
        match self {
            Kind::Reasoning => reasoning_part(text),
            Kind::Message => text_part(text),
        }
    }

    /// The event that carries a piece of its text, and the one that ends the text.
    fn events(self) -> (&'static str, &'static str) {
        match self {
            Kind::Reasoning => (
                "response.reasoning_text.delta",
                "response.reasoning_text.done",
            ),
            Kind::Message => ("response.output_text.delta", "response.output_text.done"),
        }
    }

    /// `data` with the fields its text events carry besides (a message's `logprobs`).
    fn text_event(self, mut data: Value) -> Value {
        if self == Kind::Message {
            data["logprobs"] = json!([]);
        }
        data
    }
}

/// The item being streamed.
struct OpenItem {
    kind: Kind,
    id: String,
    index: usize,
    text: String,
}

/// The function call being streamed: its item's id and index, and the call as far as it is
/// written.
struct OpenCall {
    id: String,
    index: usize,
    call: ToolCallOut,
}

impl OpenCall {
    /// Its item with `status`.
    fn item(&self, status: &str) -> Value {
        call_item(&self.id, &self.call, &self.call.function.arguments, status)
    }
}

/// Where a streamed response stands.
pub struct ResponseEvents {
    shell: Shell,
    /// Where the finished response goes (`store: false`: nowhere).
    store: Option<Arc<ResponseStore>>,
    /// The conversation before this response's output.
    conversation: Vec<ChatMessageIn>,
    output: Vec<Value>,
    /// The reasoning or message item being streamed.
    open: Option<OpenItem>,
    /// The function call being streamed.
    open_call: Option<OpenCall>,
    text: String,
    thinking: String,
    calls: Vec<ToolCallOut>,
}

impl ResponseEvents {
    /// The events of the response `shell` opens.
    pub fn new(
        shell: Shell,
        store: Option<Arc<ResponseStore>>,
        conversation: Vec<ChatMessageIn>,
    ) -> Self {
        Self {
            shell,
            store,
            conversation,
            output: Vec::new(),
            open: None,
            open_call: None,
            text: String::new(),
            thinking: String::new(),
            calls: Vec::new(),
        }
    }

    /// A piece of text of a `kind` item: opens the item (closing another one first) where
    /// none of that kind is open.
    fn delta(&mut self, kind: Kind, delta: String, out: &mut Outbox) {
        if self.open.as_ref().map(|o| o.kind) != Some(kind) {
            self.close("completed", out);
            let prefix = if kind == Kind::Reasoning { "rs" } else { "msg" };
            let id = new_id(prefix, ID_DIGITS);
            let index = self.output.len();
            out.push(
                "response.output_item.added",
                json!({"output_index": index, "item": kind.item(&id, "", "in_progress")}),
            );
            out.push(
                "response.content_part.added",
                json!({"item_id": id, "output_index": index, "content_index": 0,
                       "part": kind.part("")}),
            );
            // A placeholder keeps the output's indices; replaced when the item closes.
            self.output.push(Value::Null);
            self.open = Some(OpenItem {
                kind,
                id,
                index,
                text: String::new(),
            });
        }
        if kind == Kind::Message {
            self.text.push_str(&delta);
        }
        let Some(open) = self.open.as_mut() else {
            return;
        };
        open.text.push_str(&delta);
        let data = json!({"item_id": open.id, "output_index": open.index, "content_index": 0,
                          "delta": delta});
        out.push(kind.events().0, kind.text_event(data));
    }

    /// Ends the open item (if any) with `status`: `completed`, or `incomplete` when the
    /// response failed inside it.
    fn close(&mut self, status: &str, out: &mut Outbox) {
        let Some(OpenItem {
            kind,
            id,
            index,
            text,
        }) = self.open.take()
        else {
            return;
        };
        let data = json!({"item_id": id, "output_index": index, "content_index": 0,
                          "text": text});
        out.push(kind.events().1, kind.text_event(data));
        out.push(
            "response.content_part.done",
            json!({"item_id": id, "output_index": index, "content_index": 0,
                   "part": kind.part(&text)}),
        );
        let item = kind.item(&id, &text, status);
        out.push(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        );
        if let Some(slot) = self.output.get_mut(index) {
            *slot = item;
        }
    }

    /// A call announced: its item opens, arguments to follow.
    fn call_start(&mut self, call_id: String, name: String, out: &mut Outbox) {
        self.close("completed", out);
        self.end_call(None, "completed", out);
        let call = OpenCall {
            id: new_id("fc", ID_DIGITS),
            index: self.output.len(),
            call: ToolCallOut {
                id: call_id,
                kind: "function",
                function: FunctionCallOut {
                    name,
                    arguments: String::new(),
                },
            },
        };
        out.push(
            "response.output_item.added",
            json!({"output_index": call.index, "item": call.item("in_progress")}),
        );
        // A placeholder keeps the output's indices; replaced when the call ends.
        self.output.push(Value::Null);
        self.open_call = Some(call);
    }

    fn arguments(&mut self, delta: String, out: &mut Outbox) {
        let Some(call) = self.open_call.as_mut() else {
            return;
        };
        call.call.function.arguments.push_str(&delta);
        out.push(
            "response.function_call_arguments.delta",
            json!({"item_id": call.id, "output_index": call.index, "delta": delta}),
        );
    }

    /// Ends the streamed call (if one is open) as `whole` has it (else with the arguments it
    /// streamed), with `status`.
    fn end_call(&mut self, whole: Option<ToolCallOut>, status: &str, out: &mut Outbox) {
        let Some(mut call) = self.open_call.take() else {
            return;
        };
        if let Some(whole) = &whole {
            call.call
                .function
                .arguments
                .clone_from(&whole.function.arguments);
        }
        let function = &call.call.function;
        out.push(
            "response.function_call_arguments.done",
            json!({"item_id": call.id, "output_index": call.index, "name": function.name,
                   "arguments": function.arguments}),
        );
        let item = call.item(status);
        out.push(
            "response.output_item.done",
            json!({"output_index": call.index, "item": item}),
        );
        if let Some(slot) = self.output.get_mut(call.index) {
            *slot = item;
        }
        self.calls.extend(whole);
    }

    fn call(&mut self, call: ToolCallOut, out: &mut Outbox) {
        self.close("completed", out);
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
            Part::Thinking(text) => {
                self.thinking.push_str(&text);
                self.delta(Kind::Reasoning, text, out)
            }
            Part::Answer(Piece::Text(text)) => self.delta(Kind::Message, text, out),
            Part::Answer(Piece::Call { call, .. }) => self.call(call, out),
            Part::Answer(Piece::CallStart { id, name, .. }) => self.call_start(id, name, out),
            Part::Answer(Piece::Arguments { text, .. }) => self.arguments(text, out),
            Part::Answer(Piece::CallEnd { call, .. }) => {
                self.end_call(Some(call), "completed", out)
            }
            Part::End(ending) => {
                self.close("completed", out);
                self.end_call(None, "completed", out);
                let output = std::mem::take(&mut self.output);
                let status = final_status(&ending);
                let response = self.shell.object(status, output, Some(&ending));
                if let Some(store) = &self.store {
                    let mut conversation = std::mem::take(&mut self.conversation);
                    conversation.push(assistant_message(&self.text, &self.calls, &self.thinking));
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
        self.close("incomplete", out);
        self.end_call(None, "incomplete", out);
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
