//! The one generation path every route that generates shares: the request is set up off the
//! async runtime ([`off_runtime`]); a chat request (`/v1/chat/completions`, and the Responses
//! and Messages APIs once translated into one) is validated, its messages rendered with the
//! model's template and its tools shown ([`start_chat`]); every prompt is submitted to the
//! engine (its `n` samples share the prompt's KV) and comes back as a [`Started`] request,
//! answered whole or as a stream in the OpenAI shapes (`openai::respond`), or read as parts
//! ([`super::answer`]) by the Responses and Messages APIs. Nothing here knows a protocol's
//! shapes: the protocols' folders depend on this path, never the other way. `/v1/completions` validates its own body
//! (`openai::completions::start_completion`) and submits through [`submit_all`]. Dropping a
//! request's streams (a client that went away) cancels it.

use std::sync::Arc;

use engine::handle::{EngineHandle, RequestStream};
use engine::{ModelTokenizer, StopConditions};

use super::adapter::template_kwargs;
use super::error::{ApiError, ApiResult};
use super::harmony_formats;
use super::reasoning::{thinking_budget, ReasoningParser};
use super::request::{ChatMessageIn, ChatRequest, MessageContent, ToolCallIn};
use super::settings::output_format::response_format;
use super::settings::{settings, ResponseOptions, Settings};
use super::tools::format::Markers;
use super::tools::{Calls, ToolFormat, ToolRequest};
use super::AppState;
use crate::chat::{render_chat_with, ChatMessage};
use crate::server::answer::Answer;
use crate::server::settings::template::TemplateSetup;

/// Roles a chat message may have.
const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

/// One submitted prompt.
pub struct Submitted {
    /// Its events.
    pub stream: RequestStream,
    /// Text shown before its choices (`echo`).
    pub echo: Option<String>,
}

/// Runs `start` on tokio's blocking pool: rendering the template, encoding the prompt and
/// compiling an output format grow with the request (a long prompt, a large schema), and
/// on the runtime's own threads they would hold up every other connection meanwhile.
pub async fn off_runtime<T: Send + 'static>(
    state: AppState,
    start: impl FnOnce(&AppState) -> ApiResult<T> + Send + 'static,
) -> ApiResult<T> {
    tokio::task::spawn_blocking(move || start(&state))
        .await
        .map_err(|e| ApiError::internal(format!("request setup failed: {e}")))?
}

/// A generation request the engine accepted: everything its response needs.
pub struct Started {
    /// The served model's name.
    pub(crate) model: String,
    pub(crate) tokenizer: Arc<ModelTokenizer>,
    pub(crate) options: ResponseOptions,
    pub(crate) submitted: Vec<Submitted>,
    /// How answers are read for tool calls (the offered functions and their format), when
    /// they are.
    pub(crate) calls: Option<Calls>,
}

impl Started {
    /// Its one answer (a chat request: one prompt), read as parts: the Responses and
    /// Messages front ends.
    pub fn into_answer(self) -> ApiResult<Answer> {
        let calls = self.calls;
        let format_field = self.options.format_field;
        let submitted = self.submitted.into_iter().next();
        let stream = submitted.ok_or_else(|| ApiError::internal("no prompt was submitted"))?;
        let reasoning = self.options.reasoning.map(|r| (r, self.tokenizer.clone()));
        Ok(Answer::new(stream.stream, calls, format_field, reasoning))
    }

    /// The event streams of its prompts, for a caller that reads the engine's events itself
    /// (`thicket bench spec`).
    pub fn into_streams(self) -> Vec<RequestStream> {
        self.submitted.into_iter().map(|s| s.stream).collect()
    }
}

/// Validates a `/v1/chat/completions` body and submits its prompt.
pub fn start_chat(state: &AppState, body: ChatRequest) -> ApiResult<Started> {
    let engine = state.engine()?;
    state.check_model(body.common.model.as_deref())?;
    let limits = engine.limits();
    let tools = ToolRequest::parse(
        body.tools.as_ref(),
        body.tool_choice.as_ref(),
        body.parallel_tool_calls,
    )?;
    let constraint = response_format(body.response_format.as_ref())?;
    let wants_logprobs = body.logprobs.unwrap_or(false);
    if body.top_logprobs.is_some() && !wants_logprobs {
        return Err(ApiError::invalid(
            "top_logprobs",
            "top_logprobs needs logprobs set to true",
        ));
    }
    let top = wants_logprobs.then(|| body.top_logprobs.unwrap_or(0));
    let max_tokens = body.max_completion_tokens.or(body.common.max_tokens);
    let mut settings = settings(&body.common, max_tokens, top, limits)?;
    if constraint.is_some() {
        if settings.constraint.is_some() {
            return Err(ApiError::invalid(
                "response_format",
                "give response_format or structured_outputs, not both",
            ));
        }
        settings.constraint = constraint;
        settings.constraint_field = "response_format";
    }
    let format = state.tool_format(engine.tokenizer());
    let tokenizer = engine.tokenizer();
    let token = |marker: &str| one_token(tokenizer, marker);
    let markers = Markers::new(&token);
    if let Some(call) = tools
        .as_ref()
        .and_then(|t| t.constraint(format.as_ref(), &markers))
    {
        if settings.constraint.is_some() {
            return Err(ApiError::invalid(
                "tool_choice",
                "tool_choice required or a function already fixes the output format; \
                 leave out response_format and structured_outputs",
            ));
        }
        settings.constraint = Some(call);
        settings.constraint_field = "tools";
    }
    settings.options.tool_calls = tools.as_ref().is_some_and(ToolRequest::parses_calls);
    // A format marked by special tokens is read from text that keeps them, unless the
    // request says otherwise.
    if settings.options.tool_calls
        && format.special_markers()
        && body.common.skip_special_tokens.is_none()
    {
        settings.stop.skip_special_tokens = false;
    }
    end_at_hand_back(tokenizer, format.as_ref(), &mut settings.stop);
    settings.options.format_field = settings.constraint_field;
    settings.predict(tokenizer)?;
    let setup = template_setup(state, &body)?;
    let text = chat_text(tokenizer, body.messages.as_deref(), tools.as_ref(), &setup)?;
    reasoning_settings(state, tokenizer, &body, &text, &mut settings)?;
    let prompt = encode_chat(tokenizer, &text)?;
    let submitted = submit_all(engine, &settings, std::iter::once((prompt, None)), None)?;
    Ok(Started {
        model: state.model_name().to_string(),
        tokenizer: tokenizer.clone(),
        options: settings.options,
        submitted,
        calls: tools
            .as_ref()
            .filter(|t| t.parses_calls())
            .map(|t| t.calls(format)),
    })
}

/// The chat template and its variables for `body`: the server's, the request's
/// `chat_template_kwargs` over them, and its `reasoning_effort` where those do not set it.
fn template_setup(state: &AppState, body: &ChatRequest) -> ApiResult<TemplateSetup> {
    template_setup_of(
        state,
        body.chat_template_kwargs.as_ref(),
        body.reasoning_effort.as_ref(),
    )
}

/// `template_setup` from a request's `chat_template_kwargs` and `reasoning_effort`.
fn template_setup_of(
    state: &AppState,
    kwargs: Option<&serde_json::Value>,
    effort: Option<&serde_json::Value>,
) -> ApiResult<TemplateSetup> {
    let effort = match effort.filter(|e| !e.is_null()) {
        None => Vec::new(),
        Some(serde_json::Value::String(e)) if REASONING_EFFORTS.contains(&e.as_str()) => {
            vec![("reasoning_effort", serde_json::Value::from(e.as_str()))]
        }
        Some(_) => {
            return Err(ApiError::invalid(
                "reasoning_effort",
                format!("must be one of {}", REASONING_EFFORTS.join(", ")),
            ))
        }
    };
    let kwargs = template_kwargs(kwargs, effort);
    state.template().for_request(kwargs.as_ref())
}

/// The reasoning efforts templates take (gpt-oss's `Reasoning:` line).
pub const REASONING_EFFORTS: &[&str] = &["low", "medium", "high"];

/// The reasoning side of a chat request's settings, once its prompt is rendered (`text`):
/// the parser and whether the prompt opened thinking, special-token markers kept in the text,
/// and the thinking phase the engine follows (for a budget, or a format after the thinking).
fn reasoning_settings(
    state: &AppState,
    tokenizer: &ModelTokenizer,
    body: &ChatRequest,
    text: &str,
    settings: &mut Settings,
) -> ApiResult<()> {
    settings.options.reasoning = state.reasoning_parser().map(|p| p.for_prompt(text));
    // Thinking markers that are special tokens of the model's must stay in the text to be
    // split at, unless the request says otherwise.
    if let Some(reasoning) = settings.options.reasoning {
        let (start, end) = reasoning.parser.markers();
        let special = [start, end]
            .iter()
            .any(|m| one_token(tokenizer, m).is_some());
        if special && body.common.skip_special_tokens.is_none() {
            settings.stop.skip_special_tokens = false;
        }
    }
    let budget = thinking_budget(body.thinking_token_budget.as_ref())?;
    match settings.options.reasoning {
        // The engine follows the thinking where it must act on it: to end it, or to hold
        // the format to the answer after it.
        Some(reasoning) if budget.is_some() || settings.constraint.is_some() => {
            if reasoning.parser == ReasoningParser::Harmony {
                harmony_answer(tokenizer, settings);
            }
            settings.thinking = Some(reasoning.thinking(budget));
        }
        None if budget.is_some() => {
            return Err(ApiError::invalid(
                "thinking_token_budget",
                "a thinking budget needs a server started with --reasoning-parser",
            ))
        }
        _ => {}
    }
    Ok(())
}

/// A gpt-oss answer's format after its analysis: a structured output is a `final`
/// message's body; with a budget and no format, the answer may be anything but another
/// analysis. A tool-call grammar writes its headers itself.
fn harmony_answer(tokenizer: &ModelTokenizer, settings: &mut Settings) {
    let token = |marker: &str| one_token(tokenizer, marker);
    let markers = Markers::new(&token);
    match settings.constraint.take() {
        Some(call) if settings.constraint_field == "tools" => settings.constraint = Some(call),
        Some(format) => {
            settings.constraint = Some(harmony_formats::final_message(format, &markers));
        }
        None => {
            settings.constraint = Some(harmony_formats::after_analysis(&markers));
            settings.constraint_field = "thinking_token_budget";
            settings.options.format_field = settings.constraint_field;
        }
    }
}

/// The answer ends where the model hands control back after its calls (Gemma 4's
/// `<|tool_response>`), as at its end token: at the marker's token where the vocabulary has
/// it as one, else at its text. Neither is part of the answer.
pub(crate) fn end_at_hand_back(
    tokenizer: &ModelTokenizer,
    format: &dyn ToolFormat,
    stop: &mut StopConditions,
) {
    for marker in format.end_markers() {
        let id = tokenizer
            .token_to_id(marker)
            .filter(|&id| tokenizer.decode(&[id]).is_ok_and(|text| text == *marker));
        match id {
            Some(id) => stop.stop_token_ids.push(id),
            None => stop.stop.push(marker.to_string()),
        }
    }
}

/// The id of `marker` where the model's vocabulary has it as one special token (a text
/// literal in a grammar cannot match a special token; an ordinary one it already does, in
/// whatever tokens the model picks).
fn one_token(tokenizer: &ModelTokenizer, marker: &str) -> Option<u32> {
    let id = tokenizer.token_to_id(marker)?;
    let special = tokenizer.decode_skip_special(&[id]).ok()?.is_empty();
    (special && tokenizer.decode(&[id]).ok()? == marker).then_some(id)
}

/// The prompt tokens of a chat request's `messages` with its `tools` shown.
pub fn chat_prompt(
    tokenizer: &ModelTokenizer,
    messages: Option<&[ChatMessageIn]>,
    tools: Option<&ToolRequest>,
    setup: &TemplateSetup,
) -> ApiResult<Vec<u32>> {
    encode_chat(tokenizer, &chat_text(tokenizer, messages, tools, setup)?)
}

/// A chat request's `messages` with its `tools` shown, rendered with the template.
fn chat_text(
    tokenizer: &ModelTokenizer,
    messages: Option<&[ChatMessageIn]>,
    tools: Option<&ToolRequest>,
    setup: &TemplateSetup,
) -> ApiResult<String> {
    let messages = messages.ok_or_else(|| ApiError::invalid("messages", "messages is required"))?;
    let shown = tools.map(ToolRequest::shown).unwrap_or_default();
    render_messages_with(tokenizer, messages, &shown, setup)
}

/// A rendered chat prompt's tokens.
fn encode_chat(tokenizer: &ModelTokenizer, text: &str) -> ApiResult<Vec<u32>> {
    tokenizer
        .encode_plain(text)
        .map_err(|e| ApiError::invalid("messages", e.to_string()))
}

/// The prompt tokens of chat `messages` with `tools` offered (OpenAI's shape), rendered with
/// the request's `chat_template_kwargs` and `reasoning_effort` as a chat request's are
/// (`/tokenize`).
pub fn messages_prompt(
    state: &AppState,
    messages: &[ChatMessageIn],
    tools: Option<&serde_json::Value>,
    kwargs: Option<&serde_json::Value>,
    effort: Option<&serde_json::Value>,
) -> ApiResult<Vec<u32>> {
    let engine = state.engine()?;
    let tools = ToolRequest::parse(tools, None, None)?;
    let setup = template_setup_of(state, kwargs, effort)?;
    chat_prompt(engine.tokenizer(), Some(messages), tools.as_ref(), &setup)
}

/// How many tokens a chat request's prompt has (its messages with its tools shown), without
/// submitting it.
pub fn count_chat_tokens(state: &AppState, body: &ChatRequest) -> ApiResult<usize> {
    let engine = state.engine()?;
    state.check_model(body.common.model.as_deref())?;
    let tools = ToolRequest::parse(
        body.tools.as_ref(),
        body.tool_choice.as_ref(),
        body.parallel_tool_calls,
    )?;
    let setup = template_setup(state, body)?;
    let messages = body.messages.as_deref();
    Ok(chat_prompt(engine.tokenizer(), messages, tools.as_ref(), &setup)?.len())
}

/// `messages` (and the offered `tools`) rendered with the model's chat template, ready to
/// encode.
pub fn render_messages(
    tokenizer: &ModelTokenizer,
    messages: &[ChatMessageIn],
    tools: &[serde_json::Value],
) -> ApiResult<String> {
    render_messages_with(tokenizer, messages, tools, &TemplateSetup::default())
}

/// `render_messages` with `setup`'s template (where it names one) and variables.
pub fn render_messages_with(
    tokenizer: &ModelTokenizer,
    messages: &[ChatMessageIn],
    tools: &[serde_json::Value],
    setup: &TemplateSetup,
) -> ApiResult<String> {
    if messages.is_empty() {
        return Err(ApiError::invalid("messages", "messages must not be empty"));
    }
    let mut plain = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        if !ROLES.contains(&m.role.as_str()) {
            return Err(ApiError::invalid(
                format!("messages[{i}].role"),
                format!("unknown role {:?}: use one of {}", m.role, ROLES.join(", ")),
            ));
        }
        let content = match &m.content {
            None => String::new(),
            Some(MessageContent::Text(t)) => t.clone(),
            Some(MessageContent::Parts(parts)) => {
                let mut text = String::new();
                for part in parts {
                    match (part.kind.as_str(), &part.text) {
                        ("text", Some(t)) => text.push_str(t),
                        (kind, _) => {
                            return Err(ApiError::invalid(
                                format!("messages[{i}].content"),
                                format!(
                                    "content parts of type {kind:?} are not supported; only text"
                                ),
                            ))
                        }
                    }
                }
                text
            }
        };
        let mut message = ChatMessage::text(m.role.clone(), content);
        message.tool_call_id = m.tool_call_id.clone();
        message.name = m.name.clone();
        if m.role == "assistant" {
            let thought = m.reasoning_content.clone().filter(|t| !t.is_empty());
            message.reasoning_content.clone_from(&thought);
            message.thinking = thought;
        }
        for (j, call) in m.tool_calls.iter().flatten().enumerate() {
            message.tool_calls.push(history_call(call).ok_or_else(|| {
                ApiError::invalid(
                    format!("messages[{i}].tool_calls[{j}].function.arguments"),
                    "arguments must be a JSON object (or a string holding one)",
                )
            })?);
        }
        plain.push(message);
    }
    let template = setup
        .template
        .as_deref()
        .or(tokenizer.chat_template())
        .ok_or_else(|| {
            ApiError::invalid(
                "messages",
                "this model has no chat template; use /v1/completions (or start the server with --chat-template)",
            )
        })?;
    let token_text = |id: Option<u32>| {
        id.and_then(|i| tokenizer.inner().id_to_token(i))
            .unwrap_or_default()
    };
    render_chat_with(
        template,
        &plain,
        tools,
        &token_text(tokenizer.bos_id()),
        &token_text(tokenizer.eos_ids().first().copied()),
        &setup.kwargs,
    )
    .map_err(|e| ApiError::invalid("messages", e.to_string()))
}

/// An earlier call as templates read it: arguments as an object, not a string.
fn history_call(call: &ToolCallIn) -> Option<serde_json::Value> {
    let arguments = match &call.function.arguments {
        None | Some(serde_json::Value::Null) => serde_json::json!({}),
        Some(serde_json::Value::String(s)) if s.trim().is_empty() => serde_json::json!({}),
        Some(serde_json::Value::String(s)) => serde_json::from_str(s).ok()?,
        Some(v) => v.clone(),
    };
    arguments.is_object().then(|| {
        serde_json::json!({
            "id": call.id,
            "type": "function",
            "function": {"name": call.function.name, "arguments": arguments},
        })
    })
}

/// Submits every prompt; on a refusal the ones already queued are cancelled (dropped).
pub fn submit_all(
    engine: &EngineHandle,
    settings: &Settings,
    prompts: impl Iterator<Item = (Vec<u32>, Option<String>)>,
    default_max_tokens: Option<usize>,
) -> ApiResult<Vec<Submitted>> {
    let limits = engine.limits();
    let requests = prompts
        .map(|(prompt, echo)| Ok((settings.request(prompt, default_max_tokens, limits)?, echo)))
        .collect::<ApiResult<Vec<_>>>()?;
    let mut submitted = Vec::with_capacity(requests.len());
    for (request, echo) in requests {
        let stream = engine.submit(request).map_err(|e| {
            let mut e = ApiError::from(e);
            // The engine names the format `response_format` whichever field set it.
            if e.param.as_deref() == Some("response_format") {
                e.param = Some(settings.constraint_field.to_string());
            }
            e
        })?;
        submitted.push(Submitted { stream, echo });
    }
    Ok(submitted)
}
