//! Gemma 4's chat template, as its GGUF carries it (llama.cpp's Gemma 4 vocabulary, from the
//! pinned llama-cpp-python 0.3.36 sdist), rendered by thicket exactly as transformers 5.23
//! renders it (`render_jinja_template`, on Jinja2; installed under `target/` by the test):
//! a system prompt, thinking on and off, tools of several schema shapes (declared in Gemma 4's
//! own syntax, `<|"|>` quotes and upper-cased types), a call with its arguments, its result,
//! and earlier turns.

use api::chat::{render_chat_with, ChatMessage};
use serde_json::{json, Value};

use crate::support::llamacpp_sdist::llamacpp_files;

const VOCAB: &str = "models/ggml-vocab-gemma-4.gguf";

fn call(id: &str, name: &str, arguments: Value) -> Value {
    json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}})
}

fn tool_result(id: &str, name: &str, content: &str) -> ChatMessage {
    ChatMessage {
        tool_call_id: Some(id.into()),
        name: Some(name.into()),
        ..ChatMessage::text("tool", content)
    }
}

/// Conversations: messages, tools, and the template's variables.
fn cases() -> Vec<(Vec<ChatMessage>, Vec<Value>, Value)> {
    let weather = json!({"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "The city's name"},
            "days": {"type": "integer"},
            "units": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city"]}}});
    let search = json!({"type": "function", "function": {
        "name": "search", "description": "Search the web.",
        "parameters": {"type": "object", "properties": {
            "queries": {"type": "array", "items": {"type": "string"}},
            "filters": {"type": "object", "properties": {"site": {"type": "string"},
                                                          "recent": {"type": "boolean"}}},
            "limit": {"type": "number"}},
            "required": ["queries"]}}});
    let asked = ChatMessage::user("What's the weather in Paris for 3 days?");
    let called = ChatMessage {
        tool_calls: vec![call(
            "c1",
            "get_weather",
            json!({"city": "Paris", "days": 3}),
        )],
        ..ChatMessage::text("assistant", "")
    };
    let two_calls = ChatMessage {
        tool_calls: vec![
            call(
                "c1",
                "search",
                json!({"queries": ["a \"b\"", "c"], "filters": {"recent": true}}),
            ),
            call("c2", "get_weather", json!({"city": "Zürich", "units": "c"})),
        ],
        ..ChatMessage::text("assistant", "")
    };
    vec![
        (vec![ChatMessage::user("Hello!")], vec![], json!({})),
        (
            vec![
                ChatMessage::text("system", "You are terse."),
                ChatMessage::user("Hi"),
                ChatMessage::text("assistant", "Hello."),
                ChatMessage::user("Tell me a joke\nabout   spaces."),
            ],
            vec![],
            json!({}),
        ),
        (
            vec![ChatMessage::user("Think about 2+2.")],
            vec![],
            json!({"enable_thinking": true}),
        ),
        (
            vec![asked.clone()],
            vec![weather.clone(), search.clone()],
            json!({}),
        ),
        (
            vec![
                ChatMessage::text("system", "Use tools."),
                asked.clone(),
                called,
                tool_result("c1", "get_weather", "{\"temp\": 21, \"sky\": \"clear\"}"),
            ],
            vec![weather.clone()],
            json!({"enable_thinking": true}),
        ),
        (
            vec![
                asked,
                two_calls,
                tool_result("c1", "search", "[\"result\"]"),
                tool_result("c2", "get_weather", "sunny"),
                ChatMessage::text("assistant", "Sunny in Zürich."),
                ChatMessage::user("Thanks"),
            ],
            vec![weather, search],
            json!({}),
        ),
    ]
}

/// transformers' renderings of `cases` with `template`.
fn reference(template: &str, cases: &[(Vec<ChatMessage>, Vec<Value>, Value)]) -> Vec<String> {
    let python = crate::support::processes::python_packages(
        "transformers-templates",
        &["transformers==5.23.0", "jinja2==3.1.6"],
        "transformers",
    );
    let input = json!({
        "template": template,
        "cases": cases.iter().map(|(m, t, k)| json!({"messages": m, "tools": t, "kwargs": k}))
            .collect::<Vec<_>>(),
    });
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cases.json");
    std::fs::write(&path, input.to_string()).unwrap();
    let script = r#"
import json, sys
from transformers.utils.chat_template_utils import render_jinja_template
data = json.load(open(sys.argv[1]))
out = []
for case in data["cases"]:
    rendered, _ = render_jinja_template(
        [case["messages"]], tools=case["tools"] or None, chat_template=data["template"],
        add_generation_prompt=True, bos_token="<bos>", eos_token="<eos>", **case["kwargs"])
    out.append(rendered[0])
print(json.dumps(out))
"#;
    let mut command = std::process::Command::new("python3");
    command
        .env("PYTHONPATH", &python)
        .args(["-c", script])
        .arg(&path);
    let out = crate::support::processes::run_ok(&mut command, "transformers' renderer");
    serde_json::from_str(out.trim().lines().last().unwrap()).unwrap()
}

#[test]
fn gemma4_template_renders_as_transformers_renders_it() {
    let dir = llamacpp_files(&[VOCAB]);
    let (content, _) = engine::model::gguf::read_content(&dir.join(VOCAB)).unwrap();
    let tokenizer = engine::ModelTokenizer::from_gguf(&content).unwrap();
    let template = tokenizer
        .chat_template()
        .expect("the vocabulary's template");
    let cases = cases();
    let want = reference(template, &cases);
    assert_eq!(want.len(), cases.len());
    for ((messages, tools, kwargs), want) in cases.iter().zip(&want) {
        let kwargs = kwargs.as_object().cloned().unwrap_or_default();
        let ours = render_chat_with(template, messages, tools, "<bos>", "<eos>", &kwargs).unwrap();
        assert_eq!(&ours, want, "messages {messages:?}");
    }
    // The reference rendered what the cases mean to check.
    assert!(want[2].contains("<|think|>") && want[3].contains("<|tool>declaration:search"));
    assert!(want[4].contains("<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>,days:3}"));
}
