//! The `llama3_json` tool-call format (Llama 3.1-3.3's JSON tool calling): the answer is the
//! call, a JSON object `{"name": ..., "parameters": {...}}` (`arguments` is read too), after
//! an optional `<|python_tag|>`; several calls are separated by `;`. Without the tag an
//! answer is read as calls only when every object names an offered function, so a JSON
//! answer to a question stays content. A last call cut off by the token limit counts as far
//! as its arguments got.

use serde_json::Value;

use super::format::{any_call_schema, call_of, partial_call, Markers, ToolFormat};
use super::{ParsedCall, Tool};
use engine::constraint::compact;

/// The tag Llama writes before a call.
pub const PYTHON_TAG: &str = "<|python_tag|>";

/// JSON objects after an optional `<|python_tag|>`.
#[derive(Debug, Clone, Copy)]
pub struct Llama3Json;

/// The whole JSON values of `text`, separated by blanks and `;`, and the text of the last
/// one where it is cut off (`""` when none is); `None` when anything else is there.
fn values(text: &str) -> Option<(Vec<Value>, &str)> {
    let mut out = Vec::new();
    let mut rest = text.trim_start();
    while !rest.is_empty() {
        let mut stream = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        match stream.next()? {
            Ok(value) => out.push(value),
            Err(e) if e.is_eof() => return Some((out, rest)),
            Err(_) => return None,
        }
        rest = rest[stream.byte_offset()..].trim_start();
        rest = rest.strip_prefix(';').unwrap_or(rest).trim_start();
    }
    Some((out, ""))
}

impl ToolFormat for Llama3Json {
    fn name(&self) -> &'static str {
        "llama3_json"
    }

    fn openers(&self) -> &'static [&'static str] {
        &[PYTHON_TAG]
    }

    fn bare_json(&self) -> bool {
        true
    }

    fn special_markers(&self) -> bool {
        true
    }

    fn parse(&self, text: &str, offered: &[Tool], finished: bool) -> Option<Vec<ParsedCall>> {
        let (body, tagged) = match text.trim_start().strip_prefix(PYTHON_TAG) {
            Some(body) => (body, true),
            None => (text, false),
        };
        let check = (!tagged).then_some(offered);
        let (whole, cut) = values(body)?;
        let mut calls: Vec<ParsedCall> = whole
            .iter()
            .map(|value| call_of(value, check))
            .collect::<Option<_>>()?;
        if !cut.is_empty() {
            // A last call cut off by the token limit counts as far as it got.
            calls.push(partial_call(cut, offered).filter(|_| finished)?);
        }
        (!calls.is_empty()).then_some(calls)
    }

    fn grammar(&self, allowed: &[&Tool], several: bool, _markers: &Markers<'_>) -> String {
        let repeat = if several { " (\"; \" call)*" } else { "" };
        format!(
            "start: call{repeat}\ncall: %json {}\n",
            compact(any_call_schema(allowed, "parameters"))
        )
    }
}
