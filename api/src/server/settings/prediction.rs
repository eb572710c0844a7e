//! OpenAI's Predicted Outputs on the way in: the `prediction` field read (`{"type":
//! "content", "content": text or text parts}`, with a 400 naming the part that is wrong)
//! and tokenized once per request, as the model's output would be.

use engine::ModelTokenizer;

use super::Settings;
use crate::server::error::{ApiError, ApiResult};

impl Settings {
    /// Tokenizes the prediction (once for every prompt of the request), as the model's
    /// output would be: no special tokens added. An empty one is none. Its length is checked
    /// with each request it goes into (`Request::validate`).
    pub fn predict(&mut self, tokenizer: &ModelTokenizer) -> ApiResult<()> {
        let Some(text) = self.prediction_text.take() else {
            return Ok(());
        };
        let tokens = tokenizer
            .encode_plain(&text)
            .map_err(|e| ApiError::invalid("prediction", e.to_string()))?;
        self.prediction = (!tokens.is_empty()).then(|| tokens.into());
        Ok(())
    }
}

/// The text of a `prediction` (OpenAI's Predicted Outputs): `{"type": "content", "content":
/// "..."}`, or `content` as a list of `{"type": "text", "text": "..."}` parts, joined. Null
/// or absent: none. An empty prediction is accepted and drafts nothing.
pub fn prediction(value: Option<&serde_json::Value>) -> ApiResult<Option<String>> {
    let Some(value) = value.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let object = value.as_object().ok_or_else(|| {
        ApiError::invalid(
            "prediction",
            "prediction must be an object: {\"type\": \"content\", \"content\": ...}",
        )
    })?;
    match object.get("type").and_then(|t| t.as_str()) {
        Some("content") => {}
        Some(other) => {
            return Err(ApiError::invalid(
                "prediction.type",
                format!("unknown prediction type {other:?}: only \"content\" is supported"),
            ))
        }
        None => {
            return Err(ApiError::invalid(
                "prediction.type",
                "prediction needs \"type\": \"content\"",
            ))
        }
    }
    match object.get("content") {
        Some(serde_json::Value::String(text)) => Ok(Some(text.clone())),
        Some(serde_json::Value::Array(parts)) => {
            let mut text = String::new();
            for (i, part) in parts.iter().enumerate() {
                let path = format!("prediction.content[{i}]");
                match (
                    part.get("type").and_then(|t| t.as_str()),
                    part.get("text").and_then(|t| t.as_str()),
                ) {
                    (Some("text"), Some(t)) => text.push_str(t),
                    (Some("text"), None) => {
                        return Err(ApiError::invalid(path, "a text part needs a string `text`"))
                    }
                    (Some(kind), _) => {
                        return Err(ApiError::invalid(
                            path,
                            format!(
                                "prediction parts of type {kind:?} are not supported; only text"
                            ),
                        ))
                    }
                    (None, _) => {
                        return Err(ApiError::invalid(
                            path,
                            "a prediction part needs \"type\": \"text\" and a `text`",
                        ))
                    }
                }
            }
            Ok(Some(text))
        }
        _ => Err(ApiError::invalid(
            "prediction.content",
            "prediction.content must be a string or a list of text parts",
        )),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::prediction;

    #[test]
    fn both_shapes_are_read_and_bad_ones_name_the_part() {
        let text = |v: serde_json::Value| prediction(Some(&v)).map_err(|e| e.body());
        assert_eq!(
            text(json!({"type": "content", "content": "a b"})),
            Ok(Some("a b".into()))
        );
        let parts = json!({"type": "content", "content": [
            {"type": "text", "text": "a "}, {"type": "text", "text": "b"}]});
        assert_eq!(text(parts), Ok(Some("a b".into())));
        assert_eq!(prediction(None).ok(), Some(None));
        assert_eq!(prediction(Some(&json!(null))).ok(), Some(None));
        for (bad, field) in [
            (json!("text"), "prediction"),
            (json!({"type": "file", "content": "x"}), "prediction.type"),
            (json!({"content": "x"}), "prediction.type"),
            (
                json!({"type": "content", "content": 3}),
                "prediction.content",
            ),
            (
                json!({"type": "content", "content": [{"type": "image_url"}]}),
                "prediction.content[0]",
            ),
            (
                json!({"type": "content", "content": [{"type": "text"}]}),
                "prediction.content[0]",
            ),
        ] {
            let err = prediction(Some(&bad)).expect_err("refused");
            let body = err.body().to_string();
            assert!(body.contains(field), "{bad}: {body}");
        }
    }
}
