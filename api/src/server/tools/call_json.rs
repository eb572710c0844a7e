//! Reading a JSON call object (`{"name": ..., "arguments": {...}}`, or `"parameters"`) as it
//! is written, so its arguments can stream: [`call_so_far`] gives the name once its string
//! is closed and the arguments as far as they are written, in compact form (the model's own
//! text without the blanks between tokens: its key order, numbers and escapes kept). The
//! compact form of a prefix is always a prefix of the whole's, so what was streamed is never
//! taken back, and a whole call's arguments ([`compact_json`]) are exactly the fragments joined.

/// A call object as far as it is written.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CallSoFar {
    /// The function's name, once its string is closed.
    pub name: Option<String>,
    /// The arguments' text so far, compact; empty before they start.
    pub arguments: String,
    /// The arguments are written as a JSON string (a whole object escaped): they cannot
    /// stream, and the call is read when whole.
    pub quoted: bool,
    /// The object is closed.
    pub closed: bool,
    /// Where the object ends in the text read (just past its `}`), once it is closed.
    pub end: usize,
}

/// `text` (a JSON value, or the start of one) without the blanks outside its strings.
pub fn compact_json(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    value(text.trim_start(), 0, Some(&mut out));
    out
}

/// What the call object at the start of `text` (after blanks) holds so far; `None` when
/// `text` does not start a JSON object. Keys other than the name and the arguments are
/// passed over; the first of `arguments` and `parameters` counts.
pub fn call_so_far(text: &str) -> Option<CallSoFar> {
    let bytes = text.as_bytes();
    let mut i = skip_blanks(bytes, 0);
    if i == bytes.len() || bytes[i] != b'{' {
        return None;
    }
    i += 1;
    let mut call = CallSoFar::default();
    let mut seen_arguments = false;
    loop {
        i = skip_blanks(bytes, i);
        match bytes.get(i) {
            None => return Some(call),
            Some(b'}') => {
                call.closed = true;
                call.end = i + 1;
                return Some(call);
            }
            Some(b',') => {
                i += 1;
                continue;
            }
            Some(b'"') => {}
            Some(_) => return None,
        }
        let (key_end, whole) = string_end(bytes, i);
        if !whole {
            return Some(call);
        }
        let key: Option<String> = serde_json::from_str(&text[i..key_end]).ok();
        i = skip_blanks(bytes, key_end);
        match bytes.get(i) {
            None => return Some(call),
            Some(b':') => i = skip_blanks(bytes, i + 1),
            Some(_) => return None,
        }
        if i == bytes.len() {
            return Some(call);
        }
        let key = key.unwrap_or_default();
        let (end, whole) = if key == "name" && bytes[i] == b'"' {
            let (end, whole) = string_end(bytes, i);
            if whole {
                call.name = serde_json::from_str(&text[i..end]).ok();
            }
            (end, whole)
        } else if (key == "arguments" || key == "parameters") && !seen_arguments {
            seen_arguments = true;
            call.quoted = bytes[i] == b'"';
            value(text, i, Some(&mut call.arguments))
        } else {
            value(text, i, None)
        };
        if !whole {
            return Some(call);
        }
        i = end;
    }
}

/// The call objects of `text` as far as they are written, one after another with `separator`
/// (and blanks) between them: each whole one, then the one being written.
pub fn calls_so_far(text: &str, separator: char) -> Vec<CallSoFar> {
    let mut calls = Vec::new();
    let mut rest = text;
    while let Some(call) = call_so_far(rest) {
        let next = call.closed.then(|| rest[call.end..].trim_start());
        calls.push(call);
        match next.and_then(|n| n.strip_prefix(separator)) {
            Some(next) => rest = next,
            None => break,
        }
    }
    calls
}

/// `text` (the start of a JSON value, after blanks) compact as far as it is written, and
/// whether the value is whole.
pub fn json_so_far(text: &str) -> (String, bool) {
    let mut out = String::with_capacity(text.len());
    let (_, whole) = value(text.trim_start(), 0, Some(&mut out));
    (out, whole)
}

fn skip_blanks(bytes: &[u8], mut i: usize) -> usize {
    while i < bytes.len() && bytes[i].is_ascii_whitespace() {
        i += 1;
    }
    i
}

/// Where the string starting at `bytes[start]` (a quote) ends (just past its closing quote),
/// and whether it is closed.
fn string_end(bytes: &[u8], start: usize) -> (usize, bool) {
    let mut escaped = false;
    for (i, &b) in bytes.iter().enumerate().skip(start + 1) {
        if escaped {
            escaped = false;
        } else if b == b'\\' {
            escaped = true;
        } else if b == b'"' {
            return (i + 1, true);
        }
    }
    (bytes.len(), false)
}

/// Scans the JSON value starting at `text[start..]`: where it ends and whether it is whole,
/// copying it without the blanks between its tokens to `out`. A number or literal ends at
/// the first blank or delimiter after it. Only ASCII bytes are structural, so the copied runs
/// are whole UTF-8.
fn value(text: &str, start: usize, mut out: Option<&mut String>) -> (usize, bool) {
    let bytes = text.as_bytes();
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    let mut run = start;
    let flush = |out: &mut Option<&mut String>, from: usize, to: usize| {
        if let Some(out) = out.as_deref_mut() {
            out.push_str(&text[from..to]);
        }
    };
    for (i, &b) in bytes.iter().enumerate().skip(start) {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
                if depth == 0 {
                    flush(&mut out, run, i + 1);
                    return (i + 1, true);
                }
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => depth += 1,
            b'}' | b']' | b',' if depth == 0 => {
                flush(&mut out, run, i);
                return (i, i > start);
            }
            b'}' | b']' => {
                depth -= 1;
                if depth == 0 {
                    flush(&mut out, run, i + 1);
                    return (i + 1, true);
                }
            }
            b if b.is_ascii_whitespace() => {
                flush(&mut out, run, i);
                run = i + 1;
                if depth == 0 && i > start {
                    return (i, true);
                }
            }
            _ => {}
        }
    }
    flush(&mut out, run, bytes.len());
    (bytes.len(), false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    const CALL: &str = "{\"name\": \"write_file\", \"arguments\": {\"path\": \"a b.txt\",\n  \"lines\": [1, 2.50, -3e2], \"text\": \"say \\\"hi\\\"\\n\\u00e9 é}]\", \"ok\": true, \"none\": null, \"nested\": {\"k\": {}}}}";

    #[test]
    fn a_whole_call_compacts_to_the_same_value_in_the_written_order() {
        let call = call_so_far(CALL).unwrap();
        assert_eq!(call.name.as_deref(), Some("write_file"));
        assert!(call.closed && !call.quoted);
        let whole: Value = serde_json::from_str(CALL).unwrap();
        let args: Value = serde_json::from_str(&call.arguments).unwrap();
        assert_eq!(args, whole["arguments"]);
        assert!(call
            .arguments
            .starts_with("{\"path\":\"a b.txt\",\"lines\":[1,2.50,-3e2],"));
        assert_eq!(
            call.arguments,
            "{\"path\":\"a b.txt\",\"lines\":[1,2.50,-3e2],\"text\":\"say \\\"hi\\\"\\n\\u00e9 é}]\",\"ok\":true,\"none\":null,\"nested\":{\"k\":{}}}"
        );
        assert_eq!(
            compact_json(&CALL[CALL.find(": {\"path\"").unwrap() + 1..CALL.len() - 1]),
            call.arguments
        );
    }

    #[test]
    fn every_prefix_streams_a_prefix_of_the_whole() {
        let whole = call_so_far(CALL).unwrap();
        let mut named_at = None;
        for (cut, _) in CALL.char_indices().skip(1).chain([(CALL.len(), ' ')]) {
            let so_far = call_so_far(&CALL[..cut]).unwrap();
            assert!(
                whole.arguments.starts_with(&so_far.arguments),
                "cut {cut}: {:?}",
                so_far.arguments
            );
            if so_far.name.is_some() && named_at.is_none() {
                named_at = Some(cut);
            }
            assert_eq!(so_far.closed, cut == CALL.len());
        }
        assert_eq!(named_at, Some(CALL.find("write_file").unwrap() + 11));
    }

    #[test]
    fn arguments_before_the_name_or_quoted_or_missing() {
        let call = call_so_far("{\"arguments\": {\"a\": 1}, \"name\": \"f\"}").unwrap();
        assert_eq!(
            (call.name.as_deref(), call.arguments.as_str()),
            (Some("f"), "{\"a\":1}")
        );
        let call = call_so_far("{\"name\": \"f\", \"parameters\": \"{\\\"a\\\": 1}\"}").unwrap();
        assert!(call.quoted && call.closed);
        let call = call_so_far("{\"name\": \"f\"}").unwrap();
        assert!(call.closed && call.arguments.is_empty());
        let call = call_so_far("{\"name\": \"f\", \"arguments\": 12 }").unwrap();
        assert_eq!(call.arguments, "12");
        assert_eq!(call_so_far("[1]"), None);
        assert_eq!(call_so_far("{\"name\" 1}"), None);
        assert_eq!(call_so_far("  "), None);
    }

    #[test]
    fn compact_keeps_strings_and_drops_blanks_between_tokens() {
        assert_eq!(
            compact_json(" { \"a b\" : [ 1 , \"x  y\" ] } "),
            "{\"a b\":[1,\"x  y\"]}"
        );
        assert_eq!(
            compact_json("{\"a\": \"cut \\\"here"),
            "{\"a\":\"cut \\\"here"
        );
        assert_eq!(compact_json("{\"a\": tr"), "{\"a\":tr");
    }
}
