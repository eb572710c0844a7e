//! `POST /v1/embeddings`, as OpenAI's client sends it: `input` as a string, a list of
//! strings, a list of token ids or a list of such lists; `encoding_format` `float` or
//! `base64` (little-endian f32, what the `openai` client asks for by default); `dimensions`
//! (the first components, scaled back to unit length, for a model trained for it);
//! `truncate_prompt_tokens` (vLLM's); `usage`.

use axum::extract::State;
use axum::Json;
use base64::Engine as _;
use engine::encoder::pooling::truncate_dimensions;
use engine::encoder::{EncoderHandle, EncoderInput};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::{run, strings, text_input, token_count, truncation, MAX_INPUTS};
use crate::server::body::JsonBody;
use crate::server::error::{ApiError, ApiResult};
use crate::server::AppState;

/// The body of `POST /v1/embeddings`.
#[derive(Debug, Deserialize)]
pub struct EmbeddingsRequest {
    /// The served model (optional).
    #[serde(default)]
    pub model: Option<String>,
    /// What to embed.
    pub input: Value,
    /// `float` (default) or `base64`.
    #[serde(default)]
    pub encoding_format: Option<String>,
    /// Components to keep.
    #[serde(default)]
    pub dimensions: Option<Value>,
    /// Cap on each input's tokens (`-1`: the model's limit).
    #[serde(default)]
    pub truncate_prompt_tokens: Option<Value>,
    /// The end user (accepted, unused).
    #[serde(default)]
    pub user: Option<String>,
}

/// `POST /v1/embeddings`.
pub(crate) async fn create(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<EmbeddingsRequest>,
) -> ApiResult<Json<EmbeddingsResponse>> {
    let encoder = state.encoder()?;
    state.check_embedding_model(body.model.as_deref())?;
    if let engine::encoder::EncoderTask::Classify { .. } = encoder.task() {
        return Err(ApiError::invalid(
            "model",
            format!(
                "'{}' is a cross-encoder: it scores text pairs (/v1/rerank, /v1/score) and \
                 gives no embeddings",
                state.embedding_model_name()
            ),
        ));
    }
    let base64 = match body.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::invalid(
                "encoding_format",
                format!("encoding_format {other:?} is not one of float, base64"),
            ))
        }
    };
    let dimensions = dimensions(body.dimensions.as_ref(), encoder)?;
    let truncate = truncation(body.truncate_prompt_tokens.as_ref(), encoder)?;
    let inputs = inputs(&body.input, encoder, truncate)?;
    let tokens = token_count(&inputs);
    let vectors = run(encoder, inputs).await?;
    let data: Vec<EmbeddingOut> = vectors
        .into_iter()
        .enumerate()
        .map(|(index, v)| {
            let v = match dimensions {
                Some(d) => truncate_dimensions(v, d),
                None => v,
            };
            let embedding = match base64 {
                true => {
                    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                    Vector::Base64(base64::engine::general_purpose::STANDARD.encode(bytes))
                }
                false => Vector::Float(v),
            };
            EmbeddingOut {
                object: "embedding",
                index,
                embedding,
            }
        })
        .collect();
    Ok(Json(EmbeddingsResponse {
        object: "list",
        data,
        model: state.embedding_model_name().to_string(),
        usage: json!({"prompt_tokens": tokens, "total_tokens": tokens}),
    }))
}

/// The answer of `POST /v1/embeddings`, typed so that each f32 is written as the shortest
/// decimal that reads back as that f32 (a `serde_json::Value` would write its f64 digits).
#[derive(Serialize)]
pub struct EmbeddingsResponse {
    object: &'static str,
    data: Vec<EmbeddingOut>,
    model: String,
    usage: Value,
}

#[derive(Serialize)]
struct EmbeddingOut {
    object: &'static str,
    index: usize,
    embedding: Vector,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Vector {
    Float(Vec<f32>),
    Base64(String),
}

/// `dimensions`: a positive count, no larger than the model's width, and other than the width
/// only for a model that declares Matryoshka training.
fn dimensions(value: Option<&Value>, encoder: &EncoderHandle) -> ApiResult<Option<usize>> {
    let width = encoder.hidden_size();
    let Some(value) = value.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let d = value
        .as_u64()
        .filter(|&d| d >= 1)
        .ok_or_else(|| ApiError::invalid("dimensions", "dimensions must be a positive integer"))?;
    let d = usize::try_from(d).unwrap_or(usize::MAX);
    if d == width {
        return Ok(None);
    }
    if d > width {
        return Err(ApiError::invalid(
            "dimensions",
            format!("dimensions {d} is more than the model's {width}"),
        ));
    }
    encoder
        .matryoshka(d)
        .map_err(|message| ApiError::invalid("dimensions", message))?;
    Ok(Some(d))
}

/// `input` in any of OpenAI's four shapes, as encoder inputs.
fn inputs(
    input: &Value,
    encoder: &EncoderHandle,
    truncate: Option<usize>,
) -> ApiResult<Vec<EncoderInput>> {
    let ids = |value: &Value, field: &str| -> ApiResult<EncoderInput> {
        let Value::Array(items) = value else {
            return Err(ApiError::invalid(
                field,
                format!("{field} must be a list of token ids"),
            ));
        };
        let ids = items
            .iter()
            .map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()))
            .collect::<Option<Vec<u32>>>()
            .ok_or_else(|| {
                ApiError::invalid(
                    field,
                    format!("{field} must hold token ids (non-negative integers)"),
                )
            })?;
        if ids.is_empty() {
            return Err(ApiError::invalid(
                field,
                format!("{field} is an empty list"),
            ));
        }
        encoder
            .tokenizer()
            .ids(ids, truncate)
            .map_err(|e| ApiError::invalid(field, format!("{field}: {e}")))
    };
    match input {
        Value::String(text) => Ok(vec![text_input(encoder, text, truncate, "input")?]),
        Value::Array(items) if items.first().is_some_and(Value::is_number) => {
            Ok(vec![ids(input, "input")?])
        }
        Value::Array(items) if items.first().is_some_and(Value::is_array) => {
            if items.len() > MAX_INPUTS {
                return Err(ApiError::invalid(
                    "input",
                    format!("input has {} items; at most {MAX_INPUTS} are accepted", items.len()),
                ));
            }
            items
                .iter()
                .enumerate()
                .map(|(i, item)| ids(item, &format!("input[{i}]")))
                .collect()
        }
        Value::Array(_) => strings(input, "input")?
            .iter()
            .enumerate()
            .map(|(i, text)| text_input(encoder, text, truncate, &format!("input[{i}]")))
            .collect(),
        _ => Err(ApiError::invalid(
            "input",
            "input must be a string, a list of strings, a list of token ids or a list of lists of token ids",
        )),
    }
}
