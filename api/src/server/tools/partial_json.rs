//! JSON cut off by the token limit: whether text is the start of one JSON value
//! ([`json_prefix`]), and the value it is the start of, closed where it was cut
//! ([`close_json`], or as text: [`closing`]): a call's arguments as far as they got, as a
//! client that needs an object (Anthropic's `tool_use.input`) reads them. While such a value
//! streams, [`settled`] says how much of it any later cut keeps, so a stream of it never
//! sends what the closed value would drop.

use serde_json::Value;

use std::ops::ControlFlow;

/// Where a text ends inside a string: the offset of the string's last escape (0 when it has
/// none) and whether that escape is still open.
struct OpenString {
    escape_at: usize,
    /// Where the escape before the last began (0 when there is none).
    before: usize,
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
                    open.before = open.escape_at;
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
                before: 0,
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
    let closing = closing(text)?;
    serde_json::from_str(&closing.text(text)).ok()
}

/// How [`close_json`] closes a cut value, as text: the first `keep` bytes of it, then
/// `suffix`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Closing {
    /// How much of the cut text stays.
    pub keep: usize,
    /// What closes it.
    pub suffix: String,
}

impl Closing {
    /// The closed text of `text`.
    pub fn text(&self, text: &str) -> String {
        format!("{}{}", &text[..self.keep], self.suffix)
    }
}

/// How `text` (the start of a JSON value) closes where it was cut, as [`close_json`] closes
/// it; `None` when it is not the start of a JSON value.
pub fn closing(text: &str) -> Option<Closing> {
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
fn closed(prefix: &str) -> Option<Closing> {
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
    let mut keep = prefix.len();
    let mut suffix = String::new();
    if let Some(string) = string {
        // A cut escape (`\`, `\u12`) is dropped, and a first half of a surrogate pair.
        let tail = &prefix[string.escape_at..];
        let cut_unicode = tail.starts_with("\\u") && tail.len() < 6;
        if string.escaped || cut_unicode || high_surrogate(tail) {
            keep = string.escape_at;
            // The first half of a pair whose second half was cut goes too.
            let before = &prefix[string.before..keep];
            if string.before + 6 == keep && high_surrogate(before) {
                keep = string.before;
            }
        }
        suffix.push('"');
    }
    suffix.extend(open.iter().rev());
    let closing = Closing { keep, suffix };
    serde_json::from_str::<Value>(&closing.text(prefix))
        .is_ok()
        .then_some(closing)
}

/// Whether `escape` is one `\u` escape of the first half of a surrogate pair.
fn high_surrogate(escape: &str) -> bool {
    escape.len() == 6
        && escape.starts_with("\\u")
        && u16::from_str_radix(&escape[2..], 16).is_ok_and(|u| (0xd800..0xdc00).contains(&u))
}

/// Where a JSON value being written stands, for [`settled`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// A key (or the object's end).
    Key,
    /// A value (or, in an array, its end).
    Value,
    /// A separator or the container's end.
    After,
}

/// How much of `text` (the start of a JSON object, as it streams) every later cut keeps:
/// whatever follows, [`closing`] of the longer text keeps at least this much. Settled are
/// the object's opening, each member or item once its value is whole, and an open string
/// value as far as its last whole character (a cut escape, or the first half of a surrogate
/// pair, is not). A key, a number or a literal settles only with the value after it.
pub fn settled(text: &str) -> usize {
    if !text.starts_with('{') {
        return 0;
    }
    let mut settled = 0;
    let mut stack: Vec<(char, Expect)> = Vec::new();
    // In a string: whether it is a value, where its open escape began, and whether its last
    // whole escape was the first half of a surrogate pair.
    let mut string: Option<(bool, Option<usize>, bool)> = None;
    let mut scalar = false;
    for (at, c) in text.char_indices() {
        if let Some((value, escape, half)) = string.as_mut() {
            let end = at + c.len_utf8();
            match (*escape, c) {
                (Some(from), _) => {
                    let written = &text[from..end];
                    let whole = match written.as_bytes().get(1) {
                        Some(b'u') => written.len() == 6,
                        _ => written.len() == 2,
                    };
                    if whole {
                        *escape = None;
                        *half = high_surrogate(written);
                        if *value && !*half {
                            settled = end;
                        }
                    }
                }
                (None, '\\') => *escape = Some(at),
                (None, '"') => {
                    let value = *value;
                    string = None;
                    if value {
                        settled = end;
                    }
                    if let Some(top) = stack.last_mut() {
                        top.1 = if value { Expect::After } else { Expect::Value };
                    }
                }
                (None, _) => {
                    *half = false;
                    if *value {
                        settled = end;
                    }
                }
            }
            continue;
        }
        if scalar {
            if !(c.is_whitespace() || ",}]".contains(c)) {
                continue;
            }
            scalar = false;
            settled = at;
            if let Some(top) = stack.last_mut() {
                top.1 = Expect::After;
            }
        }
        match c {
            '{' | '[' => {
                stack.push((c, if c == '{' { Expect::Key } else { Expect::Value }));
                settled = at + 1;
            }
            '}' | ']' => {
                stack.pop();
                settled = at + 1;
                if let Some(top) = stack.last_mut() {
                    top.1 = Expect::After;
                }
            }
            '"' => {
                let value = stack.last().is_some_and(|top| top.1 == Expect::Value);
                if value {
                    settled = at + 1;
                }
                string = Some((value, None, false));
            }
            ',' => {
                if let Some(top) = stack.last_mut() {
                    top.1 = if top.0 == '{' {
                        Expect::Key
                    } else {
                        Expect::Value
                    };
                }
            }
            c if c.is_whitespace() || c == ':' => {}
            _ => scalar = true,
        }
    }
    settled
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
        // Half a surrogate pair goes as a cut escape does.
        assert_eq!(close_json(r#"{"a": "x\ud83d"#), Some(json!({"a": "x"})));
        assert_eq!(
            close_json(r#"{"a": "x\ud83d\ude00"#),
            Some(json!({"a": "x\u{1f600}"}))
        );
    }

    /// Values as a model writes them, cut anywhere.
    const WRITTEN: &[&str] = &[
        r#"{"path":"a b.py","lines":[1,2.50,-3e2,{"k":[]}],"text":"say \"hi\"\n\u00e9 \ud83d\ude00 é}]","ok":true,"none":null,"n":{"k":{}},"last":12}"#,
        r#"{ "a" : [ 1 , 22 ] , "b" : { "c" : "x" } , "d" : false }"#,
        r#"{"a":"","b":[],"c":{},"d":[[1],[2,[3]]],"e":-0.5e+3}"#,
    ];

    #[test]
    fn what_settled_stays_at_every_later_cut() {
        for text in WRITTEN {
            assert_eq!(settled(text), text.len(), "{text}");
            let cuts: Vec<usize> = text
                .char_indices()
                .skip(1)
                .map(|(at, _)| at)
                .chain([text.len()])
                .collect();
            let mut last = 0;
            for (i, &p) in cuts.iter().enumerate() {
                let s = settled(&text[..p]);
                assert!(s >= last && s <= p, "{text} at {p}: {s} after {last}");
                last = s;
                for &q in &cuts[i..] {
                    let cut = &text[..q];
                    let closing = closing(cut).unwrap_or_else(|| panic!("{cut}"));
                    assert!(closing.keep >= s, "{cut}: keeps {} of {s}", closing.keep);
                    let value: Value = serde_json::from_str(&closing.text(cut)).unwrap();
                    assert_eq!(Some(value), close_json(cut), "{cut}");
                }
            }
        }
        // A string value settles as it grows; keys, numbers and literals with their values.
        assert_eq!(settled(r#"{"a":"xy"#), 8);
        assert_eq!(settled(r#"{"a":"xy\"#), 8);
        assert_eq!(settled(r#"{"a":"xy","b"#), 9);
        assert_eq!(settled(r#"{"a":12"#), 1);
        assert_eq!(settled(r#"{"a":12,"#), 7);
        assert_eq!(settled("[1"), 0);
    }
}
