//! `POST /v1/messages`: the body ([`request`]) becomes the shared path's typed request and goes
//! through the one generation path every front end shares (`pipeline::start_chat`, by way of
//! `adapter::start_answer`); its answer comes back as parts (`server::answer`) and is
//! written as a `message` object ([`response`]) or the API's stream events ([`stream`]).

pub mod request;
pub mod response;
pub mod stream;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;

use self::request::{MessagesRequest, FIELD_NAMES};
use self::response::message;
use self::stream::MessageEvents;
use crate::server::adapter::events::sse;
use crate::server::adapter::start_answer;
use crate::server::anthropic::error::{MessagesBody, MessagesError};
use crate::server::AppState;

/// `POST /v1/messages`.
pub(in crate::server) async fn create(
    State(state): State<AppState>,
    MessagesBody(body): MessagesBody<MessagesRequest>,
) -> Result<Response, MessagesError> {
    let chat = body.chat_request(true)?;
    let answer = start_answer(&state, chat, FIELD_NAMES).await?;
    let model = body.model.unwrap_or_else(|| state.model_name().to_string());
    if body.stream.unwrap_or(false) {
        return Ok(sse(answer, MessageEvents::new(&model)));
    }
    let answer = answer.collect().await?;
    Ok(Json(message(&model, answer)).into_response())
}
