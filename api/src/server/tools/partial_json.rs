//! JSON cut off by the token limit: whether text is the start of one JSON value
//! ([`json_prefix`]), and the value it is the start of, closed where it was cut
//! ([`close_json`]): a call's arguments as far as they got, as a client that needs an object
//! (Anthropic's `tool_use.input`) reads them.

use serde_json::Value;

/// Whether `text` is the start of one JSON value (what a model cut off by the token limit
/// left): brackets that close only what they opened, strings, and between them only the
/// characters of numbers, literals, separators and blanks; nothing after the value closes.
pub fn json_prefix(text: &str) -> bool {
    let mut open = Vec::new();
    let mut in_string = false;
    let mut escaped = false;
    let mut started = false;
    for c in text.chars() {
        if in_string {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
            continue;
        }
        if started && open.is_empty() && !c.is_whitespace() {
            return false;
        }
        match c {
            '{' | '[' => open.push(c),
            '}' => {
                if open.pop() != Some('{') {
                    return false;
                }
            }
            ']' => {
                if open.pop() != Some('[') {
                    return false;
                }
            }
            '"' => in_string = true,
            c if c.is_whitespace() => continue,
            c if c.is_ascii_digit() || ",:-+.eE".contains(c) => {}
            c if "truefalsn".contains(c) => {}
            _ => return false,
        }
        started = true;
    }
    true
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
    let mut in_string = false;
    let mut escaped = false;
    for (at, c) in text.char_indices() {
        if in_string {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_string = true,
            ',' => cuts.push(at),
            '{' | '[' => cuts.push(at + 1),
            _ => {}
        }
    }
    cuts.sort_unstable_by(|a, b| b.cmp(a));
    cuts.dedup();
    cuts.into_iter().find_map(|cut| closed(&text[..cut]))
}

/// `prefix` with its open string and brackets closed, if that parses.
fn closed(prefix: &str) -> Option<Value> {
    let mut open = Vec::new();
    let mut in_string = false;
    let mut escaped = false;
    let mut escape_at = 0;
    for (at, c) in prefix.char_indices() {
        if in_string {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => {
                    escaped = true;
                    escape_at = at;
                }
                (false, '"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_string = true,
            '{' => open.push('}'),
            '[' => open.push(']'),
            '}' | ']' => {
                open.pop();
            }
            _ => {}
        }
    }
    let mut text = prefix.to_string();
    if in_string {
        // A cut escape (`\`, `\u12`) is dropped.
        let tail = &prefix[escape_at..];
        let cut_unicode = tail.starts_with("\\u") && tail.len() < 6;
        if escaped || cut_unicode {
            text.truncate(escape_at);
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
