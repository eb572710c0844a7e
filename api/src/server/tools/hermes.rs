//! The `hermes` tool-call format (Qwen2.5, Hermes and most fine-tunes): each call a
//! `<tool_call>` block holding `{"name": ..., "arguments": {...}}`. A last block cut off by
//! the token limit counts if its JSON is whole, or as far as its arguments got once its name
//! is out; an answer that is only the JSON object, naming an offered function, is a call too
//! (small models often leave out the tags).

use serde_json::Value;

use super::format::{any_call_schema, call_of, Markers, ToolFormat};
use super::{ParsedCall, Tool};
use crate::chat::{TOOL_CALL_CLOSE, TOOL_CALL_OPEN};
use engine::constraint::compact;

/// `<tool_call>` blocks of JSON.
#[derive(Debug, Clone, Copy)]
pub struct Hermes;

impl ToolFormat for Hermes {
    fn name(&self) -> &'static str {
        "hermes"
    }

    fn openers(&self) -> &'static [&'static str] {
        &[TOOL_CALL_OPEN]
    }

    fn bare_json(&self) -> bool {
        true
    }

    fn block_close(&self) -> Option<&'static str> {
        Some(TOOL_CALL_CLOSE)
    }

    fn parse(&self, text: &str, offered: &[Tool], finished: bool) -> Option<Vec<ParsedCall>> {
        let trimmed = text.trim();
        if trimmed.starts_with('{') {
            let value: Value = serde_json::from_str(trimmed).ok()?;
            return call_of(&value, Some(offered)).map(|call| vec![call]);
        }
        let mut calls = Vec::new();
        let mut rest = text;
        while let Some(open) = rest.find(TOOL_CALL_OPEN) {
            let body_start = open + TOOL_CALL_OPEN.len();
            let (body, next, closed) = match rest[body_start..].find(TOOL_CALL_CLOSE) {
                Some(end) => (
                    &rest[body_start..body_start + end],
                    &rest[body_start + end + TOOL_CALL_CLOSE.len()..],
                    true,
                ),
                None => (&rest[body_start..], "", false),
            };
            let whole = serde_json::from_str::<Value>(body.trim())
                .ok()
                .and_then(|v| call_of(&v, None));
            match whole {
                Some(call) => calls.push(call),
                None if !closed && finished => {
                    // Cut off by the token limit: what it holds of a call, as OpenAI returns
                    // a call whose arguments ran out of tokens.
                    calls.extend(partial_call(body, offered));
                    break;
                }
                None => return None,
            }
            rest = next;
        }
        (!calls.is_empty()).then_some(calls)
    }

    fn grammar(&self, allowed: &[&Tool], several: bool, markers: &Markers<'_>) -> String {
        let repeat = if several { " (\"\\n\" call)*" } else { "" };
        format!(
            "start: call{repeat}\ncall: {open} \"\\n\" body \"\\n\" {close}\nbody: %json {schema}\n",
            open = markers.write(TOOL_CALL_OPEN),
            close = markers.write(TOOL_CALL_CLOSE),
            schema = compact(any_call_schema(allowed, "arguments")),
        )
    }
}

/// A call cut off inside its arguments (`{"name": "f", "arguments": {"a": "...`): the name,
/// if it is one of `offered`, and the arguments as far as they go.
fn partial_call(body: &str, offered: &[Tool]) -> Option<ParsedCall> {
    let rest = body.trim_start().strip_prefix('{')?.trim_start();
    let rest = rest
        .strip_prefix("\"name\"")?
        .trim_start()
        .strip_prefix(':')?;
    let rest = rest.trim_start().strip_prefix('"')?;
    let (name, rest) = rest.split_once('"')?;
    let rest = rest.trim_start().strip_prefix(',')?.trim_start();
    let rest = rest
        .strip_prefix("\"arguments\"")?
        .trim_start()
        .strip_prefix(':')?;
    offered.iter().any(|t| t.name == name).then(|| ParsedCall {
        name: name.to_string(),
        arguments: rest.trim().to_string(),
    })
}
