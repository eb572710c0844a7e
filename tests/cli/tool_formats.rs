//! Each tool-call format round-trips on a real server (`--tool-call-parser`): under
//! `tool_choice: required` and a named function, SmolLM2's answer is forced into the
//! format's syntax by its grammar, and the same format reads it back into `tool_calls` whose
//! arguments hold the schema's types, the same whole and streamed; an unknown format name
//! refuses to start the server.

use serde_json::{json, Value};

use crate::support::chat_stream::ChatStream;
use crate::support::fixtures::smollm2_path;
use crate::support::processes::{thicket, ServerProcess};

const FORMATS: &[&str] = &["hermes", "llama3_json", "mistral", "qwen3_coder"];

fn server(format: &str) -> ServerProcess {
    let model = smollm2_path();
    ServerProcess::start(
        &[
            "--kv-cache-mib",
            "64",
            "--max-model-len",
            "1024",
            "--tool-call-parser",
            format,
            "--model",
            model.to_str().unwrap(),
        ],
        &[],
    )
}

fn body(choice: Value) -> Value {
    json!({
        "messages": [{"role": "user", "content": "What is the weather in Paris for the next 3 days?"}],
        "max_tokens": 120,
        "temperature": 0,
        "tools": [
            {"type": "function", "function": {"name": "get_weather", "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 20},
                               "days": {"type": "integer", "minimum": 1, "maximum": 9}},
                "required": ["city", "days"]}}},
            {"type": "function", "function": {"name": "get_time", "parameters": {
                "type": "object", "properties": {"zone": {"type": "string", "enum": ["utc", "cet"]}},
                "required": ["zone"]}}}
        ],
        "tool_choice": choice,
        "parallel_tool_calls": false,
    })
}

/// The calls of a streamed answer (name, arguments) and its finish reason.
fn streamed(server: &ServerProcess, body: &Value) -> (Vec<(String, String)>, String) {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let (status, _, sse) =
        server.request("POST", "/v1/chat/completions", body.to_string().as_bytes());
    assert_eq!(status, 200, "{sse}");
    let answer = ChatStream::of_sse(&sse);
    (answer.calls, answer.finish)
}

fn check_arguments(name: &str, arguments: &Value, whole: &Value) {
    match name {
        "get_weather" => {
            assert!(arguments["city"].is_string(), "{whole}");
            assert!(arguments["days"].is_u64(), "{whole}");
        }
        "get_time" => assert!(
            arguments["zone"] == "utc" || arguments["zone"] == "cet",
            "{whole}"
        ),
        other => panic!("called {other}: {whole}"),
    }
}

#[test]
fn every_format_round_trips_required_and_named_calls_whole_and_streamed() {
    for format in FORMATS {
        let server = server(format);
        for choice in [
            json!("required"),
            json!({"type": "function", "function": {"name": "get_time"}}),
        ] {
            let request = body(choice.clone());
            let (status, whole) = server.post("/v1/chat/completions", &request);
            assert_eq!(status, 200, "{format}: {whole}");
            let message = &whole["choices"][0]["message"];
            assert_eq!(
                whole["choices"][0]["finish_reason"], "tool_calls",
                "{format} {choice}: {whole}"
            );
            let calls = message["tool_calls"].as_array().unwrap();
            assert_eq!(calls.len(), 1, "{format}: {whole}");
            let name = calls[0]["function"]["name"].as_str().unwrap();
            if choice.is_object() {
                assert_eq!(name, "get_time", "{format}: {whole}");
            }
            let arguments: Value =
                serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap())
                    .unwrap_or_else(|e| panic!("{format}: {e}: {whole}"));
            check_arguments(name, &arguments, &whole);
            let (s_calls, finish) = streamed(&server, &request);
            assert_eq!(finish, "tool_calls", "{format}");
            assert_eq!(s_calls.len(), 1, "{format}: {s_calls:?}");
            assert_eq!(s_calls[0].0, name, "{format}");
            let s_arguments: Value = serde_json::from_str(&s_calls[0].1).unwrap();
            assert_eq!(s_arguments, arguments, "{format}");
        }
    }
}

#[test]
fn an_unknown_tool_call_parser_refuses_to_start() {
    let out = thicket()
        .args(["serve", "--port", "0", "--tool-call-parser", "xml"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("unknown tool-call parser") && stderr.contains("qwen3_coder"),
        "{stderr}"
    );
}
