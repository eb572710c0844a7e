//! The `qwen3_coder` tool-call format (Qwen3-Coder, Qwen3.5): each call a `<tool_call>`
//! block holding `<function=NAME>` and one `<parameter=P>` element per argument, its value
//! as plain text on the lines between. Values are typed by the function's parameter schema
//! (a string stays text; integers, numbers and booleans are read as such; anything else as
//! JSON where it parses), the arguments written in the order of the parameters, and streamed
//! as they are written (a string value as it grows, escaped; any other once its element
//! closes); a block closes at the first `</tool_call>` right after its `</function>`, and one
//! cut off at the end of the answer keeps the parameters that closed and a string value as
//! far as it got. The grammar writes each allowed function's parameters in its schema's order,
//! required ones always, optional ones where the model chooses, and a string value as text
//! without `<` (within the schema's `minLength` and `maxLength`).

use serde_json::Value;

use super::call_json::CallSoFar;
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

/// One block's call as far as it is written.
#[derive(Debug, Default)]
struct Written {
    /// The function's name, once its tag closes.
    name: Option<String>,
    /// The arguments as JSON text so far: `{`, then each parameter in the order written
    /// (a string as far as it goes, any other value once its element closes), then `}` once
    /// the function closes.
    arguments: String,
    /// The text ends inside a string value.
    open_string: bool,
    /// `</function>` closed the call.
    closed: bool,
}

impl Written {
    /// The arguments of a block read whole: as written, closed where the block was cut off.
    fn whole(self) -> Option<ParsedCall> {
        let mut arguments = self.arguments;
        if !self.closed {
            if self.open_string {
                arguments.push('"');
            }
            arguments.push('}');
        }
        Some(ParsedCall {
            name: self.name?,
            arguments,
        })
    }
}

/// `text` as the inside of a JSON string.
fn escaped(text: &str) -> String {
    let quoted = Value::String(text.to_string()).to_string();
    quoted[1..quoted.len() - 1].to_string()
}

/// How much of the end of `value` (a string parameter's text so far) may still be the start
/// of its close (`\n</parameter>`, the line break dropped with it).
fn held_back(value: &str) -> usize {
    let close = format!("\n{PARAMETER_CLOSE}");
    (1..=value.len().min(close.len()))
        .rev()
        .find(|&n| {
            value.is_char_boundary(value.len() - n)
                && (close.starts_with(&value[value.len() - n..])
                    || PARAMETER_CLOSE.starts_with(&value[value.len() - n..]))
        })
        .unwrap_or(0)
}

/// The call in one block's body (after `<tool_call>`, up to its close or the end) as far as
/// it is written, its values typed by the parameter schemas of the function `offered` names.
fn written(body: &str, offered: &[Tool]) -> Written {
    let mut call = Written::default();
    let Some(at) = body.find(FUNCTION) else {
        return call;
    };
    let Some((name, mut rest)) = body[at + FUNCTION.len()..].split_once('>') else {
        return call;
    };
    let name = name.trim();
    if name.is_empty() {
        return call;
    }
    call.name = Some(name.to_string());
    call.arguments.push('{');
    let properties = offered
        .iter()
        .find(|t| t.name == name)
        .and_then(|t| t.parameters.get("properties"));
    let mut first = true;
    loop {
        let parameter = rest.find(PARAMETER);
        if let Some(end) = rest.find(FUNCTION_CLOSE) {
            if parameter.is_none_or(|p| end < p) {
                call.arguments.push('}');
                call.closed = true;
                return call;
            }
        }
        let Some(open) = parameter else {
            return call;
        };
        let after = &rest[open + PARAMETER.len()..];
        let Some((key, value)) = after.split_once('>') else {
            return call;
        };
        let key = key.trim();
        let schema = properties.and_then(|p| p.get(key));
        let member = |arguments: &mut String, first: bool| {
            if !first {
                arguments.push(',');
            }
            arguments.push_str(&Value::String(key.to_string()).to_string());
            arguments.push(':');
        };
        let Some(end) = value.find(PARAMETER_CLOSE) else {
            // An open string value streams as it grows; any other waits for its close.
            let text = schema.and_then(|s| s.get("type")).and_then(Value::as_str);
            if text == Some("string") && !value.is_empty() {
                let value = value.strip_prefix('\n').unwrap_or(value);
                member(&mut call.arguments, first);
                call.arguments.push('"');
                let shown = &value[..value.len() - held_back(value)];
                call.arguments.push_str(&escaped(shown));
                call.open_string = true;
            }
            return call;
        };
        let raw = &value[..end];
        let raw = raw.strip_prefix('\n').unwrap_or(raw);
        let raw = raw.strip_suffix('\n').unwrap_or(raw);
        member(&mut call.arguments, first);
        call.arguments.push_str(&typed(raw, schema).to_string());
        first = false;
        rest = &value[end + PARAMETER_CLOSE.len()..];
    }
}

/// The call in one block's body (after `<tool_call>`, up to its close or the end).
fn block_call(body: &str, offered: &[Tool]) -> Option<ParsedCall> {
    written(body, offered).whole()
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
            match block_call(body, offered) {
                Some(call) => calls.push(call),
                // A last block cut off before its name is whole is dropped after whole ones.
                None if next.is_empty() && !calls.is_empty() => {}
                None => return None,
            }
            rest = next;
        }
        (!calls.is_empty()).then_some(calls)
    }

    fn calls_so_far(&self, block: &str, offered: &[Tool]) -> Vec<CallSoFar> {
        let Some(body) = block.strip_prefix(TOOL_CALL_OPEN) else {
            return Vec::new();
        };
        let call = written(body, offered);
        vec![CallSoFar {
            name: call.name,
            arguments: call.arguments,
            closed: call.closed,
            ..CallSoFar::default()
        }]
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
