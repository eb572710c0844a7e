//! The OpenAI wire format thicket speaks: request bodies of `/v1/completions` and
//! `/v1/chat/completions` (with vLLM's extra sampling fields and thicket's `speculation`
//! object), and the response, stream-chunk, usage and logprob objects sent back. Unknown
//! request fields are ignored, as OpenAI-compatible servers do.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A string or a list of them.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    /// One string.
    One(String),
    /// Several strings.
    Many(Vec<String>),
}

impl OneOrMany {
    /// The strings.
    pub fn into_vec(self) -> Vec<String> {
        match self {
            OneOrMany::One(s) => vec![s],
            OneOrMany::Many(v) => v,
        }
    }
}

/// A completion prompt: text, token ids, or a batch of either.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum PromptInput {
    /// One text prompt.
    Text(String),
    /// Several text prompts.
    Texts(Vec<String>),
    /// One prompt as token ids.
    Tokens(Vec<u32>),
    /// Several prompts as token ids.
    TokenLists(Vec<Vec<u32>>),
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a final chunk with the request's usage.
    pub include_usage: Option<bool>,
}

/// The `speculation` extension object.
#[derive(Debug, Clone, Deserialize)]
pub struct SpeculationField {
    /// `suffix`, `recycling`, `ngram_trie`, `prompt_lookup`, `draft_model`, `none` or `auto`.
    pub method: Option<String>,
    /// Most draft nodes per step.
    pub max_draft_tokens: Option<usize>,
}

/// Fields shared by both generation endpoints.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct CommonFields {
    /// The served model's name.
    pub model: Option<String>,
    /// Choices per prompt.
    pub n: Option<usize>,
    /// Output tokens at most.
    pub max_tokens: Option<usize>,
    /// Strings that end a choice.
    pub stop: Option<OneOrMany>,
    /// Sampling temperature, 0 = greedy.
    pub temperature: Option<f32>,
    /// Nucleus sampling.
    pub top_p: Option<f32>,
    /// Keep the k most likely tokens (-1 or 0 = all).
    pub top_k: Option<i64>,
    /// Drop tokens below this fraction of the most likely one.
    pub min_p: Option<f32>,
    /// Seed of the random choices.
    pub seed: Option<i64>,
    /// OpenAI presence penalty.
    pub presence_penalty: Option<f32>,
    /// OpenAI frequency penalty.
    pub frequency_penalty: Option<f32>,
    /// Repetition penalty over prompt and output (1 = off).
    pub repetition_penalty: Option<f32>,
    /// Token id (as a string) to bias added to its logit.
    pub logit_bias: Option<BTreeMap<String, f32>>,
    /// Stream server-sent events.
    pub stream: Option<bool>,
    /// Options of the stream.
    pub stream_options: Option<StreamOptions>,
    /// Keep going past end-of-sequence tokens.
    pub ignore_eos: Option<bool>,
    /// Token ids that end a choice.
    pub stop_token_ids: Option<Vec<u32>>,
    /// Output tokens before a stop condition may apply.
    pub min_tokens: Option<usize>,
    /// The end user (logged only).
    pub user: Option<String>,
    /// Speculation for this request.
    pub speculation: Option<SpeculationField>,
    /// A format the output must follow, in vLLM's shape: one of `json` (a schema),
    /// `json_object`, `regex`, `choice` or `grammar` (Lark).
    pub structured_outputs: Option<serde_json::Value>,
    /// What the client expects the output to be (OpenAI's Predicted Outputs: `{"type":
    /// "content", "content": text or text parts}`), read by [`super::convert::prediction`].
    pub prediction: Option<serde_json::Value>,
    /// vLLM's `cache_salt`: a non-empty string; the request shares cached prompt blocks only
    /// with requests that give the same one (or none, for none).
    pub cache_salt: Option<serde_json::Value>,
}

/// `POST /v1/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    /// The prompt(s).
    pub prompt: Option<PromptInput>,
    /// Fields shared with chat (read in a second pass, see [`HasCommonFields`]).
    #[serde(skip)]
    pub common: CommonFields,
    /// Return the prompt before the completion.
    pub echo: Option<bool>,
    /// Log-probabilities of the chosen token and this many alternatives.
    pub logprobs: Option<usize>,
    /// Text after the completion (not supported).
    pub suffix: Option<String>,
    /// Candidates to pick the best from (only `best_of == n` is supported).
    pub best_of: Option<usize>,
}

/// Content of a chat message: text, or a list of parts.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    /// Plain text.
    Text(String),
    /// Typed parts; only `text` parts are supported.
    Parts(Vec<ContentPart>),
}

/// One part of a message's content.
#[derive(Debug, Clone, Deserialize)]
pub struct ContentPart {
    /// `text` (others are refused).
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a `text` part.
    pub text: Option<String>,
}

/// One chat message of a request.
#[derive(Debug, Clone, Deserialize)]
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
}

/// A tool call of an earlier assistant message.
#[derive(Debug, Clone, Deserialize)]
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
#[derive(Debug, Clone, Deserialize)]
pub struct FunctionCallIn {
    /// Function name.
    pub name: String,
    /// Arguments: a JSON object as a string (OpenAI's shape), or the object itself.
    pub arguments: Option<serde_json::Value>,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, Deserialize)]
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
}

/// A request body that embeds [`CommonFields`]. They are parsed from the same JSON object
/// in a second pass rather than with `#[serde(flatten)]`, which would lose the path of a
/// field with a bad value.
pub trait HasCommonFields {
    /// Where the shared fields go.
    fn common_mut(&mut self) -> &mut CommonFields;
}

impl HasCommonFields for CompletionRequest {
    fn common_mut(&mut self) -> &mut CommonFields {
        &mut self.common
    }
}

impl HasCommonFields for ChatRequest {
    fn common_mut(&mut self) -> &mut CommonFields {
        &mut self.common
    }
}

/// `usage` of a response.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct UsageBody {
    /// Prompt tokens (each prompt counted once, whatever `n`).
    pub prompt_tokens: usize,
    /// Generated tokens over every choice.
    pub completion_tokens: usize,
    /// Their sum.
    pub total_tokens: usize,
    /// Prompt tokens served from the prefix cache.
    pub prompt_tokens_details: PromptTokensDetails,
    /// What became of the prediction's tokens.
    pub completion_tokens_details: CompletionTokensDetails,
}

/// `usage.completion_tokens_details`: of the tokens drafted from the request's `prediction`,
/// how many verification accepted (they are in the output) and rejected (drafted, then
/// found not to be what the model generates there). Both are 0 without a prediction.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct CompletionTokensDetails {
    /// Prediction tokens drafted and accepted.
    pub accepted_prediction_tokens: usize,
    /// Prediction tokens drafted and rejected.
    pub rejected_prediction_tokens: usize,
}

/// `usage.prompt_tokens_details`.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct PromptTokensDetails {
    /// Tokens read from the prefix cache.
    pub cached_tokens: usize,
}

/// The `thicket` extension object of a response: speculation statistics.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct ThicketBody {
    /// Totals over every choice.
    pub speculation: SpeculationStats,
}

/// Speculation totals.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct SpeculationStats {
    /// Verification steps that had draft tokens.
    pub verify_steps: usize,
    /// Draft tokens verified.
    pub draft_tokens: usize,
    /// Draft tokens accepted.
    pub accepted_tokens: usize,
    /// Tokens per verification step (the papers' MAT); 1 without speculation.
    pub mean_accepted_tokens: f64,
    /// The same per draft source that drafted (`prediction`, and `auto`'s sources apart).
    pub sources: BTreeMap<&'static str, SourceStats>,
}

/// One draft source's speculation totals.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct SourceStats {
    /// Verification steps of its trees.
    pub verify_steps: usize,
    /// Its draft tokens verified.
    pub draft_tokens: usize,
    /// Its draft tokens accepted.
    pub accepted_tokens: usize,
}

/// A completion choice's `logprobs` (the legacy completions shape).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct CompletionLogprobs {
    /// Each token's text.
    pub tokens: Vec<String>,
    /// Each token's log-probability.
    pub token_logprobs: Vec<f32>,
    /// The most likely alternatives at each position, text to log-probability.
    pub top_logprobs: Vec<BTreeMap<String, f32>>,
    /// Character offset of each token in the choice's text.
    pub text_offset: Vec<usize>,
}

/// One token's log-probability in the chat shape.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ChatTokenLogprob {
    /// The token's text.
    pub token: String,
    /// Its log-probability.
    pub logprob: f32,
    /// Its UTF-8 bytes.
    pub bytes: Vec<u8>,
    /// The most likely alternatives (empty inside alternatives).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_logprobs: Option<Vec<ChatTokenLogprob>>,
}

/// A chat choice's `logprobs`.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct ChatLogprobs {
    /// One entry per generated token.
    pub content: Vec<ChatTokenLogprob>,
    /// Always null (required by the OpenAI schema).
    pub refusal: Option<Vec<ChatTokenLogprob>>,
}

/// A completion choice.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CompletionChoice {
    /// Position among all choices (prompt * n + sample).
    pub index: usize,
    /// The text (with the prompt first under `echo`).
    pub text: String,
    /// Log-probabilities, when asked for.
    pub logprobs: Option<CompletionLogprobs>,
    /// `stop` or `length`; null until the last chunk of a stream.
    pub finish_reason: Option<&'static str>,
    /// The stop string or token id that ended the choice.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<serde_json::Value>,
}

/// An assistant message.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ChatMessageOut {
    /// Always `assistant`.
    pub role: &'static str,
    /// The generated text (null when the answer is only tool calls).
    pub content: Option<String>,
    /// Always null: thicket never refuses (the field is required by the OpenAI schema).
    pub refusal: Option<String>,
    /// The functions the model called.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallOut>,
}

/// A tool call in a response.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ToolCallOut {
    /// `call_...`, unique per call.
    pub id: String,
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The function and its arguments.
    pub function: FunctionCallOut,
}

/// The function of a tool call in a response.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct FunctionCallOut {
    /// Function name.
    pub name: String,
    /// Arguments, a JSON object as a string.
    pub arguments: String,
}

/// A tool call's piece of a streamed delta: the first names the call, later ones add
/// argument text.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ToolCallDelta {
    /// Which call of the choice (0, 1, ...).
    pub index: usize,
    /// The call's id (first piece).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `function` (first piece).
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    /// Name (first piece) and argument text.
    pub function: FunctionDelta,
}

/// The function part of a [`ToolCallDelta`].
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct FunctionDelta {
    /// Function name (first piece).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// More argument text.
    pub arguments: String,
}

/// A chat choice.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ChatChoice {
    /// Position among the choices.
    pub index: usize,
    /// The answer.
    pub message: ChatMessageOut,
    /// Log-probabilities, when asked for.
    pub logprobs: Option<ChatLogprobs>,
    /// `stop` or `length`.
    pub finish_reason: Option<&'static str>,
    /// The stop string or token id that ended the choice.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<serde_json::Value>,
}

/// The delta of a streamed chat choice.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct ChatDelta {
    /// `assistant` in the first chunk of a choice.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    /// New text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// Tool-call pieces.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

/// A streamed chat choice.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ChatChunkChoice {
    /// Position among the choices.
    pub index: usize,
    /// What is new.
    pub delta: ChatDelta,
    /// Log-probabilities of the new tokens, when asked for.
    pub logprobs: Option<ChatLogprobs>,
    /// Set in the choice's last chunk.
    pub finish_reason: Option<&'static str>,
    /// The stop string or token id that ended the choice.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<serde_json::Value>,
}

/// A whole response or one stream chunk: `object` tells which.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ResponseBody<C> {
    /// `cmpl-...` or `chatcmpl-...`, the same in every chunk of a stream.
    pub id: String,
    /// `text_completion`, `chat.completion` or `chat.completion.chunk`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// The served model's name.
    pub model: String,
    /// The choices.
    pub choices: Vec<C>,
    /// Token counts (in a stream: null, then the last chunk under `include_usage`).
    #[serde(skip_serializing_if = "Skip::skip")]
    pub usage: Skip<UsageBody>,
    /// Speculation statistics (whole responses and the usage chunk).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thicket: Option<ThicketBody>,
}

/// A field that is left out, sent as null, or sent with a value.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Skip<T> {
    /// Not in the JSON.
    #[default]
    Absent,
    /// `null`.
    Null,
    /// A value.
    Value(T),
}

impl<T> Skip<T> {
    fn skip(&self) -> bool {
        matches!(self, Skip::Absent)
    }
}

impl<T: Serialize> Serialize for Skip<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Skip::Value(v) => v.serialize(s),
            _ => s.serialize_none(),
        }
    }
}

/// `GET /v1/models`' entry.
#[derive(Debug, Clone, Serialize)]
pub struct ModelCard {
    /// The served name.
    pub id: String,
    /// Always `model`.
    pub object: &'static str,
    /// Unix seconds the server started.
    pub created: u64,
    /// Always `thicket`.
    pub owned_by: &'static str,
    /// Prompt plus output tokens at most.
    pub max_model_len: usize,
}

/// `POST /tokenize`.
#[derive(Debug, Clone, Deserialize)]
pub struct TokenizeRequest {
    /// The model (optional).
    pub model: Option<String>,
    /// Text to tokenize.
    pub prompt: Option<String>,
    /// Or messages, rendered with the chat template first.
    pub messages: Option<Vec<ChatMessageIn>>,
    /// Add the model's special tokens (BOS); default true.
    pub add_special_tokens: Option<bool>,
}

/// `POST /detokenize`.
#[derive(Debug, Clone, Deserialize)]
pub struct DetokenizeRequest {
    /// The model (optional).
    pub model: Option<String>,
    /// Token ids.
    pub tokens: Vec<u32>,
}
