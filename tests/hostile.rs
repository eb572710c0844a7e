//! Hostile input against the real `thicket serve` on SmolLM2: malformed bytes, pathological
//! JSON, oversized bodies, out-of-range numbers, absurd counts and lengths, bad roles,
//! token ids and predictions. Every one must be answered with a 4xx and an OpenAI-shaped JSON error, and
//! the server must keep serving afterwards.

use serde_json::{json, Value};

use crate::common::smollm2_path;
use crate::processes::ServerProcess;

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
