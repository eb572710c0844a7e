//! The APIs agents speak, end to end with their own SDKs: starts the real `thicket serve` on
//! Qwen2.5-Coder-0.5B (a model that calls tools; with an API key, on a free port) and runs
//! `tests/e2e/openai_responses.py` (the `openai` package through `/v1/responses`) and
//! `tests/e2e/anthropic_messages.py` (the `anthropic` package through `/v1/messages`) and
//! `tests/e2e/openai_agents.py` (an OpenAI Agents SDK agent with one function tool, through
//! Responses), all pinned and installed under `target/` on first use. Then, over raw HTTP, what the SDKs
//! would not send: a Messages body without `max_tokens`, broken JSON, unknown ids, a
//! response kept out of the store, the `x-api-key` header on the other routes, and
//! thicket's own `prediction` and `cache_salt` through both routes.

use std::path::Path;
use std::process::Command;

use serde_json::{json, Value};

use crate::support::fixtures::qwen_path;
use crate::support::processes::{python_packages, run_ok, ServerProcess};

/// The `openai` client version the test runs with.
const OPENAI_VERSION: &str = "3.54.0";
/// The `anthropic` client version the test runs with.
const ANTHROPIC_VERSION: &str = "2.10.0";
/// The OpenAI Agents SDK version the test runs with.
const AGENTS_VERSION: &str = "0.24.0";

const KEY: &str = "agents-secret";

fn run_script(server: &ServerProcess, deps: &Path, script: &str) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join(script);
    let stdout = run_ok(
        Command::new("python3")
            .arg(&script)
            .args([&server.base, KEY, "qwen"])
            .env("PYTHONPATH", deps),
        &format!("{}", script.display()),
    );
    assert!(stdout.contains("checks passed"), "{stdout}");
    eprintln!("{stdout}");
}

fn with_key(server: &ServerProcess, path: &str, body: &Value, header: &str) -> (u16, Value) {
    let (status, _, text) = server.request_with("POST", path, body.to_string().as_bytes(), header);
    let value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    (status, value)
}

#[test]
fn the_openai_and_anthropic_clients_work_through_their_own_apis() {
    let deps = python_packages(
        &format!("openai-{OPENAI_VERSION}-anthropic-{ANTHROPIC_VERSION}"),
        &[
            &format!("openai=={OPENAI_VERSION}"),
            &format!("anthropic=={ANTHROPIC_VERSION}"),
        ],
        "anthropic",
    );
    let model = qwen_path();
    let server = ServerProcess::start(
        &[
            "--served-model-name",
            "qwen",
            "--kv-cache-mib",
            "256",
            "--max-model-len",
            "2048",
            "--model",
            model.to_str().expect("a UTF-8 model path"),
        ],
        &[("THICKET_API_KEY", KEY)],
    );
    run_script(&server, &deps, "tests/e2e/openai_responses.py");
    run_script(&server, &deps, "tests/e2e/anthropic_messages.py");
    let agents = python_packages(
        &format!("openai-agents-{AGENTS_VERSION}-openai-{OPENAI_VERSION}"),
        &[
            &format!("openai-agents=={AGENTS_VERSION}"),
            &format!("openai=={OPENAI_VERSION}"),
        ],
        "agents",
    );
    run_script(&server, &agents, "tests/e2e/openai_agents.py");

    let bearer = format!("Authorization: Bearer {KEY}\r\n");
    let x_key = format!("x-api-key: {KEY}\r\n");
    let hi = json!([{"role": "user", "content": "hi"}]);
    // Messages: max_tokens is required; errors in Anthropic's shape, auth included.
    let (status, body) = with_key(&server, "/v1/messages", &json!({"messages": hi}), &x_key);
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["type"], "error", "{body}");
    assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    assert!(body["error"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("max_tokens")));
    let (status, _, text) = server.request_with("POST", "/v1/messages", b"{not json", &x_key);
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("\"invalid_request_error\"") && text.contains("\"type\":\"error\""));
    let (status, body) = with_key(&server, "/v1/messages", &json!({"messages": hi}), "");
    assert_eq!(
        (status, body["error"]["type"].as_str()),
        (401, Some("authentication_error"))
    );
    let (status, body) = with_key(
        &server,
        "/v1/messages",
        &json!({"model": "claude-x", "max_tokens": 4, "messages": hi}),
        &x_key,
    );
    assert_eq!(
        (status, body["error"]["type"].as_str()),
        (404, Some("not_found_error"))
    );
    // x-api-key works on the OpenAI routes too.
    let chat = json!({"messages": hi, "max_tokens": 2});
    let (status, body) = with_key(&server, "/v1/chat/completions", &chat, &x_key);
    assert_eq!(status, 200, "{body}");

    // Responses: unknown ids are 404s in OpenAI's shape; `store: false` keeps nothing.
    let (status, text) = server.get("/v1/responses/resp_nothing");
    assert_eq!(status, 401, "the key guards stored responses too: {text}");
    let (status, _, text) = server.request_with("GET", "/v1/responses/resp_nothing", b"", &bearer);
    assert_eq!(status, 404, "{text}");
    let error: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(error["error"]["code"], "response_not_found", "{error}");
    let unstored = json!({"input": "hi", "max_output_tokens": 2, "store": false});
    let (status, body) = with_key(&server, "/v1/responses", &unstored, &bearer);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["store"], false);
    let id = body["id"].as_str().expect("an id");
    let (status, _, _) = server.request_with("GET", &format!("/v1/responses/{id}"), b"", &bearer);
    assert_eq!(status, 404, "a response with store false is not kept");
    let (status, _, _) =
        server.request_with("DELETE", &format!("/v1/responses/{id}"), b"", &bearer);
    assert_eq!(status, 404);
    let (status, body) = with_key(
        &server,
        "/v1/responses",
        &json!({"input": "hi", "background": true}),
        &bearer,
    );
    assert_eq!(
        (status, body["error"]["param"].as_str()),
        (400, Some("background"))
    );

    // thicket's own fields pass through both routes: a prediction drafts (its accepted
    // tokens are counted), an invalid cache_salt is refused naming the field.
    let ask = "Write the numbers from 1 to 30, separated by commas.";
    let greedy = json!({"input": ask, "max_output_tokens": 40, "temperature": 0});
    let (status, plain) = with_key(&server, "/v1/responses", &greedy, &bearer);
    assert_eq!(status, 200, "{plain}");
    let text = plain["output"][0]["content"][0]["text"]
        .as_str()
        .expect("text");
    let mut predicted = greedy.clone();
    predicted["prediction"] = json!({"type": "content", "content": text});
    let (status, body) = with_key(&server, "/v1/responses", &predicted, &bearer);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["output"][0]["content"][0]["text"], text, "lossless");
    let details = &body["usage"]["output_tokens_details"];
    assert!(
        details["accepted_prediction_tokens"].as_u64() > Some(10),
        "{details}"
    );
    let salted = json!({"input": "hi", "max_output_tokens": 2, "cache_salt": ""});
    let (status, body) = with_key(&server, "/v1/responses", &salted, &bearer);
    assert_eq!(
        (status, body["error"]["param"].as_str()),
        (400, Some("cache_salt"))
    );
    let salted = json!({"messages": hi, "max_tokens": 2, "cache_salt": 5});
    let (status, body) = with_key(&server, "/v1/messages", &salted, &x_key);
    assert_eq!(status, 400, "{body}");
    assert!(body["error"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("cache_salt")));
}
