//! Every tool-call format read whole and streamed, its answer cut at every character: the
//! same content and calls either way; malformed calls in each syntax stay text. The helpers
//! serve `gemma4_tests` too.

use std::sync::Arc;

use serde_json::{json, Value};

use super::format::{as_text, Markers, ToolFormat};
use super::gemma4::Gemma4;
use super::hermes::Hermes;
use super::llama3::Llama3Json;
use super::mistral::Mistral;
use super::openai::OpenAi;
use super::qwen3_coder::Qwen3Coder;
use super::{parse_calls, CallReader, Calls, Piece, Tool};

pub(super) fn tools() -> Vec<Tool> {
    let tool = |name: &str, parameters: Value| Tool {
        name: name.into(),
        parameters,
        declaration: json!({}),
    };
    vec![
        tool(
            "get_weather",
            json!({"type": "object", "properties": {
                "city": {"type": "string"}, "days": {"type": "integer"},
                "metric": {"type": "boolean"}, "where": {"type": "object"}}}),
        ),
        tool("now", json!({"type": "object", "properties": {}})),
    ]
}

pub(super) fn calls(format: impl ToolFormat + 'static) -> Calls {
    Calls::new(Arc::new(format), tools())
}

/// The content and (name, arguments as JSON) calls of `text` read whole.
fn whole(calls: &Calls, text: &str) -> (Option<String>, Vec<(String, Value)>) {
    match parse_calls(text, calls) {
        None => (Some(text.to_string()), Vec::new()),
        Some((content, found)) => (
            content,
            found
                .into_iter()
                .map(|c| {
                    let args = serde_json::from_str(&c.function.arguments)
                        .unwrap_or(Value::String(c.function.arguments.clone()));
                    (c.function.name, args)
                })
                .collect(),
        ),
    }
}

/// The pieces of `text` read streamed in pieces of `step` characters, and how many calls the
/// reader counted.
pub(super) fn stream_pieces(calls: &Calls, text: &str, step: usize) -> (Vec<Piece>, usize) {
    let mut reader = CallReader::new(calls.clone());
    let chars: Vec<char> = text.chars().collect();
    let mut pieces = Vec::new();
    for chunk in chars.chunks(step) {
        pieces.extend(reader.push(&chunk.iter().collect::<String>()));
    }
    pieces.extend(reader.finish());
    (pieces, reader.calls)
}

/// The text of streamed pieces.
pub(super) fn text_of(pieces: &[Piece]) -> String {
    pieces
        .iter()
        .filter_map(|p| match p {
            Piece::Text(t) => Some(t.as_str()),
            _ => None,
        })
        .collect()
}

/// The (name, arguments) calls of streamed pieces, in order of their indexes. A streamed
/// call starts once, its fragments joined are exactly the arguments it ends with, and
/// nothing of it comes after its end.
pub(super) fn calls_of(pieces: Vec<Piece>) -> Vec<(String, String)> {
    let mut calls: Vec<(String, String, bool)> = Vec::new();
    for piece in pieces {
        match piece {
            Piece::Text(_) => {}
            Piece::Call { index, call } => {
                assert_eq!(index, calls.len(), "calls come in order");
                calls.push((call.function.name, call.function.arguments, true))
            }
            Piece::CallStart { index, name, .. } => {
                assert_eq!(index, calls.len(), "calls start in order");
                calls.push((name, String::new(), false));
            }
            Piece::Arguments { index, text } => {
                assert!(!calls[index].2, "a fragment after the call's end");
                calls[index].1.push_str(&text);
            }
            Piece::CallEnd { index, call } => {
                let (name, streamed, ended) = &mut calls[index];
                assert!(!*ended, "a call ends once");
                assert_eq!(*name, call.function.name);
                assert_eq!(
                    *streamed, call.function.arguments,
                    "fragments join to the arguments"
                );
                *ended = true;
            }
        }
    }
    calls
        .into_iter()
        .map(|(name, args, ended)| {
            assert!(ended, "every started call ends");
            (name, args)
        })
        .collect()
}

/// The same read streamed in pieces of `step` characters (content trimmed as whole reads
/// trim it).
fn streamed(calls: &Calls, text: &str, step: usize) -> (Option<String>, Vec<(String, Value)>) {
    let (pieces, counted) = stream_pieces(calls, text, step);
    let content = text_of(&pieces);
    let found: Vec<(String, Value)> = calls_of(pieces)
        .into_iter()
        .map(|(name, args)| (name, serde_json::from_str(&args).unwrap_or(Value::Null)))
        .collect();
    assert_eq!(counted, found.len());
    let content = content.trim().to_string();
    (
        (!content.is_empty() || found.is_empty()).then_some(content),
        found,
    )
}

/// Whole and streamed at every cut agree, and give `want`.
pub(super) fn check(calls: &Calls, text: &str, content: Option<&str>, want: &[(&str, Value)]) {
    let want: Vec<(String, Value)> = want
        .iter()
        .map(|(n, a)| (n.to_string(), a.clone()))
        .collect();
    let (got_content, got) = whole(calls, text);
    assert_eq!(got, want, "{} whole: {text:?}", calls.format.name());
    if !want.is_empty() {
        assert_eq!(got_content.as_deref(), content, "{text:?}");
    }
    for step in 1..=text.chars().count() {
        let (s_content, s_got) = streamed(calls, text, step);
        assert_eq!(
            s_got,
            want,
            "{} every {step}: {text:?}",
            calls.format.name()
        );
        if !want.is_empty() {
            assert_eq!(s_content.as_deref(), content, "every {step}: {text:?}");
        }
    }
}

#[test]
fn hermes_blocks_and_bare_calls() {
    let c = calls(Hermes);
    check(
        &c,
        "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>",
        Some("Let me look."),
        &[("get_weather", json!({"city": "Oslo"})), ("now", json!({}))],
    );
    check(
        &c,
        " {\"name\": \"now\", \"arguments\": {}}",
        None,
        &[("now", json!({}))],
    );
    // Malformed: broken JSON in a closed block, an untagged call of an unknown function.
    check(
        &c,
        "<tool_call>\n{\"name\": \"now\", </tool_call> ok",
        None,
        &[],
    );
    check(&c, "{\"name\": \"rm\", \"arguments\": {}}", None, &[]);
}

#[test]
fn llama3_json_with_and_without_the_python_tag() {
    let c = calls(Llama3Json);
    check(
        &c,
        "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Lima\", \"days\": 2}}",
        None,
        &[("get_weather", json!({"city": "Lima", "days": 2}))],
    );
    check(
        &c,
        "<|python_tag|>{\"name\": \"now\", \"parameters\": {}}; {\"name\": \"get_weather\", \"parameters\": {\"city\": \"a;b\"}}",
        None,
        &[("now", json!({})), ("get_weather", json!({"city": "a;b"}))],
    );
    // A JSON answer that is not a call of an offered function stays content; so does a cut
    // off call and plain text.
    check(&c, "{\"name\": \"Ada\", \"age\": 36}", None, &[]);
    // Whatever follows a whole call is dropped (a stream ended the call as its object closed).
    check(
        &c,
        "{\"name\": \"now\", \"parameters\": {}} and more",
        None,
        &[("now", json!({}))],
    );
    check(&c, "<|python_tag|>{\"name\": \"now\", \"param", None, &[]);
    check(&c, "It is sunny in Lima.", None, &[]);
}

#[test]
fn mistral_lists_and_named_calls() {
    let c = calls(Mistral);
    check(
        &c,
        "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}, {\"name\": \"now\", \"arguments\": {}}]",
        None,
        &[("get_weather", json!({"city": "Rome"})), ("now", json!({}))],
    );
    check(
        &c,
        "Checking.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Rome\"}[TOOL_CALLS]now[CALL_ID]a1b2c3d4e[ARGS]{}",
        Some("Checking."),
        &[("get_weather", json!({"city": "Rome"})), ("now", json!({}))],
    );
    check(
        &c,
        "[TOOL_CALLS][{\"name\": \"now\", \"arguments\": }]",
        None,
        &[],
    );
    check(&c, "[TOOL_CALLS]get_weather{\"city\": \"Rome\"}", None, &[]);
}

#[test]
fn qwen3_coder_xml_typed_by_the_schema() {
    let c = calls(Qwen3Coder);
    check(
        &c,
        "I will check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Jose\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=metric>\nfalse\n</parameter>\n<parameter=where>\n{\"lat\": 1.5}\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=now>\n</function>\n</tool_call>",
        Some("I will check."),
        &[
            (
                "get_weather",
                json!({"city": "San Jose", "days": 3, "metric": false, "where": {"lat": 1.5}}),
            ),
            ("now", json!({})),
        ],
    );
    // A number that is text to the schema stays text; a value over lines keeps them.
    check(
        &c,
        "<tool_call>\n<function=get_weather>\n<parameter=city>\n42\nnorth\n</parameter>\n</function>\n</tool_call>",
        None,
        &[("get_weather", json!({"city": "42\nnorth"}))],
    );
    // Cut off inside the second parameter: the call with the parameter that closed.
    check(
        &c,
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n",
        None,
        &[("get_weather", json!({"city": "Oslo"}))],
    );
    check(
        &c,
        "<tool_call>\n<function get_weather>\n</tool_call>",
        None,
        &[],
    );
}

/// The calls of `text` as (name, arguments text), read whole and streamed at every cut:
/// the same either way, and `want`.
pub(super) fn check_raw(calls: &Calls, text: &str, want: &[(&str, &str)]) {
    let want: Vec<(String, String)> = want
        .iter()
        .map(|(n, a)| (n.to_string(), a.to_string()))
        .collect();
    let whole: Vec<(String, String)> = parse_calls(text, calls)
        .map(|(_, found)| found)
        .unwrap_or_default()
        .into_iter()
        .map(|c| (c.function.name, c.function.arguments))
        .collect();
    assert_eq!(whole, want, "{} whole: {text:?}", calls.format.name());
    for step in 1..=text.chars().count() {
        let got = calls_of(stream_pieces(calls, text, step).0);
        assert_eq!(got, want, "{} every {step}: {text:?}", calls.format.name());
    }
}

#[test]
fn a_close_marker_inside_a_string_is_text() {
    let c = calls(Hermes);
    check(
        &c,
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"a\\n</tool_call>b\"}}\n</tool_call>",
        None,
        &[("get_weather", json!({"city": "a\n</tool_call>b"}))],
    );
    let c = calls(Qwen3Coder);
    check(
        &c,
        "<tool_call>\n<function=get_weather>\n<parameter=where>\n{\"note\": \"a </tool_call> b\"}\n</parameter>\n</function>\n</tool_call>",
        None,
        &[("get_weather", json!({"where": {"note": "a </tool_call> b"}}))],
    );
}

#[test]
fn a_call_cut_off_counts_as_far_as_its_arguments_got() {
    // As far as they got, compact: what a stream of them gave.
    check_raw(
        &calls(Hermes),
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Os",
        &[("get_weather", "{\"city\":\"Os")],
    );
    // Cut inside a string after a close marker written in it.
    check_raw(
        &calls(Hermes),
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"x\\n</tool_call> and",
        &[("get_weather", "{\"city\":\"x\\n</tool_call> and")],
    );
    check_raw(
        &calls(Llama3Json),
        "<|python_tag|>{\"name\": \"now\", \"parameters\": {}}; {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Li",
        &[("now", "{}"), ("get_weather", "{\"city\":\"Li")],
    );
    check_raw(
        &calls(Mistral),
        "[TOOL_CALLS][{\"name\": \"now\", \"arguments\": {}}, {\"name\": \"get_weather\", \"arguments\": {\"days\": 1",
        &[("now", "{}"), ("get_weather", "{\"days\":1")],
    );
    check_raw(
        &calls(Mistral),
        "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Ro",
        &[("get_weather", "{\"city\":\"Ro")],
    );
    // A cut that could not have become a call is text.
    check_raw(
        &calls(Hermes),
        "<tool_call>\n{\"name\": \"rm\", \"arguments\": {",
        &[],
    );
    check_raw(&calls(Llama3Json), "{\"name\": \"now\"} }", &[]);
}

#[test]
fn grammars_are_written_in_each_syntax() {
    let all = tools();
    let allowed: Vec<&Tool> = all.iter().collect();
    let text = Markers::new(&as_text);
    let one = &allowed[..1];
    let hermes = Hermes.grammar(one, false, &text);
    assert!(hermes.contains("\"<tool_call>\"") && !hermes.contains("call)*"));
    assert!(Hermes.grammar(&allowed, true, &text).contains("anyOf"));
    let llama = Llama3Json.grammar(&allowed, true, &text);
    assert!(llama.contains("\"; \" call") && llama.contains("\"parameters\""));
    let mistral = Mistral.grammar(one, false, &text);
    assert!(
        mistral.contains("\"[TOOL_CALLS]\" \"[\" call \"]\""),
        "{mistral}"
    );
    let coder = Qwen3Coder.grammar(&allowed, false, &text);
    assert!(coder.contains("\"<function=get_weather>\"") && coder.contains("\"<function=now>\""));
    assert!(
        coder.contains("/-?[0-9]+\\n/") && coder.contains("%json"),
        "{coder}"
    );
    // String values keep to the schema's length bounds.
    let bounded = Tool {
        name: "f".into(),
        parameters: json!({"type": "object", "properties": {
            "a": {"type": "string", "maxLength": 20}, "b": {"type": "string", "minLength": 2}}}),
        declaration: json!({}),
    };
    let coder = Qwen3Coder.grammar(&[&bounded], false, &text);
    assert!(
        coder.contains("/[^<]{0,20}\\n/") && coder.contains("/[^<]{2,}\\n/"),
        "{coder}"
    );
    // A marker that is one special token of the model's is written as that token.
    let token = |m: &str| (m == "[TOOL_CALLS]" || m == "<tool_call>").then_some(7);
    let own = Markers::new(&token);
    assert!(Mistral
        .grammar(one, false, &own)
        .starts_with("start: <[7]> \"[\""));
    let hermes = Hermes.grammar(one, false, &own);
    assert!(hermes.contains("<[7]>") && hermes.contains("\"</tool_call>\""));
    let harmony = |m: &str| match m {
        "<|start|>" => Some(1),
        "<|channel|>" => Some(2),
        "<|constrain|>" => Some(3),
        "<|message|>" => Some(4),
        _ => None,
    };
    let openai = OpenAi.grammar(&allowed, true, &Markers::new(&harmony));
    assert!(
        openai.starts_with("start: (<[1]> \"assistant\")? <[2]> call\n")
            && openai.contains("\"commentary to=functions.now \" <[3]> \"json\" <[4]> %json")
            && openai.contains("call: \"commentary to=functions.get_weather \" <[3]>")
            && openai.contains("| \"commentary to=functions.now \""),
        "{openai}"
    );
}

#[test]
fn hermes_arguments_stream_as_they_are_written() {
    let c = calls(Hermes);
    let lines: String = (0..40)
        .map(|i| format!("line {i}: \\\"quoted\\\" é\\n"))
        .collect();
    let text = format!(
        "Writing.\n<tool_call>\n{{\"name\": \"get_weather\", \"arguments\": {{\"where\": {{\"lat\": 1.50}}, \"city\": \"{lines}\"}}}}\n</tool_call>\n<tool_call>\n{{\"arguments\": {{}}, \"name\": \"now\"}}\n</tool_call>"
    );
    for step in [1, 2, 5, 16] {
        let (pieces, counted) = stream_pieces(&c, &text, step);
        assert_eq!(counted, 2);
        let fragments = pieces
            .iter()
            .filter(|p| matches!(p, Piece::Arguments { index: 0, .. }))
            .count();
        assert!(
            fragments * step >= lines.len() / 2,
            "every {step}: {fragments} fragments"
        );
        let first_call = pieces.iter().find(|p| !matches!(p, Piece::Text(_)));
        assert!(
            matches!(first_call, Some(Piece::CallStart { index: 0, name, .. }) if name == "get_weather"),
            "{first_call:?}"
        );
        let text = text_of(&pieces);
        assert_eq!(text.trim(), "Writing.", "no marker leaks");
        let got = calls_of(pieces);
        // The model's key order and number text are kept.
        assert!(got[0]
            .1
            .starts_with("{\"where\":{\"lat\":1.50},\"city\":\"line 0: "));
        assert_eq!(got[1], ("now".to_string(), "{}".to_string()));
    }
    // Whole, the same arguments.
    let (_, whole) = parse_calls(&text, &c).expect("the calls read whole");
    let (pieces, _) = stream_pieces(&c, &text, 3);
    let streamed = calls_of(pieces);
    assert_eq!(whole[0].function.arguments, streamed[0].1);
}

#[test]
fn a_call_cut_by_the_token_limit_ends_as_far_as_it_streamed() {
    let c = calls(Hermes);
    let text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Os";
    // Forced to be calls, as unforced (a_call_cut_off_counts_as_far_as_its_arguments_got).
    let forced = c.forced(true);
    check_raw(&forced, text, &[("get_weather", "{\"city\":\"Os")]);
}

/// Each format's answer with two calls, the first with a long string argument.
fn two_calls() -> Vec<(Calls, String)> {
    let long: String = (0..12)
        .map(|i| format!("line {i} \\\"q\\\" é\\n"))
        .collect();
    let plain = long.replace("\\n", "\n").replace("\\\"", "\"");
    vec![
        (
            calls(Hermes),
            format!("Sure.\n<tool_call>\n{{\"name\": \"get_weather\", \"arguments\": {{\"city\": \"{long}\", \"days\": 3}}}}\n</tool_call>\n<tool_call>\n{{\"name\": \"now\", \"arguments\": {{}}}}\n</tool_call>"),
        ),
        (
            calls(Llama3Json),
            format!("<|python_tag|>{{\"name\": \"get_weather\", \"parameters\": {{\"city\": \"{long}\", \"days\": 3}}}}; {{\"name\": \"now\", \"parameters\": {{}}}}"),
        ),
        (
            calls(Llama3Json),
            format!("{{\"name\": \"get_weather\", \"parameters\": {{\"city\": \"{long}\"}}}}"),
        ),
        (
            calls(Mistral),
            format!("Sure.[TOOL_CALLS][{{\"name\": \"get_weather\", \"arguments\": {{\"city\": \"{long}\", \"days\": 3}}}}, {{\"name\": \"now\", \"arguments\": {{}}}}]"),
        ),
        (
            calls(Mistral),
            format!("[TOOL_CALLS]get_weather[ARGS]{{\"city\": \"{long}\", \"days\": 3}}[TOOL_CALLS]now[CALL_ID]a1b2c3d4e[ARGS]{{}}"),
        ),
        (
            calls(OpenAi),
            format!("Sure.<|channel|>commentary to=get_weather<|message|>{{\"city\": \"{long}\", \"days\": 3}}<|call|><|channel|>commentary to=now<|message|>{{}}<|call|>"),
        ),
        (
            calls(Qwen3Coder),
            format!("Sure.\n<tool_call>\n<function=get_weather>\n<parameter=city>\n{plain}\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=now>\n</function>\n</tool_call>"),
        ),
        (
            calls(Gemma4),
            format!("Sure.<|tool_call>call:get_weather{{city:<|\"|>{plain}<|\"|>,days:3}}<tool_call|><|tool_call>call:now{{}}<tool_call|><|tool_response>"),
        ),
    ]
}

/// The content and (name, arguments) calls of `text` read whole, as the chat API gives them.
fn read_whole(calls: &Calls, text: &str) -> (String, Vec<(String, String)>) {
    match parse_calls(text, calls) {
        None => (text.to_string(), Vec::new()),
        Some((content, found)) => (
            content.unwrap_or_default(),
            found
                .into_iter()
                .map(|c| (c.function.name, c.function.arguments))
                .collect(),
        ),
    }
}

#[test]
fn every_format_streams_arguments_as_they_are_written() {
    for (c, text) in two_calls() {
        let format = c.format.name();
        let (_, want) = read_whole(&c, &text);
        assert_eq!(
            want.len(),
            1 + usize::from(text.contains("now")),
            "{format}: {text}"
        );
        let city = serde_json::from_str::<Value>(&want[0].1).expect("JSON arguments");
        assert!(city["city"]
            .as_str()
            .is_some_and(|c| c.contains("line 11 \"q\" é\n")));
        for step in [1, 3, 8] {
            let (pieces, _) = stream_pieces(&c, &text, step);
            let fragments = pieces
                .iter()
                .filter(|p| matches!(p, Piece::Arguments { index: 0, .. }))
                .count();
            assert!(
                fragments * step > 100,
                "{format} every {step}: {fragments} fragments"
            );
            // The call starts before its arguments are whole.
            let start = pieces
                .iter()
                .position(|p| matches!(p, Piece::CallStart { .. }));
            let end = pieces
                .iter()
                .position(|p| matches!(p, Piece::CallEnd { .. }));
            assert!(start.is_some() && start < end, "{format}: {pieces:?}");
            assert_eq!(calls_of(pieces), want, "{format} every {step}");
        }
    }
}

#[test]
fn at_every_cut_streamed_and_whole_answers_agree() {
    for (c, text) in two_calls() {
        let format = c.format.name();
        // A grammar that forces calls starts the answer with them.
        let opens = !text.starts_with("Sure.");
        for forced in [false, opens] {
            let c = c.clone().forced(forced);
            for (cut, _) in text.char_indices().skip(1) {
                let text = &text[..cut];
                let (content, want) = read_whole(&c, text);
                for step in [1, 4] {
                    let (pieces, _) = stream_pieces(&c, text, step);
                    let streamed_text = text_of(&pieces);
                    assert_eq!(calls_of(pieces), want, "{format} every {step}: {text:?}");
                    assert_eq!(
                        streamed_text.trim(),
                        content.trim(),
                        "{format} every {step}: {text:?}"
                    );
                }
            }
        }
    }
}
