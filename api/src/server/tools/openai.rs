//! The `openai` tool-call format: gpt-oss's harmony calls, a message to `functions.NAME` on
//! the `commentary` channel whose body is the arguments. The harmony splitter
//! (`crate::server::harmony`) writes each call into the answer as
//! `<|channel|>commentary to=NAME<|message|>ARGUMENTS<|call|>`; this reads that form. The
//! arguments are the body as the model wrote it (leading blanks dropped), streamed as they
//! come: JSON that does not parse passes through as written, as the reference parser gives
//! it, and a call cut off by the token limit counts as far as it got. The grammar of
//! `tool_choice` writes one call as the model writes it after its analysis:
//! `<|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>`
//! and arguments valid against the schema, the markers as the model's own tokens.

use super::call_json::CallSoFar;
use super::format::{lark_string, Markers, ToolFormat};
use super::{ParsedCall, Tool};
use crate::server::harmony::{CALL, CALL_OPEN, CHANNEL, CONSTRAIN, FUNCTIONS, MESSAGE, START};
use engine::constraint::compact;

/// Harmony calls, as the harmony splitter writes them into the answer.
#[derive(Debug, Clone, Copy)]
pub struct OpenAi;

/// One call as far as it is written: its name once the header is whole, its arguments so
/// far, and whether its `<|call|>` came.
fn call_so_far(call: &str) -> CallSoFar {
    let Some((name, body)) = call.split_once(MESSAGE) else {
        return CallSoFar::default();
    };
    let (arguments, closed) = match body.split_once(CALL) {
        Some((arguments, _)) => (arguments, true),
        // A `<|call|>` (or the next call's opener) may be half-written at the end.
        None => (&body[..body.len() - marker_tail(body)], false),
    };
    CallSoFar {
        name: Some(name.trim().to_string()).filter(|n| !n.is_empty()),
        arguments: arguments.trim_start().to_string(),
        closed,
        ..CallSoFar::default()
    }
}

/// The longest tail of `text` that is a proper prefix of `<|call|>` or of a call's opener.
fn marker_tail(text: &str) -> usize {
    [CALL, CALL_OPEN]
        .iter()
        .filter_map(|m| (1..m.len()).rev().find(|&n| text.ends_with(&m[..n])))
        .max()
        .unwrap_or(0)
}

impl ToolFormat for OpenAi {
    fn name(&self) -> &'static str {
        "openai"
    }

    fn openers(&self) -> &'static [&'static str] {
        &[CALL_OPEN]
    }

    fn special_markers(&self) -> bool {
        true
    }

    fn block_close(&self) -> Option<&'static str> {
        Some(CALL)
    }

    fn parse(&self, text: &str, _offered: &[Tool], finished: bool) -> Option<Vec<ParsedCall>> {
        let body = text.trim_start().strip_prefix(CALL_OPEN)?;
        let mut calls = Vec::new();
        for call in body.split(CALL_OPEN) {
            let so_far = call_so_far(call);
            let Some(name) = so_far.name else {
                // One cut off before its name is whole is dropped after whole ones.
                if finished && !calls.is_empty() {
                    break;
                }
                return None;
            };
            if !so_far.closed && !finished {
                return None;
            }
            // Cut off by the token limit, a half-written marker is the arguments' text.
            let arguments = match call.split_once(MESSAGE) {
                Some((_, body)) if !so_far.closed => body.trim_start().to_string(),
                _ => so_far.arguments,
            };
            calls.push(ParsedCall { name, arguments });
        }
        Some(calls)
    }

    fn calls_so_far(&self, block: &str, _offered: &[Tool]) -> Vec<CallSoFar> {
        let Some(body) = block.trim_start().strip_prefix(CALL_OPEN) else {
            return Vec::new();
        };
        let mut calls = Vec::new();
        for call in body.split(CALL_OPEN) {
            let so_far = call_so_far(call);
            let closed = so_far.closed;
            calls.push(so_far);
            if !closed {
                break;
            }
        }
        calls
    }

    fn grammar(&self, allowed: &[&Tool], _several: bool, markers: &Markers<'_>) -> String {
        // gpt-oss ends its reply at a call's `<|call|>`: one call per answer.
        let calls: Vec<String> = allowed
            .iter()
            .map(|tool| {
                format!(
                    "{to} {constrain} \"json\" {message} %json {schema}",
                    to = lark_string(&format!("commentary to={FUNCTIONS}{} ", tool.name)),
                    constrain = markers.write(CONSTRAIN),
                    message = markers.write(MESSAGE),
                    schema = compact(tool.parameters.clone()),
                )
            })
            .collect();
        format!(
            "start: ({start} \"assistant\")? {channel} call\ncall: {calls}\n",
            start = markers.write(START),
            channel = markers.write(CHANNEL),
            calls = calls.join("\n    | "),
        )
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use super::OpenAi;
    use crate::server::parts::{ChoiceReader, Part};
    use crate::server::reasoning::ReasoningParser;
    use crate::server::tools::{Calls, Piece, Tool};

    /// A reader of a harmony reply that may call `get_weather`, as the chat API reads one.
    fn reader() -> ChoiceReader {
        let tool = Tool {
            name: "get_weather".into(),
            parameters: json!({"type": "object"}),
            declaration: json!({}),
        };
        let calls = Calls::new(Arc::new(OpenAi), vec![tool]);
        let reasoning = ReasoningParser::Harmony.for_prompt("<|start|>assistant");
        ChoiceReader::new(Some(calls), Some(reasoning))
    }

    /// A raw harmony reply read as the chat API reads it, in pieces cut at `cuts`: its
    /// thinking, text, and calls (name, streamed arguments, arguments at its end).
    fn read(text: &str, cuts: &[usize]) -> (String, String, Vec<(String, String, String)>) {
        let mut reader = reader();
        let mut parts = Vec::new();
        let mut from = 0;
        for &cut in cuts.iter().chain(std::iter::once(&text.len())) {
            parts.extend(reader.push(&text[from..cut]));
            from = cut;
        }
        parts.extend(reader.finish());
        let (mut thinking, mut answer, mut found) = (String::new(), String::new(), Vec::new());
        for part in parts {
            match part {
                Part::Thinking(t) => thinking.push_str(&t),
                Part::Answer(Piece::Text(t)) => answer.push_str(&t),
                Part::Answer(Piece::CallStart { name, .. }) => {
                    found.push((name, String::new(), String::new()))
                }
                Part::Answer(Piece::Arguments { index, text }) => found[index].1.push_str(&text),
                Part::Answer(Piece::CallEnd { index, call }) => {
                    found[index].2 = call.function.arguments
                }
                Part::Answer(Piece::Call { call, .. }) => {
                    found.push((call.function.name, String::new(), call.function.arguments))
                }
                Part::End(_) => {}
            }
        }
        (thinking, answer, found)
    }

    /// The same at every cut and one character at a time.
    fn read_every_cut(text: &str) -> (String, String, Vec<(String, String, String)>) {
        let whole = read(text, &[]);
        let bounds: Vec<usize> = (1..text.len())
            .filter(|&i| text.is_char_boundary(i))
            .collect();
        for &cut in &bounds {
            assert_eq!(read(text, &[cut]), whole, "cut at {cut}");
        }
        assert_eq!(read(text, &bounds), whole, "one character at a time");
        whole
    }

    #[test]
    fn a_harmony_reply_gives_its_thinking_and_a_streamed_call() {
        let args = "{\"city\":\"Paris\",\"days\":3}";
        let text = format!(
            "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant\
             <|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>\
             {args}<|call|>"
        );
        let (thinking, answer, found) = read_every_cut(&text);
        assert_eq!(thinking, "Need the weather.");
        assert_eq!(answer, "");
        assert_eq!(
            found,
            vec![(
                "get_weather".to_string(),
                args.to_string(),
                args.to_string()
            )]
        );
        // One character at a time, the arguments come in many fragments.
        let bounds: Vec<usize> = (1..text.len()).collect();
        let mut reader = reader();
        let mut fragments = 0;
        let mut from = 0;
        for cut in bounds.into_iter().chain(std::iter::once(text.len())) {
            fragments += reader
                .push(&text[from..cut])
                .iter()
                .filter(|p| matches!(p, Part::Answer(Piece::Arguments { .. })))
                .count();
            from = cut;
        }
        assert!(fragments >= args.len() - 2, "{fragments} fragments");
    }

    #[test]
    fn broken_or_cut_arguments_come_as_written_and_a_preamble_is_content() {
        // Broken JSON passes through as the model wrote it, as the reference parser reads it.
        let text = "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant\
                    <|channel|>commentary to=functions.get_weather <|constrain|>json\
                    <|message|>{\"city\": Paris}<|call|>";
        let (thinking, answer, found) = read_every_cut(text);
        assert_eq!((thinking.as_str(), answer.as_str()), ("", "Checking."));
        let broken = "{\"city\": Paris}".to_string();
        assert_eq!(found, vec![("get_weather".into(), broken.clone(), broken)]);
        // Cut off by the token limit: as far as it got.
        let text = "<|channel|>commentary to=functions.get_weather<|message|>{\"city\": \"Pa";
        let (_, answer, found) = read_every_cut(text);
        let cut = "{\"city\": \"Pa".to_string();
        assert_eq!(answer, "");
        assert_eq!(found, vec![("get_weather".into(), cut.clone(), cut)]);
        // Cut off inside the header: no call, no markup as text.
        let (thinking, answer, found) = read_every_cut(
            "<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>comm",
        );
        assert_eq!(
            (thinking.as_str(), answer.as_str(), found.len()),
            ("x", "", 0)
        );
    }
}
