//! A `POST /v1/messages` (or `/v1/messages/count_tokens`) body read and turned into the
//! typed request of the one generation path (`server::request`): `system` (a string or text
//! blocks) as the system message; each message's `text` blocks as its content, an
//! assistant's `tool_use` blocks as its tool calls, a user's `tool_result` blocks as tool
//! messages before its text; `tools` with `input_schema` as function tools; `tool_choice`
//! (`auto`, `any`, `tool`, `none`, `disable_parallel_tool_use`); `output_config.format`
//! (a JSON schema) as `response_format`; `thinking` as the template's `enable_thinking` and a
//! thinking budget, beside `chat_template_kwargs`; `max_tokens`,
//! `stop_sequences`, `temperature`, `top_p`, `top_k`, and thicket's `speculation`,
//! `prediction` and `cache_salt` as the chat endpoint reads them.

use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::server::adapter::{
    chat_tools, string_field, template_kwargs, text_of, Rename, TextParts,
};
use crate::server::error::{ApiError, ApiResult};
use crate::server::request::{ChatMessageIn, ChatRequest, ToolCallIn};
use crate::server::settings::fields::{CommonFields, OneOrMany, SpeculationField};

/// The fields of a Messages request thicket reads.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct MessagesRequest {
    /// The served model's name.
    pub model: Option<String>,
    /// The conversation.
    pub messages: Option<Vec<Value>>,
    /// The system prompt: a string or text blocks.
    pub system: Option<Value>,
    /// Output tokens at most (required to generate).
    pub max_tokens: Option<usize>,
    /// Strings that end the answer.
    pub stop_sequences: Option<Vec<String>>,
    /// Sampling temperature.
    pub temperature: Option<f32>,
    /// Nucleus sampling.
    pub top_p: Option<f32>,
    /// Keep the k most likely tokens.
    pub top_k: Option<i64>,
    /// Tools with `input_schema`.
    pub tools: Option<Vec<Value>>,
    /// `{"type": "auto" | "any" | "tool" | "none", ...}`.
    pub tool_choice: Option<Value>,
    /// Stream events.
    pub stream: Option<bool>,
    /// `{"format": {"type": "json_schema", "schema": {...}}}`: the answer is JSON valid
    /// against the schema (`effort` is ignored).
    pub output_config: Option<Value>,
    /// thicket's speculation object.
    pub speculation: Option<SpeculationField>,
    /// Predicted Outputs.
    pub prediction: Option<Value>,
    /// vLLM's `cache_salt`.
    pub cache_salt: Option<Value>,
    /// `{"type": "enabled", "budget_tokens": N}` (thinking at most N tokens) or
    /// `{"type": "disabled"}`: the template's `enable_thinking`, and the thinking budget.
    pub thinking: Option<Value>,
    /// Extra variables for the chat template, as the chat endpoint takes them.
    pub chat_template_kwargs: Option<Value>,
}

/// `thinking`: whether the model should think (`None`: the template's default) and its
/// budget.
fn thinking(config: &Value, max_tokens: Option<usize>) -> ApiResult<(Option<bool>, Option<Value>)> {
    match config.get("type").and_then(Value::as_str) {
        Some("disabled") => Ok((Some(false), None)),
        Some("adaptive") => Ok((Some(true), None)),
        Some("enabled") => {
            let budget = config.get("budget_tokens").ok_or_else(|| {
                ApiError::invalid(
                    "thinking.budget_tokens",
                    "enabled thinking needs budget_tokens",
                )
            })?;
            let tokens = budget.as_u64().ok_or_else(|| {
                ApiError::invalid("thinking.budget_tokens", "must be a non-negative integer")
            })?;
            if max_tokens.is_some_and(|m| tokens >= m as u64) {
                return Err(ApiError::invalid(
                    "thinking.budget_tokens",
                    "must be less than max_tokens (the answer follows the thinking within it)",
                ));
            }
            Ok((Some(true), Some(budget.clone())))
        }
        other => Err(ApiError::invalid(
            "thinking.type",
            format!(
                "unknown thinking type {:?}: use enabled, disabled or adaptive",
                other.unwrap_or("")
            ),
        )),
    }
}

/// How a `tool_result`'s or the system's content holds text: a string or `text` blocks.
const TEXT_BLOCKS: TextParts = TextParts {
    kinds: &["text"],
    refusal: false,
    list: "blocks",
    unsupported: |kind| format!("blocks of type {kind:?} are not supported here; only text"),
};

/// What needs a string field that is missing, in errors.
const BLOCK: &str = "this block";

/// The chat messages of one Messages message.
fn chat_messages(i: usize, message: &Value, out: &mut Vec<ChatMessageIn>) -> ApiResult<()> {
    let param = format!("messages[{i}]");
    let role = string_field(message, "role", &param, BLOCK)?;
    if role != "user" && role != "assistant" {
        return Err(ApiError::invalid(
            format!("{param}.role"),
            format!("unknown role {role:?}: use user or assistant (system goes in `system`)"),
        ));
    }
    let content = message.get("content").unwrap_or(&Value::Null);
    let blocks = match content {
        Value::String(text) => {
            out.push(ChatMessageIn::text(role, text.as_str()));
            return Ok(());
        }
        Value::Array(blocks) => blocks,
        _ => {
            return Err(ApiError::invalid(
                format!("{param}.content"),
                "content must be a string or a list of blocks",
            ))
        }
    };
    let mut text = String::new();
    let mut thought = String::new();
    let mut calls = Vec::new();
    for (j, block) in blocks.iter().enumerate() {
        let at = format!("{param}.content[{j}]");
        let kind = block.get("type").and_then(Value::as_str).unwrap_or("");
        match (role, kind) {
            (_, "text") => text.push_str(string_field(block, "text", &at, BLOCK)?),
            ("assistant", "tool_use") => {
                let id = string_field(block, "id", &at, BLOCK)?;
                let name = string_field(block, "name", &at, BLOCK)?;
                let input = block.get("input").cloned().unwrap_or_else(|| json!({}));
                if !input.is_object() {
                    return Err(ApiError::invalid(
                        format!("{at}.input"),
                        "a tool_use input must be a JSON object",
                    ));
                }
                calls.push(ToolCallIn::function(id, name, input));
            }
            ("user", "tool_result") => {
                let id = string_field(block, "tool_use_id", &at, BLOCK)?;
                let content = block.get("content").unwrap_or(&Value::Null);
                let mut result = text_of(content, &format!("{at}.content"), &TEXT_BLOCKS)?;
                if block.get("is_error").and_then(Value::as_bool) == Some(true) {
                    result = format!("Error: {result}");
                }
                let mut message = ChatMessageIn::text("tool", result);
                message.tool_call_id = Some(id.to_string());
                out.push(message);
            }
            // What the model thought: shown to templates that render earlier thinking (a
            // redacted block holds nothing thicket can read).
            ("assistant", "thinking") => {
                thought.push_str(string_field(block, "thinking", &at, BLOCK)?)
            }
            ("assistant", "redacted_thinking") => {}
            (_, kind) => {
                return Err(ApiError::invalid(
                    format!("{at}.type"),
                    format!("{role} blocks of type {kind:?} are not supported: use text, tool_use (assistant) or tool_result (user)"),
                ))
            }
        }
    }
    if role == "assistant" {
        let mut message = ChatMessageIn::text("assistant", text);
        message.tool_calls = (!calls.is_empty()).then_some(calls);
        message.reasoning_content = (!thought.is_empty()).then_some(thought);
        out.push(message);
    } else if !text.is_empty() || !blocks.iter().any(|b| b["type"] == "tool_result") {
        out.push(ChatMessageIn::text("user", text));
    }
    Ok(())
}

/// A tool's `function` object in the chat shape: its name, description and `input_schema`
/// as the parameters; tools of other types (server tools) refused.
fn function_of(i: usize, tool: &Value) -> ApiResult<Map<String, Value>> {
    let kind = tool.get("type").and_then(Value::as_str).unwrap_or("custom");
    if kind != "custom" {
        return Err(ApiError::invalid(
            format!("tools[{i}].type"),
            format!(
                "tool type {kind:?} is not supported: define the tool with a name and an \
                 input_schema, and run it in the client"
            ),
        ));
    }
    let name = string_field(tool, "name", &format!("tools[{i}]"), BLOCK)?;
    let schema = tool.get("input_schema").ok_or_else(|| {
        ApiError::invalid(
            format!("tools[{i}].input_schema"),
            "a tool needs an input_schema",
        )
    })?;
    let mut function = Map::new();
    function.insert("name".into(), json!(name));
    if let Some(d) = tool.get("description").filter(|d| !d.is_null()) {
        function.insert("description".into(), d.clone());
    }
    function.insert("parameters".into(), schema.clone());
    Ok(function)
}

/// `tool_choice` as the chat fields `tool_choice` and `parallel_tool_calls`.
fn chat_tool_choice(choice: &Value) -> ApiResult<(Value, Option<bool>)> {
    let kind = choice.get("type").and_then(Value::as_str).ok_or_else(|| {
        ApiError::invalid(
            "tool_choice.type",
            "tool_choice needs a `type`: auto, any, tool or none",
        )
    })?;
    let parallel = choice
        .get("disable_parallel_tool_use")
        .and_then(Value::as_bool)
        .map(|d| !d);
    let chat = match kind {
        "auto" => json!("auto"),
        "any" => json!("required"),
        "none" => json!("none"),
        "tool" => {
            let name = string_field(choice, "name", "tool_choice", BLOCK)?;
            json!({"type": "function", "function": {"name": name}})
        }
        other => {
            return Err(ApiError::invalid(
                "tool_choice.type",
                format!("unknown tool_choice type {other:?}: use auto, any, tool or none"),
            ))
        }
    };
    Ok((chat, parallel))
}

/// `output_config.format` as a chat `response_format`.
fn output_format(config: &Value) -> ApiResult<Option<Value>> {
    let Some(format) = config.get("format").filter(|f| !f.is_null()) else {
        return Ok(None);
    };
    match format.get("type").and_then(Value::as_str) {
        Some("json_schema") => {
            let schema = format.get("schema").ok_or_else(|| {
                ApiError::invalid(
                    "output_config.format.schema",
                    "a json_schema format needs a `schema`",
                )
            })?;
            Ok(Some(json!({"type": "json_schema",
                           "json_schema": {"name": "output", "schema": schema, "strict": true}})))
        }
        other => Err(ApiError::invalid(
            "output_config.format.type",
            format!(
                "unknown output format type {:?}: use json_schema",
                other.unwrap_or("")
            ),
        )),
    }
}

impl MessagesRequest {
    /// The typed request of this one; `generating` asks for `max_tokens` (a count of tokens
    /// needs none).
    pub fn chat_request(&self, generating: bool) -> ApiResult<ChatRequest> {
        let messages = self
            .messages
            .as_ref()
            .ok_or_else(|| ApiError::invalid("messages", "messages is required"))?;
        if messages.is_empty() {
            return Err(ApiError::invalid("messages", "messages must not be empty"));
        }
        if generating && self.max_tokens.is_none() {
            return Err(ApiError::invalid("max_tokens", "max_tokens is required"));
        }
        let mut chat = Vec::with_capacity(messages.len() + 1);
        if let Some(system) = self.system.as_ref() {
            let text = text_of(system, "system", &TEXT_BLOCKS)?;
            if !text.is_empty() {
                chat.push(ChatMessageIn::text("system", text));
            }
        }
        for (i, message) in messages.iter().enumerate() {
            chat_messages(i, message, &mut chat)?;
        }
        let mut request = ChatRequest {
            messages: Some(chat),
            common: CommonFields {
                model: self.model.clone(),
                max_tokens: self.max_tokens,
                stop: self.stop_sequences.clone().map(OneOrMany::Many),
                temperature: self.temperature,
                top_p: self.top_p,
                top_k: self.top_k,
                speculation: self.speculation.clone(),
                prediction: self.prediction.clone(),
                cache_salt: self.cache_salt.clone(),
                ..CommonFields::default()
            },
            ..ChatRequest::default()
        };
        if let Some(tools) = self.tools.as_ref().filter(|t| !t.is_empty()) {
            request.tools = Some(chat_tools(tools, function_of)?);
        }
        if let Some(choice) = &self.tool_choice {
            let (choice, parallel) = chat_tool_choice(choice)?;
            request.tool_choice = Some(choice);
            request.parallel_tool_calls = parallel;
        }
        if let Some(config) = &self.output_config {
            request.response_format = output_format(config)?;
        }
        let mut implied = Vec::new();
        if let Some(config) = self.thinking.as_ref().filter(|t| !t.is_null()) {
            let (enable, budget) = thinking(config, self.max_tokens)?;
            if let Some(enable) = enable {
                implied.push(("enable_thinking", Value::from(enable)));
            }
            request.thinking_token_budget = budget;
        }
        request.chat_template_kwargs = template_kwargs(self.chat_template_kwargs.as_ref(), implied);
        Ok(request)
    }
}

/// The chat path's fields as the Messages API names them.
pub const FIELD_NAMES: &[Rename] = &[
    Rename::Field("stop", "stop_sequences"),
    Rename::Field("response_format", "output_config.format"),
    Rename::Field("thinking_token_budget", "thinking.budget_tokens"),
    Rename::InTools(".function.parameters", ".input_schema"),
    Rename::InTools(".function", ""),
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::adapter::renamed;

    fn request(body: Value) -> MessagesRequest {
        serde_json::from_value(body).expect("a request")
    }

    #[test]
    fn blocks_become_chat_messages() {
        let r = request(json!({
            "system": [{"type": "text", "text": "be brief"}],
            "max_tokens": 9,
            "messages": [
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "checking"},
                    {"type": "tool_use", "id": "t1", "name": "get", "input": {"city": "Oslo"}},
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": "sunny"},
                    {"type": "tool_result", "tool_use_id": "t2", "is_error": true,
                     "content": [{"type": "text", "text": "boom"}]},
                ]},
            ],
            "stop_sequences": ["END"],
            "tools": [{"name": "get", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
        }));
        let request = r.chat_request(true).expect("converts");
        let messages = serde_json::to_value(request.messages.expect("messages")).expect("JSON");
        let messages = messages.as_array().expect("messages");
        assert_eq!(
            (&messages[0]["role"], &messages[0]["content"]),
            (&json!("system"), &json!("be brief"))
        );
        assert_eq!(
            messages[2]["tool_calls"][0]["function"]["arguments"]["city"],
            "Oslo"
        );
        assert_eq!(messages[3]["tool_call_id"], "t1");
        assert_eq!(messages[4]["content"], "Error: boom");
        // Tool results alone: no empty user message after them.
        assert_eq!(messages.len(), 5);
        assert!(matches!(request.common.stop, Some(OneOrMany::Many(ref s)) if s == &["END"]));
        assert_eq!(request.tool_choice, Some(json!("required")));
        assert_eq!(request.parallel_tool_calls, Some(false));
        let tools = request.tools.expect("tools");
        assert_eq!(tools[0]["function"]["parameters"]["type"], "object");
    }

    #[test]
    fn bad_requests_name_the_field() {
        let no_max = request(json!({"messages": [{"role": "user", "content": "hi"}]}));
        let e = no_max.chat_request(true).expect_err("refused");
        assert_eq!(e.param.as_deref(), Some("max_tokens"));
        assert!(
            no_max.chat_request(false).is_ok(),
            "counting needs no max_tokens"
        );
        let image = request(json!({"max_tokens": 5, "messages": [{"role": "user",
            "content": [{"type": "image", "source": {}}]}]}));
        let e = image.chat_request(true).expect_err("refused");
        assert_eq!(e.param.as_deref(), Some("messages[0].content[0].type"));
        let system = request(json!({"max_tokens": 5,
            "messages": [{"role": "system", "content": "x"}]}));
        let e = system.chat_request(true).expect_err("refused");
        assert_eq!(e.param.as_deref(), Some("messages[0].role"));
        let server_tool = request(json!({"max_tokens": 5,
            "messages": [{"role": "user", "content": "x"}],
            "tools": [{"type": "web_search_20250305", "name": "web_search"}]}));
        let e = server_tool.chat_request(true).expect_err("refused");
        assert_eq!(e.param.as_deref(), Some("tools[0].type"));
        let format = request(json!({"max_tokens": 5,
            "messages": [{"role": "user", "content": "x"}],
            "output_config": {"format": {"type": "xml"}}}));
        let e = format.chat_request(true).expect_err("refused");
        assert_eq!(e.param.as_deref(), Some("output_config.format.type"));
        let schema = request(json!({"max_tokens": 5,
            "messages": [{"role": "user", "content": "x"}],
            "output_config": {"effort": "low",
                              "format": {"type": "json_schema", "schema": {"type": "object"}}}}));
        let request = schema.chat_request(true).expect("converts");
        let format = request.response_format.expect("a format");
        assert_eq!(format["json_schema"]["schema"]["type"], "object");
        let e = renamed(ApiError::invalid("stop", "bad"), FIELD_NAMES);
        assert_eq!(e.param.as_deref(), Some("stop_sequences"));
    }
}
