//! `POST /v1/rerank` (also `/rerank` and `/v2/rerank`): a `query` against `documents`, the
//! results sorted by `relevance_score`, cut to `top_n`, each with its document unless
//! `return_documents` is false; and `POST /v1/score` (vLLM's): `text_1` against `text_2`,
//! one against many or pair by pair, scores in input order.

use axum::extract::State;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{instruction, score_pairs, strings, truncation};
use crate::server::body::JsonBody;
use crate::server::error::{ApiError, ApiResult};
use crate::server::AppState;

/// The body of `POST /v1/rerank`.
#[derive(Debug, Deserialize)]
pub struct RerankRequest {
    /// The served model (optional).
    #[serde(default)]
    pub model: Option<String>,
    /// What the documents are ranked against.
    pub query: Value,
    /// The documents: strings (or `{"text": ...}` objects).
    pub documents: Value,
    /// Results to return (absent or 0: all).
    #[serde(default)]
    pub top_n: Option<Value>,
    /// Whether each result carries its document (default true).
    #[serde(default)]
    pub return_documents: Option<bool>,
    /// Cap on each input's tokens (`-1`: the model's limit).
    #[serde(default)]
    pub truncate_prompt_tokens: Option<Value>,
    /// What the pairs are judged under, for a decoder reranker's template.
    #[serde(default)]
    pub instruction: Option<Value>,
}

/// The body of `POST /v1/score`.
#[derive(Debug, Deserialize)]
pub struct ScoreRequest {
    /// The served model (optional).
    #[serde(default)]
    pub model: Option<String>,
    /// One text, or a list (one, or as many as `text_2`).
    pub text_1: Value,
    /// One text or a list.
    pub text_2: Value,
    /// Cap on each input's tokens (`-1`: the model's limit).
    #[serde(default)]
    pub truncate_prompt_tokens: Option<Value>,
    /// What the pairs are judged under, for a decoder reranker's template.
    #[serde(default)]
    pub instruction: Option<Value>,
}

fn one_or_many(value: &Value, field: &str) -> ApiResult<Vec<String>> {
    match value {
        Value::String(s) => Ok(vec![s.clone()]),
        Value::Array(_) => strings(value, field),
        _ => Err(ApiError::invalid(
            field,
            format!("{field} must be a string or a list of strings"),
        )),
    }
}

/// `POST /v1/rerank`.
pub(crate) async fn rerank(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<RerankRequest>,
) -> ApiResult<Json<Value>> {
    let encoder = state.encoder()?;
    state.check_embedding_model(body.model.as_deref())?;
    let Value::String(query) = &body.query else {
        return Err(ApiError::invalid("query", "query must be a string"));
    };
    let documents = strings(&body.documents, "documents")?;
    let top_n = match body.top_n.as_ref().filter(|v| !v.is_null()) {
        None => documents.len(),
        Some(v) => match v.as_u64() {
            Some(0) => documents.len(),
            Some(n) => usize::try_from(n)
                .unwrap_or(usize::MAX)
                .min(documents.len()),
            None => {
                return Err(ApiError::invalid(
                    "top_n",
                    "top_n must be a non-negative integer",
                ))
            }
        },
    };
    let truncate = truncation(body.truncate_prompt_tokens.as_ref(), encoder)?;
    let instruction = instruction(body.instruction.as_ref(), encoder)?;
    let pairs: Vec<(usize, usize)> = (0..documents.len()).map(|j| (0, j)).collect();
    let (scores, tokens) = score_pairs(
        encoder,
        std::slice::from_ref(query),
        &documents,
        &pairs,
        (truncate, instruction),
        ("query", "documents"),
    )
    .await?;
    let mut order: Vec<usize> = (0..documents.len()).collect();
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    let with_documents = body.return_documents.unwrap_or(true);
    let results: Vec<Value> = order
        .into_iter()
        .take(top_n)
        .map(|index| {
            let mut result = json!({"index": index, "relevance_score": scores[index]});
            if with_documents {
                result["document"] = json!({"text": documents[index]});
            }
            result
        })
        .collect();
    Ok(Json(json!({
        "id": format!("rerank-{}", request_id()),
        "model": state.embedding_model_name(),
        "results": results,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    })))
}

/// `POST /v1/score`.
pub(crate) async fn score(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<ScoreRequest>,
) -> ApiResult<Json<Value>> {
    let encoder = state.encoder()?;
    state.check_embedding_model(body.model.as_deref())?;
    let firsts = one_or_many(&body.text_1, "text_1")?;
    let seconds = one_or_many(&body.text_2, "text_2")?;
    let pairs: Vec<(usize, usize)> = match (firsts.len(), seconds.len()) {
        (1, n) => (0..n).map(|j| (0, j)).collect(),
        (m, n) if m == n => (0..n).map(|j| (j, j)).collect(),
        (m, n) => {
            return Err(ApiError::invalid(
                "text_1",
                format!(
                    "text_1 has {m} texts and text_2 {n}: give one text_1, or as many as text_2"
                ),
            ))
        }
    };
    let truncate = truncation(body.truncate_prompt_tokens.as_ref(), encoder)?;
    let instruction = instruction(body.instruction.as_ref(), encoder)?;
    let (scores, tokens) = score_pairs(
        encoder,
        &firsts,
        &seconds,
        &pairs,
        (truncate, instruction),
        ("text_1", "text_2"),
    )
    .await?;
    let data: Vec<Value> = scores
        .iter()
        .enumerate()
        .map(|(index, score)| json!({"index": index, "object": "score", "score": score}))
        .collect();
    Ok(Json(json!({
        "id": format!("score-{}", request_id()),
        "object": "list",
        "created": crate::server::unix_now(),
        "model": state.embedding_model_name(),
        "data": data,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    })))
}

fn request_id() -> String {
    format!("{:016x}", rand::random::<u64>())
}
