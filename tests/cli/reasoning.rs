//! Reasoning output on a real server (`--reasoning-parser`). SmolLM2's answers are held to a
//! thinking shape by a regex (`structured_outputs`), so the text the parser reads is known:
//! the chat API returns the thinking as `reasoning_content` (and vLLM's newer `reasoning`)
//! apart from `content`, the same whole and streamed (the deltas joined); a server without a
//! parser returns the same text whole in `content`; a tool call written inside the thinking is
//! not a call; thinking cut off by `max_tokens` is all thinking, with no content; and an
//! unknown parser name refuses to start the server, naming the known ones.

use serde_json::{json, Value};

use crate::support::fixtures::smollm2_path;
use crate::support::processes::{thicket, ServerProcess};

fn server(parser: Option<&str>) -> ServerProcess {
    let model = smollm2_path();
    let mut args = vec![
        "--kv-cache-mib",
        "64",
        "--max-model-len",
        "512",
        "--model",
        model.to_str().unwrap(),
    ];
    if let Some(name) = parser {
        args.extend(["--reasoning-parser", name]);
    }
    ServerProcess::start(&args, &[])
}

fn body(regex: &str, max_tokens: usize) -> Value {
    json!({
        "messages": [{"role": "user", "content": "What is two plus two?"}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "structured_outputs": {"regex": regex},
    })
}

/// A streamed answer's joined `reasoning_content`, joined `content`, tool-call deltas and
/// finish reason; every delta's `reasoning` must equal its `reasoning_content`.
fn streamed(server: &ServerProcess, body: &Value) -> (String, String, usize, String) {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let (status, _, sse) =
        server.request("POST", "/v1/chat/completions", body.to_string().as_bytes());
    assert_eq!(status, 200, "{sse}");
    let (mut thinking, mut content, mut calls, mut finish) =
        (String::new(), String::new(), 0, String::new());
    for line in sse.lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            break;
        }
        let chunk: Value = serde_json::from_str(data).unwrap();
        let choice = &chunk["choices"][0];
        let delta = &choice["delta"];
        assert_eq!(delta["reasoning"], delta["reasoning_content"], "{data}");
        thinking.push_str(delta["reasoning_content"].as_str().unwrap_or(""));
        content.push_str(delta["content"].as_str().unwrap_or(""));
        calls += delta["tool_calls"].as_array().map_or(0, Vec::len);
        if let Some(reason) = choice["finish_reason"].as_str() {
            finish = reason.to_string();
        }
    }
    (thinking, content, calls, finish)
}

#[test]
fn thinking_comes_apart_from_the_answer_whole_and_streamed() {
    let regex = "<think>[a-z ]{4,24}</think>[A-Z][a-z]{1,8}\\.";
    let request = body(regex, 40);
    let parsed = server(Some("deepseek_r1"));
    let (status, whole) = parsed.post("/v1/chat/completions", &request);
    assert_eq!(status, 200, "{whole}");
    let message = &whole["choices"][0]["message"];
    let thinking = message["reasoning_content"].as_str().unwrap().to_string();
    let content = message["content"].as_str().unwrap().to_string();
    assert_eq!(message["reasoning"], message["reasoning_content"]);
    assert!(
        (4..=24).contains(&thinking.len())
            && thinking.chars().all(|c| c == ' ' || c.is_ascii_lowercase()),
        "{whole}"
    );
    assert!(
        content.ends_with('.') && !content.contains("think"),
        "{whole}"
    );
    assert_eq!(whole["choices"][0]["finish_reason"], "stop");
    let (s_thinking, s_content, calls, finish) = streamed(&parsed, &request);
    assert_eq!(
        (s_thinking.as_str(), s_content.as_str()),
        (thinking.as_str(), content.as_str())
    );
    assert_eq!((calls, finish.as_str()), (0, "stop"));

    // Without a parser the same greedy text comes back whole, markers and all.
    let plain = server(None);
    let (status, whole) = plain.post("/v1/chat/completions", &request);
    assert_eq!(status, 200, "{whole}");
    let message = &whole["choices"][0]["message"];
    assert_eq!(
        message["content"].as_str().unwrap(),
        format!("<think>{thinking}</think>{content}")
    );
    assert!(message.get("reasoning_content").is_none(), "{whole}");
}

#[test]
fn a_call_inside_the_thinking_is_not_a_call_and_cut_off_thinking_has_no_content() {
    let server = server(Some("deepseek_r1"));
    let call =
        r#"<tool_call>\{"name": "get_weather", "arguments": \{"city": "Paris"\}\}</tool_call>"#;
    let mut request = body(&format!("<think>{call}</think>[A-Z][a-z]{{1,8}}\\."), 60);
    request["tools"] = json!([{"type": "function", "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}
    }}]);
    let (status, whole) = server.post("/v1/chat/completions", &request);
    assert_eq!(status, 200, "{whole}");
    let choice = &whole["choices"][0];
    assert_eq!(choice["finish_reason"], "stop", "{whole}");
    assert!(choice["message"].get("tool_calls").is_none(), "{whole}");
    let thinking = choice["message"]["reasoning_content"].as_str().unwrap();
    assert!(
        thinking.starts_with("<tool_call>{\"name\": \"get_weather\""),
        "{whole}"
    );
    let (_, content, calls, finish) = streamed(&server, &request);
    assert_eq!((calls, finish.as_str()), (0, "stop"));
    assert_eq!(content, choice["message"]["content"].as_str().unwrap());

    // Cut off while thinking: everything is thinking, and there is no content.
    let request = body("<think>[a-z ]{40,60}</think>ok", 12);
    let (status, whole) = server.post("/v1/chat/completions", &request);
    assert_eq!(status, 200, "{whole}");
    let choice = &whole["choices"][0];
    assert_eq!(choice["finish_reason"], "length", "{whole}");
    assert!(choice["message"]["content"].is_null(), "{whole}");
    let thinking = choice["message"]["reasoning_content"].as_str().unwrap();
    assert!(!thinking.is_empty() && !thinking.contains('<'), "{whole}");
    let (s_thinking, s_content, _, finish) = streamed(&server, &request);
    assert_eq!(
        (s_thinking.as_str(), s_content.as_str(), finish.as_str()),
        (thinking, "", "length")
    );
}

#[test]
fn an_unknown_reasoning_parser_refuses_to_start() {
    let out = thicket()
        .args(["serve", "--port", "0", "--reasoning-parser", "r1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("unknown reasoning parser \"r1\"") && stderr.contains("deepseek_r1, qwen3"),
        "{stderr}"
    );
}
