//! What every route passes through: the API key check (`Authorization: Bearer` or
//! `x-api-key`, compared by digest in constant time; refused in Anthropic's error shape on
//! its paths), the HTTP request counter and latency histogram, and JSON answers for an
//! unknown path (404) or a wrong method (405).

use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, Method, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::anthropic::error::{MessagesError, PATH_PREFIX};
use super::error::ApiError;
use super::AppState;

pub(super) async fn require_api_key(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    // `Authorization: Bearer <key>` (OpenAI's clients) or `x-api-key: <key>` (Anthropic's).
    let headers = request.headers();
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()))
        .map(str::trim);
    if state.key_matches(presented) {
        next.run(request).await
    } else if request.uri().path().starts_with(PATH_PREFIX) {
        MessagesError(ApiError::unauthorized()).into_response()
    } else {
        ApiError::unauthorized().into_response()
    }
}

pub(super) async fn record_http_metrics(request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = request.method().to_string();
    let path = request
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "unmatched".to_string());
    let response = next.run(request).await;
    let status = response.status().as_u16().to_string();
    metrics::counter!(engine::metrics::http::HTTP_REQUESTS, "method" => method.clone(), "path" => path.clone(), "status" => status)
        .increment(1);
    metrics::histogram!(engine::metrics::http::HTTP_LATENCY, "method" => method, "path" => path)
        .record(started.elapsed().as_secs_f64());
    response
}

pub(super) async fn not_found(method: Method, uri: Uri) -> ApiError {
    ApiError::unknown_path(method.as_str(), uri.path())
}

pub(super) async fn wrong_method(method: Method, uri: Uri) -> ApiError {
    ApiError::wrong_method(method.as_str(), uri.path())
}
