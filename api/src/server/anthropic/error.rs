//! Errors on Anthropic's paths, in Anthropic's shape: `{"type": "error", "error": {"type",
//! "message"}}`, with the status (and headers) the other routes give the same error; and the
//! JSON body extractor that answers its failures so.

use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

use crate::server::body::JsonBody;
use crate::server::error::ApiError;

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
