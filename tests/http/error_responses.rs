//! The router's refusals, over an engine with the mock backend: every error status (400, 401,
//! 404, 405, 413, 429, 503) in OpenAI's error shape, naming the parameter at fault, and a full
//! queue that answers 429 with `Retry-After` until a place frees.

use std::time::{Duration, Instant};

use api::server::{router, AppState, Choice, ServerConfig};
use axum::http::{header, StatusCode};
use engine::{Request, SamplingParams, StopConditions};
use serde_json::{json, Value};

use super::mock_server::{
    assert_error, call, call_raw, request, server_over, server_with, KEY, MAX_MODEL_LEN,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_has_its_status_and_the_openai_shape() {
    let s = server_with(64, 4096);
    let post = |path: &'static str, body: Value| {
        let app = s.app.clone();
        async move { call(&app, "POST", path, Some(body)).await }
    };
    // 400s name their field.
    let cases = [
        (
            "/v1/completions",
            json!({"prompt": "<5>", "temperature": 5}),
            "temperature",
        ),
        (
            "/v1/completions",
            json!({"prompt": "<5>", "temperature": "hot"}),
            "temperature",
        ),
        ("/v1/completions", json!({"prompt": "<5>", "n": 0}), "n"),
        (
            "/v1/completions",
            json!({"prompt": "<5>", "top_p": 1.5}),
            "top_p",
        ),
        (
            "/v1/completions",
            json!({"prompt": "<5>", "max_tokens": 0}),
            "max_tokens",
        ),
        (
            "/v1/completions",
            json!({"prompt": "<5> <6>", "max_tokens": MAX_MODEL_LEN}),
            "max_tokens",
        ),
        (
            "/v1/completions",
            json!({"prompt": vec![1; MAX_MODEL_LEN]}),
            "prompt",
        ),
        ("/v1/completions", json!({"prompt": [70]}), "prompt"),
        ("/v1/completions", json!({"max_tokens": 3}), "prompt"),
        (
            "/v1/completions",
            json!({"prompt": "<5>", "suffix": "x"}),
            "suffix",
        ),
        (
            "/v1/completions",
            json!({"prompt": "<5>", "echo": true, "logprobs": 1}),
            "echo",
        ),
        (
            "/v1/completions",
            json!({"prompt": "<5>", "speculation": {"method": "magic"}}),
            "speculation.method",
        ),
        (
            "/v1/completions",
            json!({"prompt": "<5>", "speculation": {"method": "draft_model"}}),
            "speculation.method",
        ),
        (
            "/v1/completions",
            json!({"prompt": "<5>", "logit_bias": {"5": 500}}),
            "logit_bias",
        ),
        ("/v1/chat/completions", json!({"messages": []}), "messages"),
        ("/v1/chat/completions", json!({}), "messages"),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "wizard", "content": "x"}]}),
            "messages[0].role",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}),
            "tools[0].function",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}}),
            "tool_choice",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}),
            "tool_choice",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "[1]"}}]}]}),
            "messages[0].tool_calls[0].function.arguments",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}),
            "top_logprobs",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user"}], "response_format": {"type": "yaml"}}),
            "response_format",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user"}], "response_format": {"type": "json_schema", "json_schema": {"schema": 3}}}),
            "response_format",
        ),
        (
            // The mock's word-level tokenizer has no byte-level decoder to build masks from.
            "/v1/chat/completions",
            json!({"messages": [{"role": "user"}], "response_format": {"type": "json_object"}}),
            "response_format",
        ),
    ];
    for (path, body, field) in cases {
        let (status, response) = post(path, body.clone()).await;
        assert_eq!(
            assert_error(status, &response, StatusCode::BAD_REQUEST),
            field,
            "{body}"
        );
    }
    // Bodies that are not JSON objects.
    for raw in [&b"{bad json"[..], b"[1, 2]", b""] {
        let (status, _, bytes) = call_raw(
            &s.app,
            request("POST", "/v1/completions", Some(raw.to_vec()), Some(KEY)),
        )
        .await;
        let body: Value = serde_json::from_slice(&bytes).unwrap();
        assert_error(status, &body, StatusCode::BAD_REQUEST);
    }
    // 401 without the key or with a wrong one; health and metrics stay open.
    for key in [None, Some("wrong"), Some("test-key-but-longer")] {
        let (status, _, bytes) = call_raw(&s.app, request("GET", "/v1/models", None, key)).await;
        let body: Value = serde_json::from_slice(&bytes).unwrap();
        assert_error(status, &body, StatusCode::UNAUTHORIZED);
    }
    let (status, _, _) = call_raw(&s.app, request("GET", "/health", None, None)).await;
    assert_eq!(status, StatusCode::OK);
    // 404: unknown model, unknown path.
    let (status, body) = post(
        "/v1/completions",
        json!({"prompt": "<5>", "model": "gpt-4"}),
    )
    .await;
    assert_eq!(assert_error(status, &body, StatusCode::NOT_FOUND), "model");
    let (status, body) = call(&s.app, "GET", "/v2/nothing", None).await;
    assert_error(status, &body, StatusCode::NOT_FOUND);
    // 405: a known path with another method.
    let (status, body) = call(&s.app, "GET", "/v1/completions", None).await;
    assert_error(status, &body, StatusCode::METHOD_NOT_ALLOWED);
    // 413: a body over the limit (4 KiB here).
    let big = json!({"prompt": "<5> ".repeat(2000)})
        .to_string()
        .into_bytes();
    let (status, _, bytes) = call_raw(
        &s.app,
        request("POST", "/v1/completions", Some(big), Some(KEY)),
    )
    .await;
    let body: Value = serde_json::from_slice(&bytes).unwrap();
    assert_error(status, &body, StatusCode::PAYLOAD_TOO_LARGE);
    // 503 while the model loads and after shutdown began.
    let loading = AppState::new(ServerConfig {
        served_model_name: "mock".into(),
        api_key: None,
        max_body_bytes: 4096,
        reasoning_parser: Choice::Off,
        tool_call_parser: Choice::Auto,
        template: Default::default(),
    });
    let app = router(loading);
    for (method, path) in [
        ("GET", "/health"),
        ("GET", "/v1/models"),
        ("POST", "/v1/completions"),
    ] {
        let body = (method == "POST").then(|| json!({"prompt": "<5>"}));
        let (status, response) = call(&app, method, path, body).await;
        assert_error(status, &response, StatusCode::SERVICE_UNAVAILABLE);
    }
    s.state.begin_shutdown();
    let (status, body) = post("/v1/completions", json!({"prompt": "<5>"})).await;
    assert_error(status, &body, StatusCode::SERVICE_UNAVAILABLE);
    let (status, body) = call(&s.app, "GET", "/health", None).await;
    assert_error(status, &body, StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_answers_429_with_retry_after() {
    // 20 ms a step: the two long requests below stay pending for about two seconds.
    let s = server_over(2, 1 << 20, Duration::from_millis(20));
    // Two long requests fill the queue.
    let long = || Request {
        prompt: vec![5, 6, 7],
        sampling: SamplingParams::greedy(),
        stop: StopConditions {
            max_tokens: MAX_MODEL_LEN - 4,
            ignore_eos: true,
            ..StopConditions::default()
        },
        n: 1,
        speculation: None,
        constraint: None,
        thinking: None,
        prediction: None,
        cache_salt: None,
        pooling: None,
    };
    let busy = [
        s.engine.submit(long()).unwrap(),
        s.engine.submit(long()).unwrap(),
    ];
    let body = json!({"prompt": "<5>", "max_tokens": 2})
        .to_string()
        .into_bytes();
    let (status, headers, bytes) = call_raw(
        &s.app,
        request("POST", "/v1/completions", Some(body.clone()), Some(KEY)),
    )
    .await;
    let value: Value = serde_json::from_slice(&bytes).unwrap();
    assert_error(status, &value, StatusCode::TOO_MANY_REQUESTS);
    // Routers see the two requests as this replica's load.
    let (_, _, bytes) = call_raw(&s.app, request("GET", "/get_load", None, None)).await;
    let load: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(load, json!({"load": 2}));
    // The engine thread admits them a moment after they were accepted.
    let gauge = |metrics: &str, name: &str| -> f64 {
        let prefix = format!("{name}{{model_name=\"mock\"}} ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .and_then(|v| v.parse().ok())
            .unwrap_or(-1.0)
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (_, _, metrics) = call_raw(&s.app, request("GET", "/metrics", None, Some(KEY))).await;
        let metrics = String::from_utf8(metrics).unwrap();
        let queued = gauge(&metrics, "vllm:num_requests_running")
            + gauge(&metrics, "vllm:num_requests_waiting");
        let usage = gauge(&metrics, "vllm:kv_cache_usage_perc");
        if queued == 2.0 && usage > 0.0 && usage <= 1.0 {
            break;
        }
        assert!(Instant::now() < deadline, "{metrics}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        headers[header::RETRY_AFTER]
            .to_str()
            .unwrap()
            .parse::<u32>()
            .unwrap()
            >= 1
    );
    // Once they are gone the server accepts again.
    drop(busy);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, _, _) = call_raw(
            &s.app,
            request("POST", "/v1/completions", Some(body.clone()), Some(KEY)),
        )
        .await;
        if status == StatusCode::OK {
            break;
        }
        assert!(Instant::now() < deadline, "still refused: {status}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
