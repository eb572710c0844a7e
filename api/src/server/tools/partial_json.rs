//! JSON cut off by the token limit: whether text is the start of one JSON value
//! ([`json_prefix`]), and the value it is the start of, closed where it was cut
//! ([`close_json`]): a call's arguments as far as they got, as a client that needs an object
//! (Anthropic's `tool_use.input`) reads them.

use serde_json::Value;

use std::ops::ControlFlow;

/// Where a text ends inside a string: the offset of the string's last escape (0 when it has
/// none) and whether that escape is still open.
struct OpenString {
    escape_at: usize,
    escaped: bool,
}

/// Walks `text`, giving `step` each character outside strings with its offset (a string's
/// opening quote included; its content and closing quote are skipped), until `step` breaks.
/// Returns whether it broke, and where the text ends inside a string, if it does.
fn walk(
    text: &str,
    mut step: impl FnMut(usize, char) -> ControlFlow<()>,
) -> (bool, Option<OpenString>) {
    let mut string: Option<OpenString> = None;
    for (at, c) in text.char_indices() {
        if let Some(open) = string.as_mut() {
            match (open.escaped, c) {
                (true, _) => open.escaped = false,
                (false, '\\') => {
                    open.escaped = true;
                    open.escape_at = at;
                }
                (false, '"') => string = None,
                _ => {}
            }
            continue;
        }
        if step(at, c).is_break() {
            return (true, None);
        }
        if c == '"' {
            string = Some(OpenString {
                escape_at: 0,
                escaped: false,
            });
        }
    }
    (false, string)
}

/// Whether `text` is the start of one JSON value (what a model cut off by the token limit
/// left): brackets that close only what they opened, strings, and between them only the
/// characters of numbers, literals, separators and blanks; nothing after the value closes.
pub fn json_prefix(text: &str) -> bool {
    let mut open = Vec::new();
    let mut started = false;
    let (broke, _) = walk(text, |_, c| {
        if c.is_whitespace() {
            return ControlFlow::Continue(());
        }
        let fits = !(started && open.is_empty())
            && match c {
                '{' | '[' => {
                    open.push(c);
                    true
                }
                '}' => open.pop() == Some('{'),
                ']' => open.pop() == Some('['),
                c => c == '"' || c.is_ascii_digit() || ",:-+.eEtruefalsn".contains(c),
            };
        started = true;
        if fits {
            ControlFlow::Continue(())
        } else {
            ControlFlow::Break(())
        }
    });
    !broke
}

/// The value `text` (the start of one) is the start of, closed where it was cut: an open
/// string ends there (a cut escape dropped), open objects and arrays close, and a member or
/// item that was cut before it could stand (a key without its value, a partial literal) is
/// left out. `None` when `text` is not the start of a JSON value.
pub fn close_json(text: &str) -> Option<Value> {
    if !json_prefix(text) {
        return None;
    }
    // Where the text may be cut back to: its end, and before each separator or right after
    // each opening bracket (outside strings), latest first.
    let mut cuts = vec![text.len()];
    walk(text, |at, c| {
        match c {
            ',' => cuts.push(at),
            '{' | '[' => cuts.push(at + 1),
            _ => {}
        }
        ControlFlow::Continue(())
    });
    cuts.sort_unstable_by(|a, b| b.cmp(a));
    cuts.dedup();
    cuts.into_iter().find_map(|cut| closed(&text[..cut]))
}

/// `prefix` with its open string and brackets closed, if that parses.
fn closed(prefix: &str) -> Option<Value> {
    let mut open = Vec::new();
    let (_, string) = walk(prefix, |_, c| {
        match c {
            '{' => open.push('}'),
            '[' => open.push(']'),
            '}' | ']' => {
                open.pop();
            }
            _ => {}
        }
        ControlFlow::Continue(())
    });
    let mut text = prefix.to_string();
    if let Some(string) = string {
        // A cut escape (`\`, `\u12`) is dropped.
        let tail = &prefix[string.escape_at..];
        let cut_unicode = tail.starts_with("\\u") && tail.len() < 6;
        if string.escaped || cut_unicode {
            text.truncate(string.escape_at);
        }
        text.push('"');
    }
    text.extend(open.iter().rev());
    serde_json::from_str(&text).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_prefixes_are_what_a_cut_value_leaves() {
        for cut in [
            "",
            "{",
            "{\"a\": \"x </tool_call> y",
            "{\"a\": [1, 2.5e-3, true, nul",
            "{\"a\": \"\\\"}\"",
            "{\"a\": {}}",
        ] {
            assert!(json_prefix(cut), "{cut:?}");
        }
        for broken in [
            "{\"a\": 1}}",
            "{\"a\": 1} x",
            "{\"a\": ]",
            "{x: 1}",
            "<tool_call>",
        ] {
            assert!(!json_prefix(broken), "{broken:?}");
        }
    }

    #[test]
    fn a_cut_value_closes_where_it_was_cut() {
        for (cut, want) in [
            (
                r#"{"path": "a.py", "content": "def f():\n    ret"#,
                json!({"path": "a.py", "content": "def f():\n    ret"}),
            ),
            (r#"{"path": "a.py", "con"#, json!({"path": "a.py"})),
            (r#"{"path": "a.py", "content": "#, json!({"path": "a.py"})),
            (r#"{"path": "a.py", "n": tr"#, json!({"path": "a.py"})),
            (
                r#"{"a": [1, 2, {"b": "x\"#,
                json!({"a": [1, 2, {"b": "x"}]}),
            ),
            (r#"{"a": "\u00e9 \u00"#, json!({"a": "é "})),
            (r#"{"a": {"b": 1}, "#, json!({"a": {"b": 1}})),
            ("{", json!({})),
        ] {
            assert_eq!(close_json(cut), Some(want), "{cut}");
        }
        assert_eq!(close_json(r#"{"a": 1}}"#), None);
        assert_eq!(close_json("<tool_call>"), None);
    }
}
