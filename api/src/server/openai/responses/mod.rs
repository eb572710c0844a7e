//! OpenAI's Responses API: `POST /v1/responses`, `GET /v1/responses/{id}` and
//! `DELETE /v1/responses/{id}`. A request becomes the shared path's typed request ([`request`]) and
//! goes through the one generation path every front end shares (`pipeline::start_chat`, by
//! way of `adapter::start_answer`); its answer comes back as parts (`server::answer`) and is
//! written as a response object ([`response`]) or as the API's typed stream events
//! ([`stream`]). Responses are stored unless
//! `store` is false (`store`), and `previous_response_id` continues a stored one's
//! conversation; a missing or dropped id is a 404 in OpenAI's error shape, and a response
//! that failed (stored so that a stream's announced id can be fetched) cannot be continued
//! (400).

pub mod request;
pub mod response;
pub mod store;
pub mod stream;

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use self::request::{ResponsesRequest, FIELD_NAMES};
use self::response::{assistant_message, final_status, output_items, Shell};
use self::store::Stored;
use self::stream::ResponseEvents;
use crate::server::adapter::events::sse;
use crate::server::adapter::start_answer;
use crate::server::body::JsonBody;
use crate::server::error::{ApiError, ApiResult};
use crate::server::AppState;

fn not_found(id: &str, param: Option<&str>) -> ApiError {
    let mut e = ApiError::not_found(
        format!("no response with id '{id}' is stored here (it was never stored, was deleted, or was dropped as the store filled)"),
        "response_not_found",
    );
    e.param = param.map(str::to_string);
    e
}

/// `POST /v1/responses`.
pub(in crate::server) async fn create(
    State(state): State<AppState>,
    JsonBody(request): JsonBody<ResponsesRequest>,
) -> ApiResult<Response> {
    let store = state.response_store();
    let history = match &request.previous_response_id {
        Some(id) => {
            let stored = store
                .get(id)
                .ok_or_else(|| not_found(id, Some("previous_response_id")))?;
            if stored.failed {
                return Err(ApiError::invalid(
                    "previous_response_id",
                    format!("response '{id}' failed and cannot be continued; send its input again instead"),
                ));
            }
            stored.conversation
        }
        None => Vec::new(),
    };
    let form = request.chat_form(history)?;
    let shell = Shell::new(&request, state.model_name());
    let answer = start_answer(&state, form.request, FIELD_NAMES).await?;
    let keep = request.store.unwrap_or(true).then_some(store);
    if request.stream.unwrap_or(false) {
        return Ok(sse(
            answer,
            ResponseEvents::new(shell, keep, form.conversation),
        ));
    }
    let answer = answer.collect().await?;
    let status = final_status(&answer.ending);
    let response = shell.object(status, output_items(&answer), Some(&answer.ending));
    if let Some(store) = keep {
        let mut conversation = form.conversation;
        conversation.push(assistant_message(
            &answer.text,
            &answer.calls,
            &answer.thinking,
        ));
        store.put(
            shell.id.clone(),
            Stored::new(response.clone(), conversation),
        );
    }
    Ok(Json(response).into_response())
}

/// `GET /v1/responses/{id}`.
pub(in crate::server) async fn get(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    state
        .response_store()
        .get(&id)
        .map(|stored| Json(stored.response))
        .ok_or_else(|| not_found(&id, None))
}

/// `DELETE /v1/responses/{id}`.
pub(in crate::server) async fn delete(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    if state.response_store().delete(&id) {
        Ok(Json(
            json!({"id": id, "object": "response.deleted", "deleted": true}),
        ))
    } else {
        Err(not_found(&id, None))
    }
}
