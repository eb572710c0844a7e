//! The `hermes` tool-call format (Qwen2.5, Hermes and most fine-tunes): each call a
//! `<tool_call>` block holding `{"name": ..., "arguments": {...}}`, closed by the first
//! `</tool_call>` after a whole call (one inside a JSON string is text). A last block cut off
//! by the token limit counts if its JSON is whole, or as far as its arguments got once its
//! name is out; an answer that is only the JSON object, naming an offered function, is a call too
//! (small models often leave out the tags).

use serde_json::Value;

use super::call_json::{call_so_far, CallSoFar};
use super::format::{any_call_schema, call_of, partial_call, Markers, ToolFormat};
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
            // A bare call; cut off at the end, as far as its arguments got.
            return whole_call(trimmed, Some(offered))
                .or_else(|| partial_call(text.trim_start(), offered).filter(|_| finished))
                .map(|call| vec![call]);
        }
        let mut calls = Vec::new();
        let mut rest = text;
        while let Some(open) = rest.find(TOOL_CALL_OPEN) {
            let body = &rest[open + TOOL_CALL_OPEN.len()..];
            // The block closes at the first close marker before which it holds a whole call:
            // one inside a JSON string is text.
            let closed = body.match_indices(TOOL_CALL_CLOSE).find_map(|(end, _)| {
                whole_call(&body[..end], None)
                    .map(|call| (call, &body[end + TOOL_CALL_CLOSE.len()..]))
            });
            match closed {
                Some((call, next)) => {
                    calls.push(call);
                    rest = next;
                }
                None if finished => {
                    // Unclosed at the end: a whole call (its close marker cut off), or what a
                    // call cut off by the token limit holds (as OpenAI returns a call whose
                    // arguments ran out).
                    let object = call_so_far(body)
                        .filter(|c| c.closed)
                        .map_or(body, |c| &body[..c.end]);
                    calls.extend(whole_call(object, None).or_else(|| partial_call(body, offered)));
                    break;
                }
                None => return None,
            }
        }
        (!calls.is_empty()).then_some(calls)
    }

    fn calls_so_far(&self, block: &str, _offered: &[Tool]) -> Vec<CallSoFar> {
        // A bare object (the tags left out) is a call only if it is the whole answer: it is
        // held to the end.
        let Some(body) = block.strip_prefix(TOOL_CALL_OPEN) else {
            return Vec::new();
        };
        call_so_far(body).into_iter().collect()
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

/// The call one block's body holds, when it is a whole call object (with `offered`, of one
/// of them).
fn whole_call(body: &str, offered: Option<&[Tool]>) -> Option<ParsedCall> {
    let value = serde_json::from_str::<Value>(body.trim()).ok()?;
    call_of(body, &value, offered)
}
