//! Errors of the HTTP API in OpenAI's shape, `{"error": {"message", "type", "param",
//! "code"}}`, with the status each one answers with. Every failure a handler can meet turns
//! into one of these; nothing a client sends reaches a panic or a 500.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use engine::handle::SubmitError;
use engine::{Failure, InvalidRequest};
use serde::Serialize;

/// Seconds a client told 429 should wait before retrying.
pub const RETRY_AFTER_SECONDS: u32 = 1;

/// One failed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// What went wrong, for a person.
    pub message: String,
    /// The request field at fault, when there is one.
    pub param: Option<String>,
    /// A stable machine-readable code.
    pub code: Option<&'static str>,
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: ErrorDetail<'a>,
}

#[derive(Serialize)]
struct ErrorDetail<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    param: Option<&'a str>,
    code: Option<&'static str>,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            param: None,
            code: None,
        }
    }

    /// 400: a field has an invalid value.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            param: Some(param.into()),
            ..Self::new(StatusCode::BAD_REQUEST, message)
        }
    }

    /// 400: the body is not the JSON the endpoint expects.
    pub fn bad_body(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    /// 401: the API key is missing or wrong.
    pub fn unauthorized() -> Self {
        Self {
            code: Some("invalid_api_key"),
            ..Self::new(
                StatusCode::UNAUTHORIZED,
                "missing or invalid API key: send the header 'Authorization: Bearer <key>' (or 'x-api-key: <key>')",
            )
        }
    }

    /// 404: no such model.
    pub fn unknown_model(name: &str, served: &str) -> Self {
        Self {
            param: Some("model".into()),
            code: Some("model_not_found"),
            ..Self::new(
                StatusCode::NOT_FOUND,
                format!("the model '{name}' does not exist; this server serves '{served}'"),
            )
        }
    }

    /// 404: what the request names does not exist (`code` says what kind of thing).
    pub fn not_found(message: impl Into<String>, code: &'static str) -> Self {
        Self {
            code: Some(code),
            ..Self::new(StatusCode::NOT_FOUND, message)
        }
    }

    /// 404: no such path.
    pub fn unknown_path(method: &str, path: &str) -> Self {
        Self {
            code: Some("not_found"),
            ..Self::new(
                StatusCode::NOT_FOUND,
                format!("no route for {method} {path}"),
            )
        }
    }

    /// 405: the path exists for other methods.
    pub fn wrong_method(method: &str, path: &str) -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("{path} does not accept {method}"),
        )
    }

    /// 413: the body is over the limit.
    pub fn too_large() -> Self {
        Self {
            code: Some("request_too_large"),
            ..Self::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "the request body is larger than this server accepts",
            )
        }
    }

    /// 429: the queue is full.
    pub fn overloaded(pending: usize) -> Self {
        Self {
            code: Some("rate_limit_exceeded"),
            ..Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                format!("the server is busy ({pending} requests queued); retry later"),
            )
        }
    }

    /// 503: the model is loading or the server is shutting down.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, message)
    }

    /// 500: something failed inside the engine.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }

    fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            StatusCode::SERVICE_UNAVAILABLE => "service_unavailable_error",
            s if s.is_server_error() => "server_error",
            _ => "invalid_request_error",
        }
    }

    /// The JSON body (also used for errors inside a stream).
    pub fn body(&self) -> serde_json::Value {
        serde_json::to_value(ErrorBody {
            error: ErrorDetail {
                message: &self.message,
                kind: self.kind(),
                param: self.param.as_deref(),
                code: self.code,
            },
        })
        .unwrap_or_default()
    }
}

impl From<InvalidRequest> for ApiError {
    fn from(e: InvalidRequest) -> Self {
        Self::invalid(e.field, e.message)
    }
}

impl From<SubmitError> for ApiError {
    fn from(e: SubmitError) -> Self {
        match e {
            SubmitError::Invalid(e) => e.into(),
            SubmitError::Overloaded(pending) => Self::overloaded(pending),
            SubmitError::Stopped => Self::unavailable("the engine is shutting down"),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body())).into_response();
        if self.status == StatusCode::TOO_MANY_REQUESTS {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECONDS));
        }
        response
    }
}

/// Result of a handler.
pub type ApiResult<T> = Result<T, ApiError>;
/// What a generating request that the engine answered with pooled values (which it never
/// does) fails with.
pub fn not_generated() -> Failure {
    Failure::engine("the engine pooled a request that generates")
}

/// A request the engine could not finish: a 400 naming `format_field` when its output format
/// failed it (another try would fail alike, so it is no 5xx a router would retry), else a
/// 503 (the engine is shutting down, the request cannot fit, an internal error).
pub fn engine_failure(failure: &Failure, format_field: &str) -> ApiError {
    if failure.format {
        return ApiError::invalid(format_field, failure.message.clone());
    }
    ApiError::unavailable(format!(
        "the engine could not finish the request: {}",
        failure.message
    ))
}
