//! Anthropic's Messages API: `POST /v1/messages` and `POST /v1/messages/count_tokens`. A
//! request becomes a chat-completions body (`request`) and goes through the one generation
//! path every front end shares (`generate::start_chat`); its answer comes back as parts
//! (`answer`) and is written as a `message` object or the API's stream events (`output`).
//! Every error here is in Anthropic's shape, `{"type": "error", "error": {"type", "message"}}`,
//! with the same status the other routes give it. The `x-api-key` header is accepted as the
//! API key (see the router's key check); `anthropic-version` is accepted and not needed.

pub mod output;
pub mod request;

use axum::extract::{FromRequest, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

use self::output::{message, MessageEvents};
use self::request::{renamed, MessagesRequest};
use super::answer::sse;
use super::body::{generation_body, JsonBody};
use super::error::ApiError;
use super::generate::{count_chat_tokens, off_runtime, start_chat};
use super::protocol::ChatRequest;
use super::AppState;

/// The paths whose errors are in Anthropic's shape.
pub const PATH_PREFIX: &str = "/v1/messages";

/// An error's body in Anthropic's shape.
pub fn anthropic_error(e: &ApiError) -> Value {
    let kind = match e.status {
        StatusCode::UNAUTHORIZED => "authentication_error",
        StatusCode::FORBIDDEN => "permission_error",
        StatusCode::NOT_FOUND => "not_found_error",
        StatusCode::PAYLOAD_TOO_LARGE => "request_too_large",
        StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
        StatusCode::SERVICE_UNAVAILABLE => "overloaded_error",
        s if s.is_server_error() => "api_error",
        _ => "invalid_request_error",
    };
    let message = match &e.param {
        Some(param) if !e.message.contains(param.as_str()) => format!("{param}: {}", e.message),
        _ => e.message.clone(),
    };
    json!({"type": "error", "error": {"type": kind, "message": message}})
}

/// An [`ApiError`] answered in Anthropic's shape.
pub struct MessagesError(pub ApiError);

impl From<ApiError> for MessagesError {
    fn from(e: ApiError) -> Self {
        Self(e)
    }
}

impl IntoResponse for MessagesError {
    fn into_response(self) -> Response {
        // The status and headers (Retry-After on a 429) as the other routes give them.
        let mut response = self.0.clone().into_response();
        let body = Json(anthropic_error(&self.0)).into_response().into_body();
        *response.body_mut() = body;
        response
    }
}

/// A request body parsed as `T`, its errors in Anthropic's shape.
pub struct MessagesBody<T>(pub T);

impl<S, T> FromRequest<S> for MessagesBody<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = MessagesError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let JsonBody(body) = JsonBody::<T>::from_request(request, state).await?;
        Ok(Self(body))
    }
}

/// The chat request of a Messages body.
fn chat_request(body: &MessagesRequest, generating: bool) -> Result<ChatRequest, ApiError> {
    let chat = body.chat_body(generating)?;
    generation_body(&chat)
}

/// `POST /v1/messages`.
pub(super) async fn create(
    State(state): State<AppState>,
    MessagesBody(body): MessagesBody<MessagesRequest>,
) -> Result<Response, MessagesError> {
    let chat = chat_request(&body, true)?;
    let started = off_runtime(state.clone(), move |state| start_chat(state, chat))
        .await
        .map_err(renamed)?;
    let answer = started.into_answer()?;
    let model = body.model.unwrap_or_else(|| state.model_name().to_string());
    if body.stream.unwrap_or(false) {
        return Ok(sse(MessageEvents::new(&model, answer)));
    }
    let answer = answer.collect().await?;
    Ok(Json(message(&model, answer)).into_response())
}

/// `POST /v1/messages/count_tokens`.
pub(super) async fn count_tokens(
    State(state): State<AppState>,
    MessagesBody(body): MessagesBody<MessagesRequest>,
) -> Result<Json<Value>, MessagesError> {
    let chat = chat_request(&body, false)?;
    let count = off_runtime(state, move |state| count_chat_tokens(state, &chat))
        .await
        .map_err(renamed)?;
    Ok(Json(json!({ "input_tokens": count })))
}
