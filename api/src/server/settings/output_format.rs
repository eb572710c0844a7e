//! The output format a request asks for, read into an engine constraint: OpenAI's
//! `response_format` (`text`, `json_object`, `json_schema`) and vLLM's `structured_outputs`
//! (`json`, `json_object`, `regex`, `choice`, `grammar`), with a 400 naming the field for
//! every value thicket cannot honour.

use engine::constraint::ConstraintSpec;

use crate::server::error::{ApiError, ApiResult};

/// The output format `response_format` asks for: `text` (or none) leaves the output free;
/// `json_object` asks for any JSON object; `json_schema` for a value valid against
/// `json_schema.schema` (OpenAI's shape: `{"type": "json_schema", "json_schema": {"name",
/// "schema", "strict"}}`). Whether a schema can be compiled is checked when the request is
/// submitted.
pub fn response_format(format: Option<&serde_json::Value>) -> ApiResult<Option<ConstraintSpec>> {
    let Some(format) = format.filter(|f| !f.is_null()) else {
        return Ok(None);
    };
    let bad = |message: &str| ApiError::invalid("response_format", message);
    let kind = format.get("type").and_then(|t| t.as_str()).ok_or_else(|| {
        bad("response_format needs a string `type`: text, json_object or json_schema")
    })?;
    match kind {
        "text" => Ok(None),
        "json_object" => Ok(Some(ConstraintSpec::JsonObject)),
        "json_schema" => {
            let spec = format
                .get("json_schema")
                .filter(|s| s.is_object())
                .ok_or_else(|| bad("json_schema needs a `json_schema` object with a `schema`"))?;
            match spec.get("schema") {
                Some(schema) if schema.is_object() || schema.is_boolean() => {
                    Ok(Some(ConstraintSpec::JsonSchema(schema.clone())))
                }
                // OpenAI allows leaving the schema out: any JSON object.
                None => Ok(Some(ConstraintSpec::JsonObject)),
                Some(_) => Err(bad("json_schema.schema must be a JSON schema object")),
            }
        }
        other => Err(bad(&format!(
            "unknown response_format type {other:?}: use text, json_object or json_schema"
        ))),
    }
}

/// The output format `structured_outputs` asks for (vLLM's names): exactly one of
/// `{"json": schema}` (a schema object, or one as a JSON string), `{"json_object": true}`,
/// `{"regex": "..."}`, `{"choice": ["a", "b"]}` or `{"grammar": "lark text"}`.
pub fn structured_outputs(value: Option<&serde_json::Value>) -> ApiResult<Option<ConstraintSpec>> {
    let Some(value) = value.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let field = "structured_outputs";
    let object = value
        .as_object()
        .ok_or_else(|| ApiError::invalid(field, "structured_outputs must be an object"))?;
    let given: Vec<(&String, &serde_json::Value)> =
        object.iter().filter(|(_, v)| !v.is_null()).collect();
    let [(key, v)] = given.as_slice() else {
        return Err(ApiError::invalid(
            field,
            "give exactly one of json, json_object, regex, choice or grammar",
        ));
    };
    let path = format!("{field}.{key}");
    let string = |what: &str| {
        v.as_str()
            .map(str::to_string)
            .ok_or_else(|| ApiError::invalid(path.clone(), format!("{what} must be a string")))
    };
    let spec = match key.as_str() {
        "json" => match v {
            serde_json::Value::String(text) => {
                let schema = serde_json::from_str(text).map_err(|e| {
                    ApiError::invalid(path.clone(), format!("not a JSON schema: {e}"))
                })?;
                ConstraintSpec::JsonSchema(schema)
            }
            serde_json::Value::Object(_) | serde_json::Value::Bool(_) => {
                ConstraintSpec::JsonSchema((*v).clone())
            }
            _ => return Err(ApiError::invalid(path, "json must be a JSON schema")),
        },
        "json_object" if v.as_bool() == Some(true) => ConstraintSpec::JsonObject,
        "json_object" => return Ok(None),
        "regex" => ConstraintSpec::Regex(string("regex")?),
        "grammar" => ConstraintSpec::Lark(string("grammar")?),
        "choice" => {
            let choices: Option<Vec<String>> = v
                .as_array()
                .and_then(|a| a.iter().map(|c| c.as_str().map(str::to_string)).collect());
            match choices {
                Some(c) if !c.is_empty() => ConstraintSpec::Choice(c),
                _ => {
                    return Err(ApiError::invalid(
                        path,
                        "choice must be a non-empty list of strings",
                    ))
                }
            }
        }
        other => {
            return Err(ApiError::invalid(
                field,
                format!("unknown key {other:?}: use json, json_object, regex, choice or grammar"),
            ))
        }
    };
    Ok(Some(spec))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn response_formats_map_onto_constraints() {
        let schema =
            serde_json::json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let cases = [
            (serde_json::Value::Null, None),
            (serde_json::json!({"type": "text"}), None),
            (
                serde_json::json!({"type": "json_object"}),
                Some(ConstraintSpec::JsonObject),
            ),
            (
                serde_json::json!({"type": "json_schema", "json_schema": {"name": "a", "schema": schema, "strict": true}}),
                Some(ConstraintSpec::JsonSchema(schema.clone())),
            ),
            (
                serde_json::json!({"type": "json_schema", "json_schema": {"name": "a"}}),
                Some(ConstraintSpec::JsonObject),
            ),
        ];
        for (format, want) in cases {
            assert_eq!(response_format(Some(&format)).unwrap(), want, "{format}");
        }
        assert_eq!(response_format(None).unwrap(), None);
        for bad in [
            serde_json::json!({"type": "yaml"}),
            serde_json::json!({"type": 3}),
            serde_json::json!({"type": "json_schema"}),
            serde_json::json!({"type": "json_schema", "json_schema": {"schema": "x"}}),
        ] {
            let e = response_format(Some(&bad)).unwrap_err();
            assert_eq!(param_of(e), "response_format", "{bad}");
        }
    }

    #[test]
    fn structured_outputs_map_onto_constraints() {
        let schema = serde_json::json!({"type": "object"});
        let cases = [
            (
                serde_json::json!({"json": schema}),
                Some(ConstraintSpec::JsonSchema(schema.clone())),
            ),
            (
                serde_json::json!({"json": "{\"type\": \"object\"}"}),
                Some(ConstraintSpec::JsonSchema(schema.clone())),
            ),
            (
                serde_json::json!({"json_object": true}),
                Some(ConstraintSpec::JsonObject),
            ),
            (
                serde_json::json!({"regex": "a+"}),
                Some(ConstraintSpec::Regex("a+".into())),
            ),
            (
                serde_json::json!({"choice": ["yes", "no"], "regex": null}),
                Some(ConstraintSpec::Choice(vec!["yes".into(), "no".into()])),
            ),
            (
                serde_json::json!({"grammar": "start: \"a\""}),
                Some(ConstraintSpec::Lark("start: \"a\"".into())),
            ),
        ];
        for (value, want) in cases {
            assert_eq!(structured_outputs(Some(&value)).unwrap(), want, "{value}");
        }
        for (bad, param) in [
            (serde_json::json!([1]), "structured_outputs"),
            (serde_json::json!({}), "structured_outputs"),
            (
                serde_json::json!({"regex": "a", "choice": ["b"]}),
                "structured_outputs",
            ),
            (serde_json::json!({"yaml": "x"}), "structured_outputs"),
            (
                serde_json::json!({"choice": []}),
                "structured_outputs.choice",
            ),
            (
                serde_json::json!({"choice": [1]}),
                "structured_outputs.choice",
            ),
            (serde_json::json!({"regex": 3}), "structured_outputs.regex"),
            (
                serde_json::json!({"json": "{not json"}),
                "structured_outputs.json",
            ),
        ] {
            let e = structured_outputs(Some(&bad)).unwrap_err();
            assert_eq!(param_of(e), param, "{bad}");
        }
    }

    fn param_of(e: ApiError) -> String {
        e.param.unwrap_or_default()
    }
}
