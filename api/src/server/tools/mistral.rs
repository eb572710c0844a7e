//! The `mistral` tool-call format: `[TOOL_CALLS]` and a JSON list of
//! `{"name": ..., "arguments": {...}}` objects (Mistral 7B v0.3, Mixtral, Nemo), or, in the
//! newer tokenizers (Mistral Small 3.2, Devstral, Magistral), `[TOOL_CALLS]name[ARGS]{...}`
//! per call (an optional `[CALL_ID]id` before `[ARGS]`). A last call cut off by the token
//! limit counts as far as its arguments got. The grammar writes the list form,
//! `[TOOL_CALLS]` as the model's token where it has one.

use serde_json::Value;

use super::call_json::{calls_so_far, compact_json, json_so_far, CallSoFar};
use super::format::{any_call_schema, call_of, json_values, partial_call, Markers, ToolFormat};
use super::partial_json::json_prefix;
use super::{ParsedCall, Tool};
use engine::constraint::compact;

/// The marker that opens Mistral's calls.
pub const TOOL_CALLS: &str = "[TOOL_CALLS]";
const ARGS: &str = "[ARGS]";
const CALL_ID: &str = "[CALL_ID]";

/// `[TOOL_CALLS]` and a JSON list, or `[TOOL_CALLS]name[ARGS]{...}`.
#[derive(Debug, Clone, Copy)]
pub struct Mistral;

/// One `name[ARGS]{...}` call (an optional `[CALL_ID]id` after the name).
fn named_call(text: &str) -> Option<ParsedCall> {
    let (head, arguments) = text.split_once(ARGS)?;
    let name = head.split(CALL_ID).next()?.trim();
    let value: Value = serde_json::from_str(arguments.trim()).ok()?;
    (!name.is_empty() && value.is_object()).then(|| ParsedCall {
        name: name.to_string(),
        arguments: compact_json(arguments),
    })
}

/// `text` without the start of a `[TOOL_CALLS]` the token limit cut off at its end, if it
/// ends with one.
fn without_cut_marker(text: &str) -> Option<&str> {
    (1..TOOL_CALLS.len())
        .rev()
        .find(|&n| text.ends_with(&TOOL_CALLS[..n]))
        .map(|n| &text[..text.len() - n])
}

/// The calls of a whole JSON list.
fn whole_list(body: &str) -> Option<Vec<ParsedCall>> {
    let inner = body.strip_prefix('[')?.strip_suffix(']')?;
    let (values, cut) = json_values(inner, ',', false)?;
    if !cut.is_empty() {
        return None;
    }
    values
        .iter()
        .map(|(value, text)| call_of(text, value, None))
        .collect()
}

/// A list of calls cut off by the token limit (`[{...}, {"name": "f", "arguments": {...`):
/// its whole calls, and the last as far as its arguments got.
fn cut_list(body: &str, offered: &[Tool]) -> Option<Vec<ParsedCall>> {
    let (whole, cut) = json_values(body.strip_prefix('[')?, ',', false)?;
    let mut calls: Vec<ParsedCall> = whole
        .iter()
        .map(|(value, text)| call_of(text, value, None))
        .collect::<Option<_>>()?;
    if !cut.is_empty() {
        // One cut before its name is whole is dropped after whole ones.
        match partial_call(cut, offered) {
            Some(call) => calls.push(call),
            None if !calls.is_empty() => {}
            None => return None,
        }
    }
    Some(calls)
}

/// A `name[ARGS]{...` call cut off inside its arguments: the name and the arguments as far
/// as they got, compact (as [`partial_call`] gives them).
fn cut_named(text: &str) -> Option<ParsedCall> {
    let (head, arguments) = text.split_once(ARGS)?;
    let name = head.split(CALL_ID).next()?.trim();
    let arguments = arguments.trim_start();
    (!name.is_empty() && arguments.starts_with('{') && json_prefix(arguments)).then(|| ParsedCall {
        name: name.to_string(),
        arguments: compact_json(arguments),
    })
}

impl ToolFormat for Mistral {
    fn name(&self) -> &'static str {
        "mistral"
    }

    fn openers(&self) -> &'static [&'static str] {
        &[TOOL_CALLS]
    }

    fn special_markers(&self) -> bool {
        true
    }

    fn parse(&self, text: &str, offered: &[Tool], finished: bool) -> Option<Vec<ParsedCall>> {
        let body = text.trim_start().strip_prefix(TOOL_CALLS)?.trim_start();
        let calls: Option<Vec<ParsedCall>> = if body.starts_with('[') {
            match serde_json::from_str::<Vec<Value>>(body) {
                Ok(_) => whole_list(body.trim_end()),
                Err(e) if e.is_eof() && finished => cut_list(body, offered),
                Err(_) => None,
            }
        } else {
            let mut calls: Vec<&str> = body.split(TOOL_CALLS).collect();
            let last = calls.pop()?;
            let mut whole: Vec<ParsedCall> =
                calls.into_iter().map(named_call).collect::<Option<_>>()?;
            let cut = || {
                let marker = without_cut_marker(last).and_then(named_call);
                marker.or_else(|| cut_named(last))
            };
            match named_call(last).or_else(|| cut().filter(|_| finished)) {
                Some(call) => whole.push(call),
                // One cut before its arguments began is dropped after whole ones.
                None if finished && !whole.is_empty() => {}
                None => return None,
            }
            Some(whole)
        };
        calls.filter(|c| !c.is_empty())
    }

    fn calls_so_far(&self, block: &str, _offered: &[Tool]) -> Vec<CallSoFar> {
        let Some(body) = block.trim_start().strip_prefix(TOOL_CALLS) else {
            return Vec::new();
        };
        if let Some(list) = body.trim_start().strip_prefix('[') {
            return calls_so_far(list, ',');
        }
        // `name[ARGS]{...` per call, each after its `[TOOL_CALLS]`.
        let mut calls = Vec::new();
        for call in body.split(TOOL_CALLS) {
            let Some((head, arguments)) = call.split_once(ARGS) else {
                calls.push(CallSoFar::default());
                break;
            };
            let name = head.split(CALL_ID).next().unwrap_or_default().trim();
            let (arguments, closed) = json_so_far(arguments);
            calls.push(CallSoFar {
                name: (!name.is_empty()).then(|| name.to_string()),
                arguments,
                closed,
                ..CallSoFar::default()
            });
            if !closed {
                break;
            }
        }
        calls
    }

    fn grammar(&self, allowed: &[&Tool], several: bool, markers: &Markers<'_>) -> String {
        let repeat = if several { " (\", \" call)*" } else { "" };
        format!(
            "start: {open} \"[\" call{repeat} \"]\"\ncall: %json {schema}\n",
            open = markers.write(TOOL_CALLS),
            schema = compact(any_call_schema(allowed, "arguments")),
        )
    }
}
