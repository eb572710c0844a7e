//! The routes that serve no generation: `GET /health`, `GET /v1/models` and
//! `/v1/models/{model}`, `POST /tokenize` and `/detokenize`, `GET /metrics` (the Prometheus
//! recorder's text with vLLM's load metrics appended), and what routers poll (`/get_load`,
//! `/version`, in [`load`]), with the wire types of these routes.

pub mod load;

use axum::extract::State;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};

use super::body::JsonBody;
use super::error::{ApiError, ApiResult};
use super::pipeline::messages_prompt;
use super::request::ChatMessageIn;
use super::AppState;

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
    /// Extra chat-template variables for `messages` (as chat completions takes them).
    pub chat_template_kwargs: Option<serde_json::Value>,
    /// Functions offered with `messages`, shown as chat completions shows them.
    pub tools: Option<serde_json::Value>,
    /// The reasoning effort the template is given with `messages` (`low`, `medium`, `high`).
    pub reasoning_effort: Option<serde_json::Value>,
}

/// `POST /detokenize`.
#[derive(Debug, Clone, Deserialize)]
pub struct DetokenizeRequest {
    /// The model (optional).
    pub model: Option<String>,
    /// Token ids.
    pub tokens: Vec<u32>,
}

/// `GET /health`: 200 once the model has loaded, 503 before and while shutting down.
pub(super) async fn health(State(state): State<AppState>) -> ApiResult<Json<serde_json::Value>> {
    state.ready()?;
    Ok(Json(serde_json::json!({"status": "ok"})))
}

/// `GET /metrics`.
pub(super) async fn render_metrics(State(state): State<AppState>) -> Response {
    let handle = &state.inner.metrics;
    handle.run_upkeep();
    let mut text = handle.render();
    text.push_str(&load::vllm_metrics(&state));
    let mut response = text.into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    response
}

/// The served models' cards (the generating model first, then an encoder beside it), each
/// with its longest sequence.
fn cards(state: &AppState) -> ApiResult<Vec<ModelCard>> {
    state.ready()?;
    let card = |id: &str, max_model_len| ModelCard {
        id: id.to_string(),
        object: "model",
        created: state.inner.created,
        owned_by: "thicket",
        max_model_len,
    };
    let mut cards = Vec::new();
    if let Some(engine) = state.started_engine() {
        cards.push(card(state.model_name(), engine.limits().max_model_len));
    }
    // A decoder that pools is the served model, already listed.
    if let Some(encoder) = state.started_encoder().filter(|e| !e.on_the_engine()) {
        let name = state.embedding_model_name();
        cards.push(card(name, encoder.tokenizer().max_length()));
    }
    Ok(cards)
}

/// `GET /v1/models`.
pub(super) async fn models(State(state): State<AppState>) -> ApiResult<Json<serde_json::Value>> {
    Ok(Json(serde_json::json!({
        "object": "list",
        "data": cards(&state)?,
    })))
}

/// `GET /v1/models/{model}`.
pub(super) async fn model(
    State(state): State<AppState>,
    axum::extract::Path(name): axum::extract::Path<String>,
) -> ApiResult<Json<ModelCard>> {
    cards(&state)?
        .into_iter()
        .find(|c| c.id == name)
        .map(Json)
        .ok_or_else(|| ApiError::unknown_model(&name, state.model_name()))
}

/// The encoder `/tokenize` and `/detokenize` use: the served model when it is an encoder, or
/// the one beside a generating model when `model` names it; `None` for the generating model.
fn encoder_for<'a>(
    state: &'a AppState,
    model: Option<&str>,
) -> ApiResult<Option<&'a engine::encoder::EncoderHandle>> {
    // A decoder that pools reads with the generating model's tokenizer.
    let Some(encoder) = state.started_encoder() else {
        return Ok(None);
    };
    if encoder.on_the_engine() {
        return Ok(None);
    }
    let named = model.is_some_and(|m| m == state.embedding_model_name());
    if state.started_engine().is_none() || named {
        state.check_embedding_model(model)?;
        return state.encoder().map(Some);
    }
    Ok(None)
}

/// `POST /tokenize`.
pub(super) async fn tokenize(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<TokenizeRequest>,
) -> ApiResult<Json<serde_json::Value>> {
    if let Some(encoder) = encoder_for(&state, body.model.as_deref())? {
        let Some(prompt) = body.prompt.filter(|_| body.messages.is_none()) else {
            return Err(ApiError::invalid(
                "messages",
                "an encoder has no chat template: give a prompt",
            ));
        };
        let tokens = encoder
            .tokenizer()
            .tokenize(&prompt, body.add_special_tokens.unwrap_or(true))
            .map_err(|e| ApiError::invalid("prompt", e))?;
        return Ok(Json(serde_json::json!({
            "count": tokens.len(),
            "max_model_len": encoder.tokenizer().max_length(),
            "tokens": tokens,
        })));
    }
    let engine = state.engine()?;
    state.check_model(body.model.as_deref())?;
    let tokenizer = engine.tokenizer();
    let tokens = match (body.prompt, body.messages) {
        (Some(prompt), None) => {
            if body.add_special_tokens.unwrap_or(true) {
                tokenizer.encode(&prompt)
            } else {
                tokenizer.encode_plain(&prompt)
            }
        }
        (None, Some(messages)) => {
            let tokens = messages_prompt(
                &state,
                &messages,
                body.tools.as_ref(),
                body.chat_template_kwargs.as_ref(),
                body.reasoning_effort.as_ref(),
            )?;
            Ok(tokens)
        }
        _ => {
            return Err(ApiError::invalid(
                "prompt",
                "give exactly one of prompt or messages",
            ))
        }
    }
    .map_err(|e| ApiError::invalid("prompt", e.to_string()))?;
    Ok(Json(serde_json::json!({
        "count": tokens.len(),
        "max_model_len": engine.limits().max_model_len,
        "tokens": tokens,
    })))
}

/// `POST /detokenize`.
pub(super) async fn detokenize(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<DetokenizeRequest>,
) -> ApiResult<Json<serde_json::Value>> {
    if let Some(encoder) = encoder_for(&state, body.model.as_deref())? {
        let text = encoder
            .tokenizer()
            .detokenize(&body.tokens)
            .map_err(|e| ApiError::invalid("tokens", e))?;
        return Ok(Json(serde_json::json!({ "prompt": text })));
    }
    let engine = state.engine()?;
    state.check_model(body.model.as_deref())?;
    let vocab = engine.limits().vocab_size;
    if let Some(bad) = body.tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::invalid(
            "tokens",
            format!("token id {bad} outside the vocabulary of {vocab}"),
        ));
    }
    let text = engine
        .tokenizer()
        .decode(&body.tokens)
        .map_err(|e| ApiError::invalid("tokens", e.to_string()))?;
    Ok(Json(serde_json::json!({ "prompt": text })))
}
