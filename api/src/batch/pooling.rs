//! A batch job's pooling lines (`/v1/embeddings`, `/v1/rerank`, `/v1/score`): each body goes
//! through the same parsing and handler as the HTTP route, on the job's encoder (an encoder
//! model) or its decoder served for pooling (`--task embed|rerank`), so a result body is what
//! the route would answer.

use axum::extract::State;
use axum::Json;
use serde_json::Value;

use super::input::Target;
use crate::server::body::{json_body, JsonBody};
use crate::server::error::{ApiError, ApiResult};
use crate::server::pooling::{embeddings, rerank};
use crate::server::AppState;

/// Runs one pooling line to its response body.
pub(super) async fn run(state: &AppState, target: Target, body: &Value) -> ApiResult<Value> {
    let state = State(state.clone());
    let value = match target {
        Target::Embeddings => {
            let Json(answer) = embeddings::create(state, JsonBody(json_body(body)?)).await?;
            serde_json::to_value(answer)
        }
        Target::Rerank => Ok(rerank::rerank(state, JsonBody(json_body(body)?)).await?.0),
        Target::Score => Ok(rerank::score(state, JsonBody(json_body(body)?)).await?.0),
        Target::Generate(_) => {
            return Err(ApiError::internal(
                "a generation line reached the pooling runner",
            ))
        }
    };
    value.map_err(|e| ApiError::internal(format!("writing the answer: {e}")))
}
