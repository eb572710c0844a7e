//! Hostile input against the real `thicket serve` on SmolLM2: malformed bytes, pathological
//! JSON, oversized bodies, out-of-range numbers, absurd counts and lengths, bad roles,
//! token ids and predictions, on the chat and completions routes, the Responses API and the
//! Messages API. Every one must be answered with a 4xx and a JSON error in the route's API's
//! shape (OpenAI's, or Anthropic's on `/v1/messages`), and the server must keep serving
//! afterwards.

use serde_json::{json, Value};

use crate::support::fixtures::smollm2_path;
use crate::support::processes::ServerProcess;

const MAX_MODEL_LEN: usize = 64;

fn assert_client_error(server: &ServerProcess, name: &str, path: &str, body: &[u8], want: u16) {
    let (status, head, payload) = server.request("POST", path, body);
    assert_eq!(status, want, "{name}: {payload}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/json"),
        "{name}: {head}"
    );
    let error: Value = serde_json::from_str(&payload)
        .unwrap_or_else(|e| panic!("{name}: the error body is not JSON ({e}): {payload}"));
    let message = error["error"]["message"].as_str().unwrap_or_default();
    assert!(!message.is_empty(), "{name}: {error}");
    assert!(error["error"]["type"].is_string(), "{name}: {error}");
    // Anthropic's routes answer in Anthropic's shape.
    if path.starts_with("/v1/messages") {
        assert_eq!(error["type"], "error", "{name}: {error}");
    }
}

#[test]
fn hostile_requests_get_a_4xx_with_a_json_error() {
    let model = smollm2_path();
    let len = MAX_MODEL_LEN.to_string();
    let server = ServerProcess::start(
        &[
            "--served-model-name",
            "smollm2",
            "--max-model-len",
            &len,
            "--kv-cache-mib",
            "64",
            "--model",
            model.to_str().expect("a UTF-8 path"),
        ],
        &[],
    );
    let completion = |extra: Value| {
        let mut body = json!({"model": "smollm2", "prompt": "Hello", "max_tokens": 2});
        for (k, v) in extra.as_object().expect("an object") {
            body[k] = v.clone();
        }
        body.to_string().into_bytes()
    };
    let chat = |messages: Value| {
        json!({"model": "smollm2", "messages": messages, "max_tokens": 2})
            .to_string()
            .into_bytes()
    };
    let responses = |extra: Value| {
        let mut body = json!({"model": "smollm2", "input": "Hello", "max_output_tokens": 2});
        for (k, v) in extra.as_object().expect("an object") {
            body[k] = v.clone();
        }
        body.to_string().into_bytes()
    };
    let messages = |extra: Value| {
        let mut body = json!({"model": "smollm2", "max_tokens": 2,
                              "messages": [{"role": "user", "content": "Hello"}]});
        for (k, v) in extra.as_object().expect("an object") {
            body[k] = v.clone();
        }
        body.to_string().into_bytes()
    };
    let ten_thousand_stops: Vec<String> = (0..10_000).map(|i| format!("s{i}")).collect();
    let too_long_prompt: Vec<u32> = vec![28; MAX_MODEL_LEN + 1];
    let nested = "[".repeat(100_000);
    let cases: Vec<(&str, &str, Vec<u8>, u16)> = vec![
        (
            "invalid UTF-8",
            "/v1/completions",
            b"{\"model\": \"smollm2\", \"prompt\": \"\xff\xfe\xfd\"}".to_vec(),
            400,
        ),
        (
            "deeply nested JSON",
            "/v1/completions",
            nested.into_bytes(),
            400,
        ),
        (
            "nested in a field",
            "/v1/chat/completions",
            format!("{{\"messages\": {}}}", "[".repeat(5000)).into_bytes(),
            400,
        ),
        (
            "10 MB body",
            "/v1/completions",
            completion(json!({"prompt": "a".repeat(10 << 20)})),
            413,
        ),
        (
            "NaN",
            "/v1/completions",
            b"{\"prompt\": \"x\", \"temperature\": NaN}".to_vec(),
            400,
        ),
        (
            "Infinity",
            "/v1/completions",
            b"{\"prompt\": \"x\", \"top_p\": Infinity}".to_vec(),
            400,
        ),
        (
            "huge float",
            "/v1/completions",
            b"{\"prompt\": \"x\", \"temperature\": 1e400}".to_vec(),
            400,
        ),
        (
            "huge temperature",
            "/v1/completions",
            completion(json!({"temperature": 1e300})),
            400,
        ),
        (
            "negative temperature",
            "/v1/completions",
            completion(json!({"temperature": -1})),
            400,
        ),
        (
            "top_p above 1",
            "/v1/completions",
            completion(json!({"top_p": 2.5})),
            400,
        ),
        (
            "negative max_tokens",
            "/v1/completions",
            completion(json!({"max_tokens": -5})),
            400,
        ),
        (
            "max_tokens 2^63",
            "/v1/completions",
            completion(json!({"max_tokens": 1u64 << 63})),
            400,
        ),
        (
            "max_tokens 2^64-1",
            "/v1/completions",
            completion(json!({"max_tokens": u64::MAX})),
            400,
        ),
        (
            "max_tokens 2^64",
            "/v1/completions",
            b"{\"prompt\": \"x\", \"max_tokens\": 18446744073709551616}".to_vec(),
            400,
        ),
        (
            "fractional n",
            "/v1/completions",
            completion(json!({"n": 1.5})),
            400,
        ),
        (
            "n = 10^6",
            "/v1/completions",
            completion(json!({"n": 1_000_000})),
            400,
        ),
        (
            "negative seed",
            "/v1/completions",
            completion(json!({"seed": -3})),
            400,
        ),
        (
            "10,000 stop strings",
            "/v1/completions",
            completion(json!({"stop": ten_thousand_stops})),
            400,
        ),
        (
            "a 10 KB stop string",
            "/v1/completions",
            completion(json!({"stop": "x".repeat(10_000)})),
            400,
        ),
        (
            "prompt of max_model_len + 1 tokens",
            "/v1/completions",
            completion(json!({"prompt": too_long_prompt})),
            400,
        ),
        (
            "token id beyond the vocabulary",
            "/v1/completions",
            completion(json!({"prompt": [4_000_000_000u32]})),
            400,
        ),
        (
            "empty prompt list",
            "/v1/completions",
            completion(json!({"prompt": []})),
            400,
        ),
        (
            "logit_bias with a bad token id",
            "/v1/completions",
            completion(json!({"logit_bias": {"999999999": 1}})),
            400,
        ),
        (
            "logit_bias with a non-numeric key",
            "/v1/completions",
            completion(json!({"logit_bias": {"abc": 1}})),
            400,
        ),
        (
            "logit_bias out of range",
            "/v1/completions",
            completion(json!({"logit_bias": {"5": 1e9}})),
            400,
        ),
        (
            "unknown role",
            "/v1/chat/completions",
            chat(json!([{"role": "wizard", "content": "hi"}])),
            400,
        ),
        (
            "empty messages",
            "/v1/chat/completions",
            chat(json!([])),
            400,
        ),
        (
            "messages not a list",
            "/v1/chat/completions",
            chat(json!("hi")),
            400,
        ),
        (
            "image content",
            "/v1/chat/completions",
            chat(
                json!([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}]}]),
            ),
            400,
        ),
        (
            "prediction longer than the model",
            "/v1/completions",
            completion(json!({"prediction": {"type": "content", "content": "word ".repeat(500)}})),
            400,
        ),
        (
            "prediction not an object",
            "/v1/completions",
            completion(json!({"prediction": 5})),
            400,
        ),
        (
            "prediction part that is not text",
            "/v1/completions",
            completion(json!({"prediction": {"type": "content",
                "content": [{"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}]}})),
            400,
        ),
        (
            "prediction parts nested",
            "/v1/completions",
            completion(json!({"prediction": {"type": "content", "content": [[["x"]]]}})),
            400,
        ),
        ("empty body", "/v1/chat/completions", Vec::new(), 400),
        (
            "responses: input a number",
            "/v1/responses",
            responses(json!({"input": 5})),
            400,
        ),
        (
            "responses: input nested",
            "/v1/responses",
            format!("{{\"input\": {}}}", "[".repeat(5000)).into_bytes(),
            400,
        ),
        (
            "responses: a tool the server would run",
            "/v1/responses",
            responses(json!({"tools": [{"type": "file_search", "vector_store_ids": ["x"]}]})),
            400,
        ),
        (
            "responses: an image item",
            "/v1/responses",
            responses(json!({"input": [{"role": "user", "content": [
                {"type": "input_image", "image_url": "file:///etc/passwd"}]}]})),
            400,
        ),
        (
            "responses: an unknown item",
            "/v1/responses",
            responses(json!({"input": [{"type": "item_reference", "id": "x"}]})),
            400,
        ),
        (
            "responses: negative max_output_tokens",
            "/v1/responses",
            responses(json!({"max_output_tokens": -1})),
            400,
        ),
        (
            "responses: max_output_tokens past the model",
            "/v1/responses",
            responses(json!({"max_output_tokens": 1_000_000})),
            400,
        ),
        (
            "responses: huge temperature",
            "/v1/responses",
            responses(json!({"temperature": 1e300})),
            400,
        ),
        (
            "responses: a schema that is not one",
            "/v1/responses",
            responses(
                json!({"text": {"format": {"type": "json_schema", "name": "x", "schema": 5}}}),
            ),
            400,
        ),
        (
            "responses: an unknown previous response",
            "/v1/responses",
            responses(json!({"previous_response_id": "resp_../../etc/passwd"})),
            404,
        ),
        (
            "responses: unknown model",
            "/v1/responses",
            responses(json!({"model": "gpt-9"})),
            404,
        ),
        (
            "responses: null body",
            "/v1/responses",
            b"null".to_vec(),
            400,
        ),
        (
            "messages: no max_tokens",
            "/v1/messages",
            json!({"messages": [{"role": "user", "content": "hi"}]})
                .to_string()
                .into_bytes(),
            400,
        ),
        (
            "messages: not a list",
            "/v1/messages",
            messages(json!({"messages": "hi"})),
            400,
        ),
        (
            "messages: a system role",
            "/v1/messages",
            messages(json!({"messages": [{"role": "system", "content": "hi"}]})),
            400,
        ),
        (
            "messages: an image block",
            "/v1/messages",
            messages(json!({"messages": [{"role": "user", "content": [
                {"type": "image", "source": {"type": "url", "url": "file:///etc/passwd"}}]}]})),
            400,
        ),
        (
            "messages: tool_use from the user",
            "/v1/messages",
            messages(json!({"messages": [{"role": "user", "content": [
                {"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]})),
            400,
        ),
        (
            "messages: tool_use input not an object",
            "/v1/messages",
            messages(json!({"messages": [{"role": "assistant", "content": [
                {"type": "tool_use", "id": "t", "name": "f", "input": [1]}]}]})),
            400,
        ),
        (
            "messages: max_tokens 2^64-1",
            "/v1/messages",
            messages(json!({"max_tokens": u64::MAX})),
            400,
        ),
        (
            "messages: negative temperature",
            "/v1/messages",
            messages(json!({"temperature": -0.5})),
            400,
        ),
        (
            "messages: nested",
            "/v1/messages",
            format!("{{\"messages\": {}}}", "[".repeat(5000)).into_bytes(),
            400,
        ),
        (
            "messages: unknown model",
            "/v1/messages",
            messages(json!({"model": "claude-x"})),
            404,
        ),
        (
            "messages: count without messages",
            "/v1/messages/count_tokens",
            b"{}".to_vec(),
            400,
        ),
        ("messages: empty body", "/v1/messages", Vec::new(), 400),
        (
            "messages: 10 MB body",
            "/v1/messages",
            messages(json!({"system": "a".repeat(10 << 20)})),
            413,
        ),
        ("null body", "/v1/chat/completions", b"null".to_vec(), 400),
        (
            "unknown model",
            "/v1/completions",
            completion(json!({"model": "../../etc/passwd"})),
            404,
        ),
    ];
    for (name, path, body, status) in &cases {
        assert_client_error(&server, name, path, body, *status);
    }
    // Still serving.
    let (status, answer) = server.post(
        "/v1/completions",
        &json!({"model": "smollm2", "prompt": "Hello", "max_tokens": 2}),
    );
    assert_eq!(status, 200, "{answer}");
    assert_eq!(server.get("/health").0, 200);
}
