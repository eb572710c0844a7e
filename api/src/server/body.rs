//! The JSON body extractor of every POST endpoint: reads the body whatever its content
//! type, answers 413 past the size limit, and turns a parse failure into a 400 that names
//! the field at fault (its path, like `messages[0].content`).

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use super::error::ApiError;
use super::settings::fields::HasCommonFields;

/// A request body parsed as `T`.
pub struct JsonBody<T>(pub T);

impl<S, T> FromRequest<S> for JsonBody<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = Bytes::from_request(request, state).await.map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::too_large()
            } else {
                ApiError::bad_body(format!("could not read the request body: {e}"))
            }
        })?;
        parse(&bytes).map(JsonBody)
    }
}

/// Parses `bytes` as `T`; errors name the offending field.
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.is_empty() {
        return Err(ApiError::bad_body(
            "the request body is empty; send a JSON object",
        ));
    }
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    match serde_path_to_error::deserialize(&mut deserializer) {
        Ok(value) => {
            deserializer
                .end()
                .map_err(|e| ApiError::bad_body(format!("invalid JSON: {e}")))?;
            Ok(value)
        }
        Err(e) => {
            let path = e.path().to_string();
            let inner = e.into_inner();
            if inner.is_syntax() || inner.is_eof() || path == "." {
                Err(ApiError::bad_body(format!("invalid JSON: {inner}")))
            } else {
                Err(ApiError::invalid(path.clone(), format!("{path}: {inner}")))
            }
        }
    }
}

/// A generation request body: its own fields and the shared ones, both from one object.
pub struct GenerationBody<T>(pub T);

impl<S, T> FromRequest<S> for GenerationBody<T>
where
    T: DeserializeOwned + HasCommonFields,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let JsonBody(value) = JsonBody::<serde_json::Value>::from_request(request, state).await?;
        generation_body(&value).map(GenerationBody)
    }
}

/// Reads a generation request (its own fields and the shared ones) from a parsed JSON body.
pub fn generation_body<T>(value: &serde_json::Value) -> Result<T, ApiError>
where
    T: DeserializeOwned + HasCommonFields,
{
    if !value.is_object() {
        return Err(ApiError::bad_body("the request body must be a JSON object"));
    }
    let mut body: T = from_value(value)?;
    *body.common_mut() = from_value(value)?;
    Ok(body)
}

/// Reads `T` from a parsed JSON value; errors name the offending field.
/// A request body of type `T` from a parsed JSON value (a batch line's body), with the errors
/// the HTTP route gives.
pub fn json_body<T: DeserializeOwned>(value: &serde_json::Value) -> Result<T, ApiError> {
    if !value.is_object() {
        return Err(ApiError::bad_body("the request body must be a JSON object"));
    }
    from_value(value)
}

fn from_value<T: DeserializeOwned>(value: &serde_json::Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path == "." {
            ApiError::bad_body(format!("invalid request: {inner}"))
        } else {
            ApiError::invalid(path.clone(), format!("{path}: {inner}"))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    struct Body {
        #[allow(dead_code)]
        n: Option<u32>,
    }

    #[test]
    fn errors_name_the_field() {
        let e = parse::<Body>(br#"{"n": "two"}"#).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(e.param.as_deref(), Some("n"));
        let e = parse::<Body>(b"{not json").unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert!(e.param.is_none());
        assert!(parse::<Body>(b"").is_err());
        assert!(parse::<Body>(br#"{"n": 2, "unknown": [1]}"#).is_ok());
    }
}
