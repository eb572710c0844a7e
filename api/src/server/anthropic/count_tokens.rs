//! `POST /v1/messages/count_tokens`: the prompt tokens a Messages body would have (its
//! messages, system prompt and tools, rendered with the model's template), counted without
//! generating; `max_tokens` is not needed.

use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};

use super::error::{MessagesBody, MessagesError};
use super::messages::request::{MessagesRequest, FIELD_NAMES};
use crate::server::adapter::count_tokens;
use crate::server::AppState;

/// `POST /v1/messages/count_tokens`.
pub(in crate::server) async fn count(
    State(state): State<AppState>,
    MessagesBody(body): MessagesBody<MessagesRequest>,
) -> Result<Json<Value>, MessagesError> {
    let chat = body.chat_request(false)?;
    let count = count_tokens(state, chat, FIELD_NAMES).await?;
    Ok(Json(json!({ "input_tokens": count })))
}
