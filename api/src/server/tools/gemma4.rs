//! The `gemma4` tool-call format (Gemma 4): each call `<|tool_call>call:NAME{key:value,...}`
//! `<tool_call|>`, several written one after another, then `<|tool_response>`, with which the
//! model hands control back (the answer ends there: [`ToolFormat::end_markers`]). Values are
//! in Gemma 4's own syntax: keys unquoted (or between `<|"|>` tokens, as the template writes
//! the keys of its declarations), strings between `<|"|>` tokens (any text inside: `,`, `}`,
//! `:` and line breaks are the string's), numbers, `true`, `false`, `null`, objects and arrays
//! as in JSON. Arguments come out as compact JSON in the order written, streamed as they are
//! written: a string as it grows (escaped), a key once its `:` is out, a number or literal as
//! its characters come, so that the fragments join to the arguments read whole. A block
//! closes at the first `<tool_call|>` after its object closes (one inside a string is text);
//! one cut off at the end of the answer counts, when it names an offered function, as far as
//! its arguments got. The grammar of `tool_choice` is built in `super::gemma4_grammar`.

use serde_json::Value;

use super::call_json::CallSoFar;
use super::format::{Markers, ToolFormat};
use super::gemma4_grammar;
use super::{ParsedCall, Tool};

/// Opens a call.
pub const CALL_OPEN: &str = "<|tool_call>";
/// Closes a call.
pub const CALL_CLOSE: &str = "<tool_call|>";
/// Quotes a string on both sides.
pub const QUOTE: &str = "<|\"|>";
/// Hands control back after the calls (it opens their results in the prompt).
pub const TOOL_RESPONSE: &str = "<|tool_response>";
/// What a call's body opens with, before the function's name.
pub const CALL: &str = "call:";
/// Deepest nesting of objects and arrays read.
const MAX_DEPTH: usize = 64;

/// `<|tool_call>call:NAME{...}<tool_call|>` calls in Gemma 4's value syntax.
#[derive(Debug, Clone, Copy)]
pub struct Gemma4;

/// How far a value is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scan {
    /// Whole, ending just before this byte.
    Whole(usize),
    /// Cut off by the end of the text.
    Cut,
    /// Not in Gemma 4's syntax.
    Bad,
}

/// One block's call as far as it is written.
#[derive(Debug)]
struct Written {
    /// The function's name, once its `{` is out.
    name: Option<String>,
    /// The arguments as compact JSON, as far as they are settled.
    arguments: String,
    /// How far the object is written.
    scan: Scan,
}

/// `text` as the inside of a JSON string.
fn escaped(text: &str) -> String {
    let quoted = Value::String(text.to_string()).to_string();
    quoted[1..quoted.len() - 1].to_string()
}

fn skip_blanks(text: &str, mut i: usize) -> usize {
    let bytes = text.as_bytes();
    while i < bytes.len() && bytes[i].is_ascii_whitespace() {
        i += 1;
    }
    i
}

/// How much of the end of `text` may still be the start of `marker`.
fn marker_tail(text: &str, marker: &str) -> usize {
    (1..marker.len())
        .rev()
        .find(|&n| text.ends_with(&marker[..n]))
        .unwrap_or(0)
}

/// Whether `c` may be in a function's name.
fn name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')
}

/// Whether `c` may be in an unquoted key.
fn key_char(c: char) -> bool {
    !matches!(
        c,
        ':' | '{' | '}' | '[' | ']' | ',' | '<' | '>' | '"' | '\n'
    )
}

/// The value at `text[i..]` (after blanks), written to `out` as JSON as far as it is settled.
fn value(text: &str, i: usize, out: &mut String, depth: usize) -> Scan {
    let i = skip_blanks(text, i);
    let rest = &text[i..];
    if rest.is_empty() || QUOTE.starts_with(rest) {
        return Scan::Cut;
    }
    if rest.starts_with(QUOTE) {
        return string(text, i + QUOTE.len(), out);
    }
    if depth >= MAX_DEPTH {
        return Scan::Bad;
    }
    match rest.as_bytes()[0] {
        b'{' => object(text, i, out, depth + 1),
        b'[' => array(text, i, out, depth + 1),
        b'-' | b'0'..=b'9' => number(text, i, out),
        b'a'..=b'z' => literal(text, i, out),
        _ => Scan::Bad,
    }
}

/// A string whose text starts at `text[start..]`, up to the next quote; cut off, as far as
/// it goes less a tail that may be the start of its closing quote.
fn string(text: &str, start: usize, out: &mut String) -> Scan {
    let body = &text[start..];
    out.push('"');
    match body.find(QUOTE) {
        Some(end) => {
            out.push_str(&escaped(&body[..end]));
            out.push('"');
            Scan::Whole(start + end + QUOTE.len())
        }
        None => {
            out.push_str(&escaped(&body[..body.len() - marker_tail(body, QUOTE)]));
            Scan::Cut
        }
    }
}

/// A JSON number at `text[i..]` (as its characters come, while it may go on).
fn number(text: &str, i: usize, out: &mut String) -> Scan {
    let run = text[i..]
        .find(|c: char| !matches!(c, '0'..='9' | '-' | '+' | '.' | 'e' | 'E'))
        .map_or(text.len(), |n| i + n);
    let digits = &text[i..run];
    if run == text.len() {
        out.push_str(digits);
        return Scan::Cut;
    }
    if serde_json::from_str::<serde_json::Number>(digits).is_err() {
        return Scan::Bad;
    }
    out.push_str(digits);
    Scan::Whole(run)
}

/// `true`, `false` or `null` at `text[i..]` (as its letters come, while it may go on).
fn literal(text: &str, i: usize, out: &mut String) -> Scan {
    let run = text[i..]
        .find(|c: char| !c.is_ascii_lowercase())
        .map_or(text.len(), |n| i + n);
    let word = &text[i..run];
    let words = ["true", "false", "null"];
    if run == text.len() && words.iter().any(|w| w.starts_with(word)) {
        out.push_str(word);
        Scan::Cut
    } else if words.contains(&word) {
        out.push_str(word);
        Scan::Whole(run)
    } else {
        Scan::Bad
    }
}

/// The key at `text[i..]` and where its `:` ends; `Err` says how far it is written
/// (`Scan::Cut` or `Scan::Bad`).
fn key(text: &str, i: usize) -> Result<(String, usize), Scan> {
    let rest = &text[i..];
    let (key, after) = if let Some(quoted) = rest.strip_prefix(QUOTE) {
        let Some(end) = quoted.find(QUOTE) else {
            return Err(Scan::Cut);
        };
        (&quoted[..end], i + QUOTE.len() + end + QUOTE.len())
    } else if QUOTE.starts_with(rest) {
        return Err(Scan::Cut);
    } else {
        let end = rest.find(|c: char| !key_char(c)).ok_or(Scan::Cut)?;
        (&rest[..end], i + end)
    };
    let colon = skip_blanks(text, after);
    match text.as_bytes().get(colon) {
        None => Err(Scan::Cut),
        Some(b':') if !key.trim().is_empty() => Ok((key.trim().to_string(), colon + 1)),
        Some(_) => Err(Scan::Bad),
    }
}

/// An object at `text[i..]` (its `{`).
fn object(text: &str, i: usize, out: &mut String, depth: usize) -> Scan {
    out.push('{');
    let mut i = i + 1;
    let mut first = true;
    loop {
        i = skip_blanks(text, i);
        match text.as_bytes().get(i) {
            None => return Scan::Cut,
            Some(b'}') if first => {
                out.push('}');
                return Scan::Whole(i + 1);
            }
            Some(_) => {}
        }
        let (name, at) = match key(text, i) {
            Ok(found) => found,
            Err(scan) => return scan,
        };
        out.push_str(&Value::String(name).to_string());
        out.push(':');
        match value(text, at, out, depth) {
            Scan::Whole(end) => i = skip_blanks(text, end),
            other => return other,
        }
        match text.as_bytes().get(i) {
            None => return Scan::Cut,
            Some(b',') => out.push(','),
            Some(b'}') => {
                out.push('}');
                return Scan::Whole(i + 1);
            }
            Some(_) => return Scan::Bad,
        }
        i += 1;
        first = false;
    }
}

/// An array at `text[i..]` (its `[`).
fn array(text: &str, i: usize, out: &mut String, depth: usize) -> Scan {
    out.push('[');
    let mut i = i + 1;
    let mut first = true;
    loop {
        i = skip_blanks(text, i);
        match text.as_bytes().get(i) {
            None => return Scan::Cut,
            Some(b']') if first => {
                out.push(']');
                return Scan::Whole(i + 1);
            }
            Some(_) => {}
        }
        match value(text, i, out, depth) {
            Scan::Whole(end) => i = skip_blanks(text, end),
            other => return other,
        }
        match text.as_bytes().get(i) {
            None => return Scan::Cut,
            Some(b',') => out.push(','),
            Some(b']') => {
                out.push(']');
                return Scan::Whole(i + 1);
            }
            Some(_) => return Scan::Bad,
        }
        i += 1;
        first = false;
    }
}

/// The call in one block's body (after `<|tool_call>`) as far as it is written.
fn written(body: &str) -> Written {
    let mut call = Written {
        name: None,
        arguments: String::new(),
        scan: Scan::Cut,
    };
    let at = skip_blanks(body, 0);
    let Some(rest) = body[at..].strip_prefix(CALL) else {
        if !CALL.starts_with(&body[at..]) {
            call.scan = Scan::Bad;
        }
        return call;
    };
    let Some(brace) = rest.find(|c: char| !name_char(c)) else {
        return call;
    };
    if brace == 0 || !rest[brace..].starts_with('{') {
        call.scan = Scan::Bad;
        return call;
    }
    call.name = Some(rest[..brace].to_string());
    let start = body.len() - rest.len() + brace;
    call.scan = object(body, start, &mut call.arguments, 1);
    call
}

impl ToolFormat for Gemma4 {
    fn name(&self) -> &'static str {
        "gemma4"
    }

    fn openers(&self) -> &'static [&'static str] {
        &[CALL_OPEN]
    }

    /// In GGUF files the markers are user-defined tokens (they stay in the text anyway); a
    /// `tokenizer.json` may have them as special ones.
    fn special_markers(&self) -> bool {
        true
    }

    fn block_close(&self) -> Option<&'static str> {
        Some(CALL_CLOSE)
    }

    fn end_markers(&self) -> &'static [&'static str] {
        &[TOOL_RESPONSE]
    }

    fn parse(&self, text: &str, offered: &[Tool], finished: bool) -> Option<Vec<ParsedCall>> {
        let mut calls = Vec::new();
        let mut rest = text;
        while let Some(open) = rest.find(CALL_OPEN) {
            let body = &rest[open + CALL_OPEN.len()..];
            let call = written(body);
            match (call.scan, call.name) {
                (Scan::Whole(end), Some(name)) => {
                    calls.push(ParsedCall {
                        name,
                        arguments: call.arguments,
                    });
                    match body[end..].trim_start().strip_prefix(CALL_CLOSE) {
                        Some(next) => rest = next,
                        // At the end, a whole call whose close marker was cut off (or never
                        // written) counts; what follows it is not a call.
                        None if finished => break,
                        None => return None,
                    }
                }
                // Cut off by the token limit: as far as its arguments got.
                (Scan::Cut, Some(name)) if finished && offered.iter().any(|t| t.name == name) => {
                    calls.push(ParsedCall {
                        name,
                        arguments: call.arguments,
                    });
                    break;
                }
                // A last block that is no call is dropped after whole ones (a stream gave
                // those as they closed).
                _ if finished && !calls.is_empty() => break,
                _ => return None,
            }
        }
        (!calls.is_empty()).then_some(calls)
    }

    fn calls_so_far(&self, block: &str, _offered: &[Tool]) -> Vec<CallSoFar> {
        let Some(body) = block.strip_prefix(CALL_OPEN) else {
            return Vec::new();
        };
        let call = written(body);
        vec![CallSoFar {
            name: call.name,
            arguments: call.arguments,
            closed: matches!(call.scan, Scan::Whole(_)),
            ..CallSoFar::default()
        }]
    }

    fn grammar(&self, allowed: &[&Tool], several: bool, markers: &Markers<'_>) -> String {
        gemma4_grammar::grammar(allowed, several, markers)
    }
}

/// The JSON text of a value written in Gemma 4's syntax (`{key:<|"|>text<|"|>,n:1}`), `None`
/// when it is not whole or not in that syntax.
pub fn to_json(text: &str) -> Option<String> {
    let mut out = String::new();
    match value(text, 0, &mut out, 0) {
        Scan::Whole(end) if text[end..].trim().is_empty() => Some(out),
        _ => None,
    }
}
