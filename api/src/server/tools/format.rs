//! Tool-call formats (`--tool-call-parser`): how a model family writes its calls, read back
//! from its answers and written as the grammar of `tool_choice: required` or a named
//! function. Each format is a type behind [`ToolFormat`] (`super::formats` names them); this
//! holds the trait and what the formats share: call schemas, markers in grammars, reading a
//! call object and JSON values.

use serde_json::{json, Value};

use super::call_json::{call_so_far, compact_json, CallSoFar};
use super::partial_json::json_prefix;
use super::{ParsedCall, Tool};

/// How one model family writes tool calls.
pub trait ToolFormat: Send + Sync + std::fmt::Debug {
    /// Its `--tool-call-parser` name.
    fn name(&self) -> &'static str;
    /// Strings that open the calls of an answer (text before the first is content).
    fn openers(&self) -> &'static [&'static str];
    /// Whether an answer that opens with `{` may be calls without an opener.
    fn bare_json(&self) -> bool {
        false
    }
    /// Whether its markers are special tokens in the models that write it (they must then
    /// stay in the answer's text for it to be read).
    fn special_markers(&self) -> bool {
        false
    }
    /// The string that closes one call, where calls come one block at a time (a stream then
    /// gives each call as its block closes; otherwise the calls are read at the end).
    fn block_close(&self) -> Option<&'static str> {
        None
    }
    /// The calls in `text` (from an opener on, or a bare answer), `None` when it holds no
    /// well-formed call of an `offered` function; `finished` says the answer ended there
    /// (a call cut off by the token limit may then count, as far as it got).
    fn parse(&self, text: &str, offered: &[Tool], finished: bool) -> Option<Vec<ParsedCall>>;
    /// The calls a block (from its opener on, or a bare answer) holds as far as they are
    /// written, in order: each call's name once it is whole and its arguments (JSON) as far
    /// as they go, a prefix of what the block read whole gives them. Empty where the
    /// format's calls do not stream.
    fn calls_so_far(&self, _block: &str, _offered: &[Tool]) -> Vec<CallSoFar> {
        Vec::new()
    }
    /// Markers with which the model hands control back after its calls (to wait for their
    /// results): the answer ends at them, as at the model's end token.
    fn end_markers(&self) -> &'static [&'static str] {
        &[]
    }
    /// A Lark grammar whose sentences are one call of one of `allowed` (several, separated
    /// as the format separates them, when `several`), arguments valid against the schema;
    /// its markers written as `markers` says.
    fn grammar(&self, allowed: &[&Tool], several: bool, markers: &Markers<'_>) -> String;
}

/// The JSON schema of one call object of `tool`: `{name_key: its name, args_key: its
/// arguments}`.
pub fn call_schema(tool: &Tool, args_key: &str) -> Value {
    json!({
        "type": "object",
        "properties": {"name": {"const": tool.name}, args_key: tool.parameters},
        "required": ["name", args_key],
        "additionalProperties": false,
    })
}

/// One schema for a call of any of `allowed`.
pub fn any_call_schema(allowed: &[&Tool], args_key: &str) -> Value {
    let calls: Vec<Value> = allowed.iter().map(|t| call_schema(t, args_key)).collect();
    match <[Value; 1]>::try_from(calls) {
        Ok([one]) => one,
        Err(many) => json!({"anyOf": many}),
    }
}

/// How a grammar writes a format's markers: as the model's own token where the marker is one
/// special token of its vocabulary (`[TOOL_CALLS]` in Mistral's), which text cannot match, so
/// the model writes it as it was trained to; else as text (which an ordinary token such as
/// Qwen2.5's `<tool_call>` matches).
pub struct Markers<'a> {
    token: &'a dyn Fn(&str) -> Option<u32>,
}

impl<'a> Markers<'a> {
    /// Markers written as the token `token` gives for them, where it gives one.
    pub fn new(token: &'a dyn Fn(&str) -> Option<u32>) -> Self {
        Self { token }
    }

    /// Whether `marker` is written as the model's own token.
    pub fn is_token(&self, marker: &str) -> bool {
        (self.token)(marker).is_some()
    }

    /// `marker` in Lark: `<[id]>` for the model's token, else a string literal.
    pub fn write(&self, marker: &str) -> String {
        match (self.token)(marker) {
            Some(id) => format!("<[{id}]>"),
            None => lark_string(marker),
        }
    }
}

/// Markers always written as text.
pub fn as_text(_: &str) -> Option<u32> {
    None
}

/// `text` as a Lark string literal.
pub fn lark_string(text: &str) -> String {
    Value::String(text.to_string()).to_string()
}

/// A call object's name and arguments (under `arguments`, or `parameters`, which some
/// models write; arguments written as a JSON string are taken as they are, others as the
/// model wrote them in `text`, compact: what a stream of them gives); with `offered` (a call
/// without the format's marker), only when it names one of them. `value` is `text` parsed.
pub fn call_of(text: &str, value: &Value, offered: Option<&[Tool]>) -> Option<ParsedCall> {
    let name = value.get("name")?.as_str()?;
    if offered.is_some_and(|tools| !tools.iter().any(|t| t.name == name)) {
        return None;
    }
    let arguments = value
        .get("arguments")
        .or_else(|| value.get("parameters"))
        .cloned()
        .unwrap_or_else(|| json!({}));
    let arguments = match arguments {
        Value::String(s) if serde_json::from_str::<Value>(&s).is_ok_and(|v| v.is_object()) => s,
        other => call_so_far(text)
            .filter(|c| c.closed && !c.quoted && !c.arguments.is_empty())
            .map_or_else(|| other.to_string(), |written| written.arguments),
    };
    Some(ParsedCall {
        name: name.to_string(),
        arguments,
    })
}

/// A call cut off inside its arguments (`{"name": "f", "arguments": {"a": "...`, or
/// `"parameters"`): the name, if it is one of `offered`, and the arguments as far as they go
/// (as OpenAI returns a call whose arguments ran out of tokens), compact as a streamed call's
/// are ([`compact_json`]). `None` unless the text
/// could still have become a whole call.
pub fn partial_call(body: &str, offered: &[Tool]) -> Option<ParsedCall> {
    if !json_prefix(body) {
        return None;
    }
    let rest = body.trim_start().strip_prefix('{')?.trim_start();
    let rest = rest
        .strip_prefix("\"name\"")?
        .trim_start()
        .strip_prefix(':')?;
    let rest = rest.trim_start().strip_prefix('"')?;
    let (name, rest) = rest.split_once('"')?;
    let rest = rest.trim_start().strip_prefix(',')?.trim_start();
    let rest = rest
        .strip_prefix("\"arguments\"")
        .or_else(|| rest.strip_prefix("\"parameters\""))?
        .trim_start()
        .strip_prefix(':')?;
    offered.iter().any(|t| t.name == name).then(|| ParsedCall {
        name: name.to_string(),
        arguments: compact_json(rest),
    })
}

/// The whole JSON values of `text` (each with its text), separated by blanks and
/// `separator`, and the text of the last one where the token limit cut it off (`""` when
/// none is); `None` when anything else is there, unless `leading` and some values came
/// before it (then it is dropped).
pub fn json_values(
    text: &str,
    separator: char,
    leading: bool,
) -> Option<(Vec<(Value, &str)>, &str)> {
    let mut out = Vec::new();
    let mut rest = text.trim_start();
    while !rest.is_empty() {
        let mut stream = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        match stream.next()? {
            Ok(value) => out.push((value, &rest[..stream.byte_offset()])),
            Err(e) if e.is_eof() => return Some((out, rest)),
            Err(_) if leading && !out.is_empty() => return Some((out, "")),
            Err(_) => return None,
        }
        rest = rest[stream.byte_offset()..].trim_start();
        rest = rest.strip_prefix(separator).unwrap_or(rest).trim_start();
    }
    Some((out, ""))
}
