//! The one typed request every API's generation goes down the shared path as: a
//! conversation (`messages`, with text or text parts, earlier tool calls and tool results),
//! `tools` and `tool_choice`, `logprobs`, `response_format`, the template's variables and the
//! fields every generation reads ([`CommonFields`]). It has the shape of a
//! `POST /v1/chat/completions` body, which that route reads as it is; the Responses and
//! Messages APIs translate theirs into it.

use serde::{Deserialize, Serialize};

use crate::server::settings::fields::{CommonFields, HasCommonFields};

/// Content of a chat message: text, or a list of parts.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(untagged)]
pub enum MessageContent {
    /// Plain text.
    Text(String),
    /// Typed parts; only `text` parts are supported.
    Parts(Vec<ContentPart>),
}

/// One part of a message's content.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct ContentPart {
    /// `text` (others are refused).
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a `text` part.
    pub text: Option<String>,
}

/// One chat message of a request.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct ChatMessageIn {
    /// `system`, `developer`, `user`, `assistant` or `tool`.
    pub role: String,
    /// Its content (absent for tool-call messages).
    pub content: Option<MessageContent>,
    /// The calls an assistant message made.
    pub tool_calls: Option<Vec<ToolCallIn>>,
    /// The call a `tool` message answers.
    pub tool_call_id: Option<String>,
    /// The function a `tool` message answers for (optional).
    pub name: Option<String>,
    /// What an assistant message thought before it (vLLM's `reasoning_content`, or
    /// `reasoning`): shown to templates that render earlier thinking, as `reasoning_content`
    /// and `thinking`.
    #[serde(alias = "reasoning")]
    pub reasoning_content: Option<String>,
}

/// A tool call of an earlier assistant message.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct ToolCallIn {
    /// The call's id.
    pub id: Option<String>,
    /// `function`.
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// What was called.
    pub function: FunctionCallIn,
}

/// The function and arguments of a tool call in a request.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct FunctionCallIn {
    /// Function name.
    pub name: String,
    /// Arguments: a JSON object as a string (OpenAI's shape), or the object itself.
    pub arguments: Option<serde_json::Value>,
}

/// A chat request (the body of `POST /v1/chat/completions`).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ChatRequest {
    /// The conversation.
    pub messages: Option<Vec<ChatMessageIn>>,
    /// Fields shared with completions (read in a second pass, see [`HasCommonFields`]).
    #[serde(skip)]
    pub common: CommonFields,
    /// The newer name of `max_tokens`.
    pub max_completion_tokens: Option<usize>,
    /// Return log-probabilities of the chosen tokens.
    pub logprobs: Option<bool>,
    /// Alternatives per token with `logprobs`.
    pub top_logprobs: Option<usize>,
    /// Functions the model may call (`[{"type": "function", "function": {...}}]`).
    pub tools: Option<serde_json::Value>,
    /// `none`, `auto`, `required`, or `{"type": "function", "function": {"name": ...}}`.
    pub tool_choice: Option<serde_json::Value>,
    /// Whether one answer may hold several calls (default true).
    pub parallel_tool_calls: Option<bool>,
    /// Output format; only `text` is supported.
    pub response_format: Option<serde_json::Value>,
    /// Extra variables for the chat template (an object, e.g. `{"enable_thinking": false}`),
    /// over the server's `--default-chat-template-kwargs`.
    pub chat_template_kwargs: Option<serde_json::Value>,
    /// Thinking tokens at most (vLLM's name; needs `--reasoning-parser`): then the server
    /// ends the thinking and the answer follows.
    pub thinking_token_budget: Option<serde_json::Value>,
    /// `low`, `medium` or `high` (OpenAI's field): passed to the chat template as
    /// `reasoning_effort` (gpt-oss's `Reasoning:` line), under `chat_template_kwargs`' own.
    pub reasoning_effort: Option<serde_json::Value>,
}

impl ChatMessageIn {
    /// A message of `role` with text `content`.
    pub fn text(role: &str, content: impl Into<String>) -> Self {
        Self {
            role: role.to_string(),
            content: Some(MessageContent::Text(content.into())),
            ..Self::default()
        }
    }
}

impl ToolCallIn {
    /// A call of function `name` with `arguments` (an object, or a string holding one),
    /// under `id`.
    pub fn function(id: &str, name: &str, arguments: serde_json::Value) -> Self {
        Self {
            id: Some(id.to_string()),
            kind: Some("function".into()),
            function: FunctionCallIn {
                name: name.to_string(),
                arguments: Some(arguments),
            },
        }
    }
}

impl HasCommonFields for ChatRequest {
    fn common_mut(&mut self) -> &mut CommonFields {
        &mut self.common
    }
}
