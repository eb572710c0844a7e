//! A `POST /v1/responses` body read and turned into the typed request of the one
//! generation path (`server::request`): `instructions` as the system message, the stored conversation
//! of `previous_response_id` after it, then the `input` items (messages with text parts,
//! `function_call` items as an assistant's tool calls, `function_call_output` items as tool
//! messages); function `tools` in the chat shape, `tool_choice`, `text.format` as
//! `response_format`, `max_output_tokens` as `max_tokens`, and the sampling, `speculation`,
//! `prediction` and `cache_salt` fields as they are; `reasoning.effort` as the template's
//! `reasoning_effort`, beside `chat_template_kwargs` and `thinking_token_budget`. Tools only the server could run
//! (`web_search`, `file_search`, computer use, ...) are refused with a 400 that says so.

use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::server::adapter::{
    chat_tools, string_field, template_kwargs, text_of, typed, Rename, TextParts,
};
use crate::server::error::{ApiError, ApiResult};
use crate::server::pipeline::REASONING_EFFORTS;
use crate::server::request::{ChatMessageIn, ChatRequest, ToolCallIn};
use crate::server::settings::fields::{CommonFields, SpeculationField};

/// The fields of a Responses request thicket reads (others are ignored, as OpenAI's own
/// optional fields are when they do not apply).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ResponsesRequest {
    /// The served model's name.
    pub model: Option<String>,
    /// A string, or a list of input items.
    pub input: Option<Value>,
    /// The system message.
    pub instructions: Option<String>,
    /// Function tools.
    pub tools: Option<Vec<Value>>,
    /// `none`, `auto`, `required` or `{"type": "function", "name": ...}`.
    pub tool_choice: Option<Value>,
    /// Whether one answer may hold several calls.
    pub parallel_tool_calls: Option<bool>,
    /// `{"format": {...}}`.
    pub text: Option<Value>,
    /// Output tokens at most.
    pub max_output_tokens: Option<usize>,
    /// Sampling temperature (as given: the response echoes it).
    pub temperature: Option<Value>,
    /// Nucleus sampling (as given).
    pub top_p: Option<Value>,
    /// Stream typed events.
    pub stream: Option<bool>,
    /// Keep the response for `GET` and `previous_response_id` (default true).
    pub store: Option<bool>,
    /// The response this one continues.
    pub previous_response_id: Option<String>,
    /// Returned as given.
    pub metadata: Option<Value>,
    /// The end user (logged only).
    pub user: Option<String>,
    /// Run in the background (not supported).
    pub background: Option<bool>,
    /// thicket's speculation object, vLLM's sampling extensions, Predicted Outputs and
    /// `cache_salt`: passed on as the chat endpoint reads them.
    pub speculation: Option<SpeculationField>,
    /// Predicted Outputs.
    pub prediction: Option<Value>,
    /// vLLM's `cache_salt`.
    pub cache_salt: Option<Value>,
    /// Seed of the random choices.
    pub seed: Option<i64>,
    /// Keep the k most likely tokens.
    pub top_k: Option<i64>,
    /// `{"effort": ...}`: passed to the chat template as `reasoning_effort`.
    pub reasoning: Option<Value>,
    /// Extra variables for the chat template, as the chat endpoint takes them.
    pub chat_template_kwargs: Option<Value>,
    /// Thinking tokens at most (vLLM's name), as the chat endpoint takes it.
    pub thinking_token_budget: Option<Value>,
}

/// `reasoning.effort`, when given: a string.
pub fn reasoning_effort(reasoning: Option<&Value>) -> ApiResult<Option<Value>> {
    let effort = match reasoning.filter(|r| !r.is_null()) {
        None => return Ok(None),
        Some(r) if r.is_object() => r.get("effort").filter(|e| !e.is_null()),
        Some(_) => return Err(ApiError::invalid("reasoning", "must be an object")),
    };
    match effort {
        None => Ok(None),
        Some(Value::String(e)) if REASONING_EFFORTS.contains(&e.as_str()) => {
            Ok(Some(Value::from(e.clone())))
        }
        Some(_) => Err(ApiError::invalid(
            "reasoning.effort",
            format!("must be one of {}", REASONING_EFFORTS.join(", ")),
        )),
    }
}

/// Tool types that only a server running them could offer.
const HOSTED_TOOLS: [&str; 9] = [
    "web_search",
    "web_search_preview",
    "file_search",
    "computer_use_preview",
    "computer_use",
    "code_interpreter",
    "image_generation",
    "mcp",
    "local_shell",
];

/// How the API's content holds text: `input_text`, `output_text` or `text` parts, and
/// `refusal` parts by their `refusal`.
const TEXT_PARTS: TextParts = TextParts {
    kinds: &["input_text", "output_text", "text"],
    refusal: true,
    list: "text parts",
    unsupported: |kind| format!("content parts of type {kind:?} are not supported; only text"),
};

/// The typed request of a Responses request, and its conversation.
pub struct ChatForm {
    /// The request down the shared path.
    pub request: ChatRequest,
    /// The conversation without the system message: what a later response continues.
    pub conversation: Vec<ChatMessageIn>,
}

/// The text of a `reasoning` input item: its `reasoning_text` parts, or else its summary.
fn reasoning_text(item: &Value) -> String {
    let texts = |key: &str| -> Vec<&str> {
        item.get(key)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|part| part.get("text").and_then(Value::as_str))
            .collect()
    };
    let content = texts("content");
    if content.is_empty() {
        texts("summary").join("\n\n")
    } else {
        content.concat()
    }
}

/// The chat messages of `input` appended to `messages`.
pub fn input_messages(input: &Value, messages: &mut Vec<ChatMessageIn>) -> ApiResult<()> {
    let items = match input {
        Value::String(text) => {
            messages.push(ChatMessageIn::text("user", text.as_str()));
            return Ok(());
        }
        Value::Array(items) => items,
        _ => {
            return Err(ApiError::invalid(
                "input",
                "input must be a string or a list of input items",
            ))
        }
    };
    let mut thought = String::new();
    for (i, item) in items.iter().enumerate() {
        let param = format!("input[{i}]");
        let kind =
            match item.get("type").and_then(Value::as_str) {
                Some(kind) => kind,
                None if item.get("role").is_some() => "message",
                None => return Err(ApiError::invalid(
                    param,
                    "an input item needs a `type` (message, function_call, function_call_output)",
                )),
            };
        match kind {
            "message" => {
                let role = string_field(item, "role", &param, &param)?;
                if !["user", "system", "developer", "assistant"].contains(&role) {
                    return Err(ApiError::invalid(
                        format!("{param}.role"),
                        format!("unknown role {role:?}: use user, system, developer or assistant"),
                    ));
                }
                let content = item.get("content").unwrap_or(&Value::Null);
                let text = text_of(content, &format!("{param}.content"), &TEXT_PARTS)?;
                let mut message = ChatMessageIn::text(role, text);
                if role == "assistant" && !thought.is_empty() {
                    message.reasoning_content = Some(std::mem::take(&mut thought));
                }
                messages.push(message);
            }
            "function_call" => {
                let call_id = string_field(item, "call_id", &param, &param)?;
                let name = string_field(item, "name", &param, &param)?;
                let arguments = string_field(item, "arguments", &param, &param)?;
                let call = ToolCallIn::function(call_id, name, Value::from(arguments));
                // Calls right after an assistant's message (or its other calls) join it.
                match messages.last_mut() {
                    Some(last) if last.role == "assistant" => {
                        last.tool_calls.get_or_insert_with(Vec::new).push(call)
                    }
                    _ => messages.push(ChatMessageIn {
                        role: "assistant".into(),
                        tool_calls: Some(vec![call]),
                        reasoning_content: (!thought.is_empty())
                            .then(|| std::mem::take(&mut thought)),
                        ..ChatMessageIn::default()
                    }),
                }
            }
            "function_call_output" => {
                let call_id = string_field(item, "call_id", &param, &param)?;
                let output = item.get("output").unwrap_or(&Value::Null);
                let text = text_of(output, &format!("{param}.output"), &TEXT_PARTS)?;
                let mut message = ChatMessageIn::text("tool", text);
                message.tool_call_id = Some(call_id.to_string());
                messages.push(message);
            }
            // What the model thought before the assistant's next message or call: shown to
            // templates that render earlier thinking.
            "reasoning" => thought.push_str(&reasoning_text(item)),
            other => {
                return Err(ApiError::invalid(
                    format!("{param}.type"),
                    format!(
                        "input items of type {other:?} are not supported: use message, \
                         function_call or function_call_output"
                    ),
                ))
            }
        }
    }
    Ok(())
}

/// A function tool's `function` object in the chat shape; tools of other types refused.
fn function_of(i: usize, tool: &Value) -> ApiResult<Map<String, Value>> {
    let kind = tool.get("type").and_then(Value::as_str).unwrap_or("");
    if HOSTED_TOOLS.contains(&kind) {
        return Err(ApiError::invalid(
            format!("tools[{i}].type"),
            format!(
                "tool type {kind:?} needs the server to run the tool, which thicket does \
                 not do; offer function tools and run them in the client"
            ),
        ));
    }
    if kind != "function" {
        return Err(ApiError::invalid(
            format!("tools[{i}].type"),
            format!("unknown tool type {kind:?}: thicket serves function tools"),
        ));
    }
    let mut function = Map::new();
    for field in ["name", "description", "parameters", "strict"] {
        if let Some(v) = tool.get(field).filter(|v| !v.is_null()) {
            function.insert(field.to_string(), v.clone());
        }
    }
    Ok(function)
}

/// `tool_choice` in the chat shape.
fn chat_tool_choice(choice: &Value) -> ApiResult<Value> {
    match choice {
        Value::String(_) => Ok(choice.clone()),
        Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("function") => {
            let name = o.get("name").and_then(Value::as_str).ok_or_else(|| {
                ApiError::invalid("tool_choice.name", "a function tool_choice needs a `name`")
            })?;
            Ok(json!({"type": "function", "function": {"name": name}}))
        }
        _ => Err(ApiError::invalid(
            "tool_choice",
            "tool_choice must be none, auto, required or {\"type\": \"function\", \"name\": ...}",
        )),
    }
}

/// `text.format` as a chat `response_format`.
fn response_format(text: &Value) -> ApiResult<Option<Value>> {
    let Some(format) = text.get("format").filter(|f| !f.is_null()) else {
        return Ok(None);
    };
    let kind = format.get("type").and_then(Value::as_str).ok_or_else(|| {
        ApiError::invalid(
            "text.format.type",
            "text.format needs a `type`: text, json_object or json_schema",
        )
    })?;
    match kind {
        "text" => Ok(None),
        "json_object" => Ok(Some(json!({"type": "json_object"}))),
        "json_schema" => {
            let mut spec = Map::new();
            for field in ["name", "schema", "strict", "description"] {
                if let Some(v) = format.get(field).filter(|v| !v.is_null()) {
                    spec.insert(field.to_string(), v.clone());
                }
            }
            Ok(Some(json!({"type": "json_schema", "json_schema": spec})))
        }
        other => Err(ApiError::invalid(
            "text.format.type",
            format!("unknown text.format type {other:?}: use text, json_object or json_schema"),
        )),
    }
}

impl ResponsesRequest {
    /// The typed request of this one after `history` (the conversation a previous response
    /// left; empty without one).
    pub fn chat_form(&self, history: Vec<ChatMessageIn>) -> ApiResult<ChatForm> {
        if self.background == Some(true) {
            return Err(ApiError::invalid(
                "background",
                "background responses are not supported; send the request and wait, or stream it",
            ));
        }
        let input = self
            .input
            .as_ref()
            .ok_or_else(|| ApiError::invalid("input", "input is required"))?;
        let mut conversation = history;
        input_messages(input, &mut conversation)?;
        let mut messages = Vec::with_capacity(conversation.len() + 1);
        if let Some(instructions) = self.instructions.as_ref().filter(|i| !i.is_empty()) {
            messages.push(ChatMessageIn::text("system", instructions.as_str()));
        }
        messages.extend(conversation.iter().cloned());
        let mut request = ChatRequest {
            messages: Some(messages),
            common: CommonFields {
                model: self.model.clone(),
                max_tokens: self.max_output_tokens,
                temperature: typed(self.temperature.as_ref(), "temperature")?,
                top_p: typed(self.top_p.as_ref(), "top_p")?,
                user: self.user.clone(),
                speculation: self.speculation.clone(),
                prediction: self.prediction.clone(),
                cache_salt: self.cache_salt.clone(),
                seed: self.seed,
                top_k: self.top_k,
                ..CommonFields::default()
            },
            parallel_tool_calls: self.parallel_tool_calls,
            thinking_token_budget: self.thinking_token_budget.clone(),
            ..ChatRequest::default()
        };
        if let Some(tools) = self.tools.as_ref().filter(|t| !t.is_empty()) {
            request.tools = Some(chat_tools(tools, function_of)?);
        }
        if let Some(choice) = &self.tool_choice {
            request.tool_choice = Some(chat_tool_choice(choice)?);
        }
        if let Some(text) = &self.text {
            request.response_format = response_format(text)?;
        }
        let implied = reasoning_effort(self.reasoning.as_ref())?
            .map(|effort| vec![("reasoning_effort", effort)])
            .unwrap_or_default();
        request.chat_template_kwargs = template_kwargs(self.chat_template_kwargs.as_ref(), implied);
        Ok(ChatForm {
            request,
            conversation,
        })
    }
}

/// The chat path's fields as the Responses API names them.
pub const FIELD_NAMES: &[Rename] = &[
    Rename::Field("max_tokens", "max_output_tokens"),
    Rename::Field("response_format", "text.format"),
    Rename::Under("messages", "input"),
    Rename::InTools(".function", ""),
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::adapter::renamed;

    fn request(body: Value) -> ResponsesRequest {
        serde_json::from_value(body).expect("a request")
    }

    #[test]
    fn items_become_chat_messages_and_calls_join_their_message() {
        let r = request(json!({
            "instructions": "be brief",
            "input": [
                {"role": "user", "content": "weather?"},
                {"type": "message", "role": "assistant",
                 "content": [{"type": "output_text", "text": "checking"}]},
                {"type": "function_call", "call_id": "c1", "name": "get", "arguments": "{}"},
                {"type": "function_call", "call_id": "c2", "name": "get", "arguments": "{\"a\":1}"},
                {"type": "reasoning", "summary": []},
                {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            ],
            "max_output_tokens": 7,
            "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
            "tools": [{"type": "function", "name": "get", "parameters": {"type": "object"}}],
            "tool_choice": {"type": "function", "name": "get"},
        }));
        let history = vec![ChatMessageIn::text("user", "earlier")];
        let form = r.chat_form(history).expect("converts");
        let request = form.request;
        let messages = serde_json::to_value(request.messages.expect("messages")).expect("JSON");
        let messages = messages.as_array().expect("messages");
        assert_eq!(
            (&messages[0]["role"], &messages[0]["content"]),
            (&json!("system"), &json!("be brief"))
        );
        assert_eq!(messages[1]["content"], "earlier");
        assert_eq!(messages[3]["content"], "checking");
        assert_eq!(messages[3]["tool_calls"].as_array().map(Vec::len), Some(2));
        assert_eq!(messages[4]["role"], "tool");
        assert_eq!(messages[4]["tool_call_id"], "c1");
        assert_eq!(messages.len(), 5);
        // The stored conversation leaves the instructions out.
        assert_eq!(form.conversation.len(), 4);
        assert_eq!(request.common.max_tokens, Some(7));
        let format = request.response_format.expect("a format");
        assert_eq!(format["json_schema"]["name"], "x");
        assert_eq!(request.tools.expect("tools")[0]["function"]["name"], "get");
        let choice = request.tool_choice.expect("a choice");
        assert_eq!(choice["function"]["name"], "get");
    }

    #[test]
    fn hosted_tools_and_unknown_items_are_refused_by_field() {
        let hosted = request(json!({"input": "hi", "tools": [{"type": "web_search"}]}));
        let e = hosted.chat_form(Vec::new()).err().expect("refused");
        assert_eq!(e.param.as_deref(), Some("tools[0].type"));
        assert!(e.message.contains("run the tool"), "{}", e.message);
        let image = request(json!({"input": [{"role": "user",
            "content": [{"type": "input_image", "image_url": "x"}]}]}));
        let e = image.chat_form(Vec::new()).err().expect("refused");
        assert_eq!(e.param.as_deref(), Some("input[0].content[0]"));
        let missing = request(json!({"model": "m"}));
        let e = missing.chat_form(Vec::new()).err().expect("refused");
        assert_eq!(e.param.as_deref(), Some("input"));
        let call = request(json!({"input": [{"type": "function_call", "name": "f"}]}));
        let e = call.chat_form(Vec::new()).err().expect("refused");
        assert_eq!(e.param.as_deref(), Some("input[0].call_id"));
        let e = renamed(ApiError::invalid("max_tokens", "too many"), FIELD_NAMES);
        assert_eq!(e.param.as_deref(), Some("max_output_tokens"));
    }
}
