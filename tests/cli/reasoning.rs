//! Reasoning output on a real server (`--reasoning-parser`) on SmolLM2, which does not think:
//! under `deepseek_r1` everything it writes is thinking until a thinking budget ends it, then
//! the answer follows the request's JSON schema (checked with the `jsonschema` crate). The
//! chat API returns the thinking as `reasoning_content` (and vLLM's newer `reasoning`) apart
//! from `content`, with `reasoning_tokens` in usage, the same whole and streamed (the deltas
//! joined) and with speculation off; a server without a parser refuses a budget and holds a
//! format to the whole output; thinking cut off by `max_tokens` is all thinking, with no
//! content; and an unknown parser name refuses to start the server, naming the known ones.
//! (Exact parser outputs are tested on a scripted model, in `http::reasoning`.)

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

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 12},
                       "age": {"type": "integer", "minimum": 0, "maximum": 150}},
        "required": ["name", "age"],
        "additionalProperties": false
    })
}

/// Ada described as JSON after at most `budget` thinking tokens, with speculation `method`.
fn budgeted(budget: usize, method: &str) -> Value {
    json!({
        "messages": [{"role": "user", "content": "Describe a person called Ada."}],
        "max_tokens": 80,
        "temperature": 0,
        "thinking_token_budget": budget,
        "response_format": {"type": "json_schema",
                            "json_schema": {"name": "person", "schema": schema()}},
        "speculation": {"method": method},
    })
}

#[test]
fn a_budget_ends_the_thinking_and_the_schema_holds_for_the_answer() {
    // SmolLM2 does not think: under `deepseek_r1` all it writes is thinking until the
    // budget ends it, and the schema applies from there.
    let parsed = server(Some("deepseek_r1"));
    let request = budgeted(6, "auto");
    let (status, whole) = parsed.post("/v1/chat/completions", &request);
    assert_eq!(status, 200, "{whole}");
    let message = &whole["choices"][0]["message"];
    let thinking = message["reasoning_content"].as_str().unwrap().to_string();
    let content = message["content"].as_str().unwrap().to_string();
    assert_eq!(message["reasoning"], message["reasoning_content"]);
    assert!(
        !thinking.is_empty() && !thinking.contains("think>"),
        "{whole}"
    );
    let person: Value = serde_json::from_str(&content).unwrap_or_else(|e| panic!("{e}: {whole}"));
    assert!(
        jsonschema::validator_for(&schema())
            .unwrap()
            .is_valid(&person),
        "{whole}"
    );
    assert_eq!(whole["choices"][0]["finish_reason"], "stop");
    assert_eq!(
        whole["usage"]["completion_tokens_details"]["reasoning_tokens"], 6,
        "{whole}"
    );
    let (s_thinking, s_content, calls, finish) = streamed(&parsed, &request);
    assert_eq!(
        (s_thinking.as_str(), s_content.as_str()),
        (thinking.as_str(), content.as_str())
    );
    assert_eq!((calls, finish.as_str()), (0, "stop"));
    // Greedy output with a parser, a budget and a schema is the same without speculation.
    let (status, plain) = parsed.post("/v1/chat/completions", &budgeted(6, "none"));
    assert_eq!(status, 200, "{plain}");
    assert_eq!(
        plain["choices"][0]["message"],
        whole["choices"][0]["message"]
    );

    // Without a parser a budget is refused, and a format holds for the whole output,
    // markers and all.
    let plain = server(None);
    let (status, e) = plain.post("/v1/chat/completions", &request);
    assert_eq!(status, 400, "{e}");
    assert_eq!(e["error"]["param"], "thinking_token_budget", "{e}");
    let regex = "<think>[a-z ]{4,24}</think>[A-Z][a-z]{1,8}\\.";
    let (status, whole) = plain.post("/v1/chat/completions", &body(regex, 40));
    assert_eq!(status, 200, "{whole}");
    let content = whole["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(
        content.starts_with("<think>") && content.contains("</think>"),
        "{whole}"
    );
    assert!(whole["choices"][0]["message"]
        .get("reasoning_content")
        .is_none());
}

#[test]
fn thinking_cut_off_by_the_length_limit_has_no_content() {
    let server = server(Some("deepseek_r1"));
    let mut request = body("unused", 12);
    request
        .as_object_mut()
        .unwrap()
        .remove("structured_outputs");
    let (status, whole) = server.post("/v1/chat/completions", &request);
    assert_eq!(status, 200, "{whole}");
    let choice = &whole["choices"][0];
    assert_eq!(choice["finish_reason"], "length", "{whole}");
    assert!(choice["message"]["content"].is_null(), "{whole}");
    let thinking = choice["message"]["reasoning_content"].as_str().unwrap();
    assert!(!thinking.is_empty(), "{whole}");
    assert_eq!(
        whole["usage"]["completion_tokens_details"]["reasoning_tokens"],
        12
    );
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
    // The generic parser needs both strings, and the strings need it.
    for (args, want) in [
        (
            vec!["--reasoning-parser", "generic"],
            "needs --reasoning-start",
        ),
        (
            vec![
                "--reasoning-parser",
                "generic",
                "--reasoning-start",
                "<a>",
                "--reasoning-end",
                "<a>",
            ],
            "two different",
        ),
        (
            vec!["--reasoning-start", "<a>"],
            "go with --reasoning-parser generic",
        ),
    ] {
        let out = thicket()
            .args(["serve", "--port", "0"])
            .args(&args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(want), "{args:?}: {stderr}");
    }
}
