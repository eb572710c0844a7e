//! The `llama3_json` tool-call format (Llama 3.1-3.3's JSON tool calling): the answer is the
//! call, a JSON object `{"name": ..., "parameters": {...}}` (`arguments` is read too), after
//! an optional `<|python_tag|>`; several calls are separated by `;`. Without the tag an
//! answer is read as calls only when every object names an offered function, so a JSON
//! answer to a question stays content. A last call cut off by the token limit counts as far
//! as its arguments got. Calls stream as they are written, with the tag or without.

use serde_json::Value;

use super::call_json::{calls_so_far, CallSoFar};
use super::format::{any_call_schema, call_of, json_values, partial_call, Markers, ToolFormat};
use super::{ParsedCall, Tool};
use engine::constraint::compact;

/// The tag Llama writes before a call.
pub const PYTHON_TAG: &str = "<|python_tag|>";

/// JSON objects after an optional `<|python_tag|>`.
#[derive(Debug, Clone, Copy)]
pub struct Llama3Json;

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
        let (whole, cut) = match json_values(body, ';', false) {
            Some(found) => found,
            // What follows whole calls with their arguments is dropped at the end, as a
            // stream of them ended each call once its object closed.
            None if finished => json_values(body, ';', true).filter(|(whole, _)| {
                whole.iter().all(|(value, _)| {
                    let arguments = value.get("parameters").or_else(|| value.get("arguments"));
                    arguments.is_some_and(Value::is_object)
                })
            })?,
            None => return None,
        };
        let mut calls: Vec<ParsedCall> = whole
            .iter()
            .map(|(value, text)| call_of(text, value, check))
            .collect::<Option<_>>()?;
        if !cut.is_empty() {
            // A last call cut off by the token limit counts as far as it got; one cut before
            // its name is whole is dropped after whole ones.
            match partial_call(cut, offered).filter(|_| finished) {
                Some(call) => calls.push(call),
                None if finished && !calls.is_empty() => {}
                None => return None,
            }
        }
        (!calls.is_empty()).then_some(calls)
    }

    fn calls_so_far(&self, block: &str, _offered: &[Tool]) -> Vec<CallSoFar> {
        let block = block.trim_start();
        calls_so_far(block.strip_prefix(PYTHON_TAG).unwrap_or(block), ';')
    }

    fn grammar(&self, allowed: &[&Tool], several: bool, _markers: &Markers<'_>) -> String {
        let repeat = if several { " (\"; \" call)*" } else { "" };
        format!(
            "start: call{repeat}\ncall: %json {}\n",
            compact(any_call_schema(allowed, "parameters"))
        )
    }
}
