//! The Responses API's objects: the `response` object (its request fields echoed, `status`,
//! `output` items, `usage` with cached input and reasoning tokens), its output items (a
//! `reasoning` item with the model's thinking, an assistant `message` with one `output_text`
//! part, `function_call` items), and the conversation a
//! later `previous_response_id` continues.

use serde_json::{json, Map, Value};

use engine::FinishReason;

use super::request::ResponsesRequest;
use crate::server::adapter::new_id;
use crate::server::answer::{Collected, Ending};
use crate::server::openai::choice::ending_totals;
use crate::server::request::{ChatMessageIn, ToolCallIn};
use crate::server::tools::ToolCallOut;
use crate::server::unix_now;

/// Hex digits of the API's ids after their prefix (`resp_`, `msg_`, `fc_`).
pub const ID_DIGITS: usize = 32;

/// What every version of one response object shares: its id, time, model and the request's
/// fields it echoes.
#[derive(Debug, Clone)]
pub struct Shell {
    /// `resp_...`.
    pub id: String,
    fields: Map<String, Value>,
}

impl Shell {
    /// The shell of a response to `request` from `model`.
    pub fn new(request: &ResponsesRequest, model: &str) -> Self {
        let id = new_id("resp", ID_DIGITS);
        let or = |v: Option<Value>, default: Value| v.filter(|v| !v.is_null()).unwrap_or(default);
        let fields = json!({
            "id": id,
            "object": "response",
            "created_at": unix_now(),
            "model": model,
            "instructions": request.instructions,
            "tools": or(request.tools.clone().map(Value::from), json!([])),
            "tool_choice": or(request.tool_choice.clone(), json!("auto")),
            "parallel_tool_calls": request.parallel_tool_calls.unwrap_or(true),
            "temperature": or(request.temperature.clone(), json!(1.0)),
            "top_p": or(request.top_p.clone(), json!(1.0)),
            "max_output_tokens": request.max_output_tokens,
            "previous_response_id": request.previous_response_id,
            "text": or(request.text.clone(), json!({"format": {"type": "text"}})),
            "store": request.store.unwrap_or(true),
            "metadata": or(request.metadata.clone(), json!({})),
            "user": request.user,
            "truncation": "disabled",
            "reasoning": {
                "effort": super::request::reasoning_effort(request.reasoning.as_ref())
                    .ok()
                    .flatten(),
                "summary": null,
            },
            "background": false,
        });
        let fields = match fields {
            Value::Object(map) => map,
            _ => Map::new(),
        };
        Self { id, fields }
    }

    /// The response object with `status`, `output` and, once finished, how it ended.
    pub fn object(&self, status: &str, output: Vec<Value>, ending: Option<&Ending>) -> Value {
        let mut object = self.fields.clone();
        object.insert("status".into(), json!(status));
        object.insert("output".into(), Value::Array(output));
        object.insert("error".into(), Value::Null);
        let incomplete = ending
            .filter(|e| e.reason == FinishReason::Length)
            .map(|_| json!({"reason": "max_output_tokens"}));
        object.insert(
            "incomplete_details".into(),
            incomplete.unwrap_or(Value::Null),
        );
        match ending {
            Some(ending) => {
                let (usage, thicket) = ending_totals(ending);
                let details = &usage.completion_tokens_details;
                object.insert(
                    "usage".into(),
                    json!({
                        "input_tokens": usage.prompt_tokens,
                        "input_tokens_details": {
                            "cached_tokens": usage.prompt_tokens_details.cached_tokens,
                        },
                        "output_tokens": usage.completion_tokens,
                        "output_tokens_details": {
                            "reasoning_tokens": details.reasoning_tokens,
                            "accepted_prediction_tokens": details.accepted_prediction_tokens,
                            "rejected_prediction_tokens": details.rejected_prediction_tokens,
                        },
                        "total_tokens": usage.total_tokens,
                    }),
                );
                object.insert(
                    "thicket".into(),
                    serde_json::to_value(thicket).unwrap_or_default(),
                );
            }
            None => {
                object.insert("usage".into(), Value::Null);
            }
        }
        Value::Object(object)
    }

    /// The response as far as it got when it failed: `status: failed`, the output items so
    /// far and `error` with the API's `code` and `message`.
    pub fn failed(&self, output: Vec<Value>, code: &str, message: Value) -> Value {
        let mut object = self.object("failed", output, None);
        object["error"] = json!({"code": code, "message": message});
        object
    }
}

/// The status a finished answer gives its response.
pub fn final_status(ending: &Ending) -> &'static str {
    match ending.reason {
        FinishReason::Length => "incomplete",
        _ => "completed",
    }
}

/// An assistant message item holding `text`.
pub fn message_item(id: &str, text: &str, status: &str) -> Value {
    json!({
        "type": "message",
        "id": id,
        "status": status,
        "role": "assistant",
        "content": if status == "in_progress" && text.is_empty() {
            json!([])
        } else {
            json!([text_part(text)])
        },
    })
}

/// A reasoning item holding `thinking` (its text as one `reasoning_text` part).
pub fn reasoning_item(id: &str, thinking: &str, status: &str) -> Value {
    json!({
        "type": "reasoning",
        "id": id,
        "status": status,
        "summary": [],
        "content": if status == "in_progress" && thinking.is_empty() {
            json!([])
        } else {
            json!([reasoning_part(thinking)])
        },
    })
}

/// The `reasoning_text` part of `thinking`.
pub fn reasoning_part(thinking: &str) -> Value {
    json!({"type": "reasoning_text", "text": thinking})
}

/// The `output_text` part of `text`.
pub fn text_part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

/// A function call item (`arguments` empty while it is announced).
pub fn call_item(id: &str, call: &ToolCallOut, arguments: &str, status: &str) -> Value {
    json!({
        "type": "function_call",
        "id": id,
        "call_id": call.id,
        "name": call.function.name,
        "arguments": arguments,
        "status": status,
    })
}

/// The output items of a whole answer: its thinking as a reasoning item (when it thought),
/// its text as a message (left out when it is blank and the answer called tools or thought),
/// then its calls.
pub fn output_items(answer: &Collected) -> Vec<Value> {
    let mut items = Vec::with_capacity(2 + answer.calls.len());
    if !answer.thinking.is_empty() {
        items.push(reasoning_item(
            &new_id("rs", ID_DIGITS),
            &answer.thinking,
            "completed",
        ));
    }
    if !answer.text.trim().is_empty() || (answer.calls.is_empty() && answer.thinking.is_empty()) {
        items.push(message_item(
            &new_id("msg", ID_DIGITS),
            &answer.text,
            "completed",
        ));
    }
    for call in &answer.calls {
        items.push(call_item(
            &new_id("fc", ID_DIGITS),
            call,
            &call.function.arguments,
            "completed",
        ));
    }
    items
}

/// The assistant message of an answer in the chat shape (what a continuation replays), with
/// what it thought (for templates that render earlier thinking).
pub fn assistant_message(text: &str, calls: &[ToolCallOut], thinking: &str) -> ChatMessageIn {
    let mut message = ChatMessageIn::text("assistant", text);
    message.reasoning_content = (!thinking.is_empty()).then(|| thinking.to_string());
    if !calls.is_empty() {
        let calls = calls.iter().map(|c| {
            let arguments = Value::from(c.function.arguments.as_str());
            ToolCallIn::function(&c.id, &c.function.name, arguments)
        });
        message.tool_calls = Some(calls.collect());
    }
    message
}
