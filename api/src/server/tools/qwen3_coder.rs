//! The `qwen3_coder` tool-call format (Qwen3-Coder, Qwen3.5): each call a `<tool_call>`
//! block holding `<function=NAME>` and one `<parameter=P>` element per argument, its value
//! as plain text on the lines between. Values are typed by the function's parameter schema
//! (a string stays text; integers, numbers and booleans are read as such; anything else as
//! JSON where it parses); a block closes at the first `</tool_call>` right after its
//! `</function>`, and one cut off at the end of the answer keeps the parameters that closed. The grammar writes each allowed function's parameters in its schema's order,
//! required ones always, optional ones where the model chooses, and a string value as text
//! without `<` (within the schema's `minLength` and `maxLength`).

use serde_json::{Map, Value};

use super::format::{lark_string, Markers, ToolFormat};
use super::{ParsedCall, Tool};
use crate::chat::{TOOL_CALL_CLOSE, TOOL_CALL_OPEN};
use engine::constraint::compact;

const FUNCTION: &str = "<function=";
const FUNCTION_CLOSE: &str = "</function>";
const PARAMETER: &str = "<parameter=";
const PARAMETER_CLOSE: &str = "</parameter>";

/// `<tool_call><function=NAME><parameter=P>...` XML.
#[derive(Debug, Clone, Copy)]
pub struct Qwen3Coder;

/// `raw` typed as `schema` (a parameter's) says.
fn typed(raw: &str, schema: Option<&Value>) -> Value {
    let kind = schema.and_then(|s| s.get("type")).and_then(Value::as_str);
    let text = || Value::String(raw.to_string());
    match kind {
        Some("string") => text(),
        Some("integer") => raw
            .trim()
            .parse::<i64>()
            .map_or_else(|_| text(), Value::from),
        Some("number") => raw
            .trim()
            .parse::<f64>()
            .ok()
            .and_then(serde_json::Number::from_f64)
            .map_or_else(text, Value::Number),
        Some("boolean") => match raw.trim() {
            "true" | "True" => Value::Bool(true),
            "false" | "False" => Value::Bool(false),
            _ => text(),
        },
        _ => serde_json::from_str(raw.trim()).unwrap_or_else(|_| text()),
    }
}

/// The call in one block's body (after `<tool_call>`, up to its close or the end).
fn block_call(body: &str, offered: &[Tool]) -> Option<ParsedCall> {
    let rest = &body[body.find(FUNCTION)? + FUNCTION.len()..];
    let (name, mut rest) = rest.split_once('>')?;
    let name = name.trim();
    if name.is_empty() {
        return None;
    }
    if let Some(end) = rest.rfind(FUNCTION_CLOSE) {
        rest = &rest[..end];
    }
    let properties = offered
        .iter()
        .find(|t| t.name == name)
        .and_then(|t| t.parameters.get("properties"));
    let mut arguments = Map::new();
    while let Some(open) = rest.find(PARAMETER) {
        let after = &rest[open + PARAMETER.len()..];
        let Some((key, value)) = after.split_once('>') else {
            break;
        };
        let Some(end) = value.find(PARAMETER_CLOSE) else {
            break;
        };
        let raw = &value[..end];
        let raw = raw.strip_prefix('\n').unwrap_or(raw);
        let raw = raw.strip_suffix('\n').unwrap_or(raw);
        let key = key.trim();
        arguments.insert(
            key.to_string(),
            typed(raw, properties.and_then(|p| p.get(key))),
        );
        rest = &value[end + PARAMETER_CLOSE.len()..];
    }
    Some(ParsedCall {
        name: name.to_string(),
        arguments: Value::Object(arguments).to_string(),
    })
}

impl ToolFormat for Qwen3Coder {
    fn name(&self) -> &'static str {
        "qwen3_coder"
    }

    fn openers(&self) -> &'static [&'static str] {
        &[TOOL_CALL_OPEN]
    }

    fn block_close(&self) -> Option<&'static str> {
        Some(TOOL_CALL_CLOSE)
    }

    fn parse(&self, text: &str, offered: &[Tool], finished: bool) -> Option<Vec<ParsedCall>> {
        let mut calls = Vec::new();
        let mut rest = text;
        while let Some(open) = rest.find(TOOL_CALL_OPEN) {
            let body = &rest[open + TOOL_CALL_OPEN.len()..];
            // The block closes at the first close marker right after `</function>` (one
            // inside a JSON value is text).
            let close = body
                .match_indices(TOOL_CALL_CLOSE)
                .map(|(end, _)| end)
                .find(|&end| body[..end].trim_end().ends_with(FUNCTION_CLOSE));
            let (body, next) = match close {
                Some(end) => (&body[..end], &body[end + TOOL_CALL_CLOSE.len()..]),
                None if finished => (body, ""),
                None => break,
            };
            calls.push(block_call(body, offered)?);
            rest = next;
        }
        (!calls.is_empty()).then_some(calls)
    }

    fn grammar(&self, allowed: &[&Tool], several: bool, markers: &Markers<'_>) -> String {
        let mut rules = Vec::new();
        let mut calls = Vec::new();
        for (i, tool) in allowed.iter().enumerate() {
            let properties = tool
                .parameters
                .get("properties")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            let required: Vec<&str> = tool
                .parameters
                .get("required")
                .and_then(Value::as_array)
                .map(|r| r.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let mut params = Vec::new();
            for (j, (key, schema)) in properties.iter().enumerate() {
                let (rule, value) = (format!("p_{i}_{j}"), format!("v_{i}_{j}"));
                match value_rule(schema) {
                    // A JSON value is a rule of its own, the line break after it.
                    Err(json) => {
                        rules.push(format!("{value}_json: %json {json}"));
                        rules.push(format!("{value}: {value}_json \"\\n\""));
                    }
                    Ok(body) => rules.push(format!("{value}: {body}")),
                }
                rules.push(format!(
                    "{rule}: {} \"\\n\" {value} {} \"\\n\"",
                    lark_string(&format!("{PARAMETER}{key}>")),
                    lark_string(PARAMETER_CLOSE),
                ));
                params.push(if required.contains(&key.as_str()) {
                    rule
                } else {
                    format!("{rule}?")
                });
            }
            rules.push(format!(
                "call_{i}: {} \"\\n\" {} \"\\n\" {} {} \"\\n\" {}",
                markers.write(TOOL_CALL_OPEN),
                lark_string(&format!("{FUNCTION}{}>", tool.name)),
                params.join(" "),
                lark_string(FUNCTION_CLOSE),
                markers.write(TOOL_CALL_CLOSE),
            ));
            calls.push(format!("call_{i}"));
        }
        let repeat = if several { " (\"\\n\" call)*" } else { "" };
        format!(
            "start: call{repeat}\ncall: {}\n{}\n",
            calls.join(" | "),
            rules.join("\n")
        )
    }
}

/// The grammar of one parameter's value and the line break after it, as its schema types
/// it (text has no `<`, so it runs to the break before `</parameter>`); a value of any other
/// type is JSON valid against its schema (`Err`: the schema, for a `%json` rule).
fn value_rule(schema: &Value) -> Result<String, Value> {
    if let Some(choices) = schema.get("enum").and_then(Value::as_array) {
        let texts: Vec<String> = choices
            .iter()
            .map(|c| match c {
                Value::String(s) => lark_string(s),
                other => lark_string(&other.to_string()),
            })
            .collect();
        if !texts.is_empty() {
            return Ok(format!("({}) \"\\n\"", texts.join(" | ")));
        }
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("string") => {
            // Its length bounds, where the schema gives them.
            let bound = |key| schema.get(key).and_then(Value::as_u64);
            Ok(match (bound("minLength"), bound("maxLength")) {
                (None, None) => "/[^<]*\\n/".into(),
                (min, max) => format!(
                    "/[^<]{{{},{}}}\\n/",
                    min.unwrap_or(0),
                    max.map(|m| m.to_string()).unwrap_or_default()
                ),
            })
        }
        Some("integer") => Ok("/-?[0-9]+\\n/".into()),
        Some("number") => Ok("/-?[0-9]+(\\.[0-9]+)?([eE][-+]?[0-9]+)?\\n/".into()),
        Some("boolean") => Ok("/(true|false)\\n/".into()),
        _ => Err(compact(schema.clone())),
    }
}
