//! gpt-oss's format against openai-harmony, its reference implementation
//! (`scripts/harmony-reference.py` runs it, pinned, installed under `target/`). Prompts: a
//! server on the o200k_harmony tokenizer and gpt-oss's chat template gives, at `/tokenize`,
//! the token ids openai-harmony renders for the same conversations (system and developer
//! messages, reasoning efforts, tools of many schema shapes, earlier turns, calls and their
//! results), but where the file's template itself writes otherwise than harmony: a call's
//! `<|constrain|>json` as the text `json`, a tool result as a JSON string (`|tojson`),
//! instructions without tools ending in a blank line, each rewritten in the reference's text
//! and asserted to be the only difference. Replies: what
//! chat completions returns for a reply (thinking, content, calls) is what openai-harmony
//! reads from it, message by message, for whole replies and malformed ones (cut off in a
//! body or a header, a call with broken JSON, built-in tool calls, preambles); a reply the
//! reference refuses (no header at all) is content, never a 5xx.

use std::time::{SystemTime, UNIX_EPOCH};

use api::server::reasoning::ReasoningParser;
use api::server::settings::template::TemplateSetup;
use axum::http::StatusCode;
use serde_json::{json, Value};

use super::mock_server::call;
use super::scripted::{scripted_full, silent_server_on};
use crate::model::o200k::fixture;
use crate::support::harmony::Harmony;

/// Runs the reference on `cases` (`{"render": request}` or `{"parse": text}`).
fn reference(harmony: &Harmony, date: &str, cases: &[Value]) -> Vec<Value> {
    let input = tempfile::NamedTempFile::new().unwrap();
    let given = json!({"date": date, "cases": cases});
    std::fs::write(input.path(), given.to_string()).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/harmony-reference.py");
    let out = harmony.run(&[script.as_ref(), input.path().as_os_str()]);
    let results: Vec<Value> = serde_json::from_slice(&out).unwrap();
    assert_eq!(results.len(), cases.len());
    results
}

fn weather() -> Value {
    json!({"type": "function", "function": {
        "name": "get_weather", "description": "The current weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "The city's name."},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"]}}})
}

fn search() -> Value {
    json!({"type": "function", "function": {
        "name": "search_files", "description": "Search the project's files.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string"},
            "limit": {"type": "integer", "description": "At most this many."},
            "exact": {"type": "boolean"},
            "paths": {"type": "array", "items": {"type": "string"}},
            "score": {"type": "number"}},
            "required": ["query", "exact"]}}})
}

/// Conversations, as chat completions takes them.
fn conversations() -> Vec<(&'static str, Value)> {
    let user = |text: &str| json!({"role": "user", "content": text});
    let call = json!({"role": "assistant", "reasoning_content": "I need the weather.",
        "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": "{\"city\":\"Oslo\",\"unit\":\"celsius\"}"}}]});
    let result = json!({"role": "tool", "tool_call_id": "call_1",
                        "content": "{\"temperature\": 3, \"sky\": \"snow\"}"});
    vec![
        ("a user alone", json!({"messages": [user("What is 2+2?")]})),
        (
            "a system message and low effort",
            json!({"messages": [{"role": "system", "content": "Answer in French."},
                                user("Bonjour!")],
                   "reasoning_effort": "low"}),
        ),
        (
            "a developer message and high effort",
            json!({"messages": [{"role": "developer", "content": "Be terse.\nNo lists."},
                                user("Name a prime.")],
                   "reasoning_effort": "high"}),
        ),
        (
            "tools",
            json!({"messages": [user("Weather in Oslo?")], "tools": [weather(), search()]}),
        ),
        (
            "instructions and tools",
            json!({"messages": [{"role": "system", "content": "Use tools."},
                                user("Find main.rs")],
                   "tools": [search()], "reasoning_effort": "medium"}),
        ),
        (
            "an earlier turn with its thinking",
            json!({"messages": [user("Hi"),
                                {"role": "assistant", "reasoning_content": "Greet back.",
                                 "content": "Hello!"},
                                user("How are you?")]}),
        ),
        (
            "a call and its result",
            json!({"messages": [user("Weather in Oslo?"), call.clone(), result.clone()],
                   "tools": [weather()]}),
        ),
        (
            "a call, its result and the answer, then a new question",
            json!({"messages": [user("Weather in Oslo?"), call, result,
                                {"role": "assistant", "content": "It snows, 3 degrees."},
                                user("And tomorrow?")],
                   "tools": [weather()]}),
        ),
    ]
}

/// The reference's text with the file's template's own ways of writing a call and a tool
/// result: `<|constrain|>json` as text, and the result JSON-quoted.
fn as_the_template_writes(text: &str) -> String {
    let text = text.replace(
        "<|channel|>commentary <|constrain|>json<|message|>",
        "<|channel|>commentary json<|message|>",
    );
    // Instructions without tools end in a blank line.
    let text = match text.find("<|start|>developer<|message|># Instructions\n\n") {
        Some(at) if !developer_has_tools(&text[at..]) => {
            let end = text[at..].find("<|end|>").unwrap() + at;
            format!("{}\n\n{}", &text[..end], &text[end..])
        }
        _ => text,
    };
    let head = " to=assistant<|channel|>commentary<|message|>";
    let mut out = String::new();
    let mut rest = text.as_str();
    while let Some(at) = rest.find(head) {
        let body_at = at + head.len();
        let end = rest[body_at..].find("<|end|>").unwrap() + body_at;
        out.push_str(&rest[..body_at]);
        out.push_str(&serde_json::to_string(&rest[body_at..end]).unwrap());
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// Whether the developer message `text` opens with shows tools.
fn developer_has_tools(text: &str) -> bool {
    let end = text.find("<|end|>").unwrap_or(text.len());
    text[..end].contains("# Tools")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gptoss_prompts_are_the_tokens_openai_harmony_renders() {
    let (harmony, tok, _) = fixture();
    let server = silent_server_on(tok.clone(), Some(ReasoningParser::Harmony));
    let seconds = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let date = api::chat_functions::strftime("%Y-%m-%d", seconds);
    let cases = conversations();
    let given: Vec<Value> = cases.iter().map(|(_, c)| json!({"render": c})).collect();
    let want = reference(harmony, &date, &given);
    let mut rewritten = 0;
    for ((name, case), want) in cases.iter().zip(want) {
        let (status, got) = call(&server.app, "POST", "/tokenize", Some(case.clone())).await;
        assert_eq!(status, StatusCode::OK, "{name}: {got}");
        let got: Vec<u32> = serde_json::from_value(got["tokens"].clone()).unwrap();
        let want: Vec<u32> = serde_json::from_value(want).unwrap();
        let want_text = tok.decode(&want).unwrap();
        let templated = as_the_template_writes(&want_text);
        let want = if templated == want_text {
            want
        } else {
            rewritten += 1;
            tok.encode_plain(&templated).unwrap()
        };
        assert!(
            got == want,
            "{name}: thicket's prompt is not openai-harmony's\n  thicket        {:?}\n  openai-harmony {:?}",
            tok.decode(&got).unwrap(),
            tok.decode(&want).unwrap()
        );
    }
    // The conversations with calls in them, or instructions without tools, needed the
    // template's own writing.
    assert_eq!(rewritten, 4);
}

/// Replies, as gpt-oss writes them after the prompt's `<|start|>assistant`.
const REPLIES: &[&str] = &[
    "<|channel|>analysis<|message|>Simple sum.<|end|><|start|>assistant<|channel|>final<|message|>2 + 2 = 4.<|return|>",
    "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Oslo\"}<|call|>",
    "<|channel|>analysis<|message|>First.<|end|><|start|>assistant<|channel|>analysis<|message|> Second.<|end|><|start|>assistant<|channel|>final<|message|>Done.<|return|>",
    "<|channel|>analysis<|message|>Check first.<|end|><|start|>assistant<|channel|>commentary<|message|>Let me look that up.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>",
    "<|channel|>analysis<|message|>Search it.<|end|><|start|>assistant<|channel|>analysis to=browser.search <|constrain|>json<|message|>{\"query\": \"oslo weather\"}<|call|>",
    "<|channel|>analysis<|message|>Broken.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": Oslo}<|call|>",
    "<|channel|>analysis<|message|>Thinking that is cut off mid",
    "<|channel|>analysis<|message|>Call.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Os",
    "<|channel|>analysis<|message|>Done thinking.<|end|><|start|>assistant<|channel|>fin",
    "<|channel|>final<|message|>No analysis at all.<|return|>",
];

/// What chat completions should return for a reply openai-harmony reads as `messages`:
/// thinking (analysis, and calls to built-in tools), content (final, and commentary to no
/// one), calls (to `functions.NAME`).
fn expected(messages: &[Value]) -> (Value, Value, Vec<(String, String)>) {
    let (mut thinking, mut content, mut calls) = (String::new(), String::new(), Vec::new());
    for m in messages {
        let (channel, recipient, text) = (m[0].as_str(), m[1].as_str(), m[2].as_str().unwrap());
        match (channel, recipient) {
            (_, Some(to)) if to.starts_with("functions.") => {
                calls.push((to["functions.".len()..].to_string(), text.to_string()))
            }
            (_, Some(_)) | (Some("analysis"), None) => thinking.push_str(text),
            _ => content.push_str(text),
        }
    }
    let or_null = |s: String| if s.is_empty() { Value::Null } else { json!(s) };
    (or_null(thinking), or_null(content), calls)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_read_as_openai_harmony_reads_them() {
    let (harmony, _, _) = fixture();
    let mut cases: Vec<&str> = REPLIES.to_vec();
    cases.push("A reply that never opens a header.");
    // Each reply, and the messages before its last header (what the reference reads of a
    // reply cut off inside a header, which it refuses whole).
    let given: Vec<Value> = cases
        .iter()
        .flat_map(|r| {
            let before = &r[..r.rfind("<|start|>").unwrap_or(0)];
            [json!({"parse": r}), json!({"parse": before})]
        })
        .collect();
    let results = reference(harmony, "2026-01-01", &given);
    for (reply, want) in cases.iter().zip(results.chunks(2)) {
        let server = scripted_full(
            reply,
            Some(ReasoningParser::Harmony),
            Some("openai"),
            TemplateSetup::default(),
        );
        let body = json!({"messages": [{"role": "user", "content": "Go."}],
                          "max_tokens": 200, "temperature": 0,
                          "tools": [weather()]});
        let (status, got) = call(&server.app, "POST", "/v1/chat/completions", Some(body)).await;
        assert_eq!(status, StatusCode::OK, "{reply}: {got}");
        let message = &got["choices"][0]["message"];
        let calls: Vec<(String, String)> = message["tool_calls"]
            .as_array()
            .map(|calls| {
                calls
                    .iter()
                    .map(|c| {
                        let f = &c["function"];
                        (
                            f["name"].as_str().unwrap().to_string(),
                            f["arguments"].as_str().unwrap().to_string(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        let got = (
            message["reasoning_content"].clone(),
            message["content"].clone(),
            calls,
        );
        match (want[0].as_array(), want[1].as_array()) {
            (Some(messages), _) => assert_eq!(got, expected(messages), "{reply}"),
            // Cut off inside a header: the messages before it, the header dropped.
            (None, Some(before)) if reply.contains("<|start|>") => {
                assert!(want[0]["error"].is_string(), "{want:?}");
                assert_eq!(got, expected(before), "{reply}");
            }
            // No header at all: the reference refuses it; thicket returns it as the answer.
            _ => {
                assert!(want[0]["error"].is_string(), "{want:?}");
                assert_eq!(got, (Value::Null, json!(reply), vec![]), "{reply}");
            }
        }
    }
}
