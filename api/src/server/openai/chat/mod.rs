//! `POST /v1/chat/completions`: the body (`server::request`) goes down the shared pipeline
//! (`pipeline::start_chat`: template, tools, output format), and the answer comes back whole
//! ([`response`]) or as chunks ([`stream`]).

pub mod response;
pub mod stream;

use axum::extract::State;
use axum::response::Response;

use crate::server::body::GenerationBody;
use crate::server::error::ApiResult;
use crate::server::openai::body::Endpoint;
use crate::server::openai::respond::respond;
use crate::server::pipeline::{off_runtime, start_chat};
use crate::server::request::ChatRequest;
use crate::server::AppState;

/// `POST /v1/chat/completions`.
pub(in crate::server) async fn create(
    State(state): State<AppState>,
    GenerationBody(body): GenerationBody<ChatRequest>,
) -> ApiResult<Response> {
    let started = off_runtime(state, move |state| start_chat(state, body)).await?;
    respond(started, Endpoint::Chat).await
}
