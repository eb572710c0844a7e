//! The HTTP router over an engine with the mock backend, driven with
//! `tower::ServiceExt::oneshot`: every endpoint, SSE framing, usage accounting, `n > 1`, seeds,
//! and a client that disconnects mid-stream (its request is cancelled and its blocks freed).

use std::time::{Duration, Instant};

use axum::http::{header, StatusCode};
use engine::MockBackend;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

use super::mock_server::{
    assert_error, call, call_raw, request, server_over, server_with, Server, KEY, MAX_MODEL_LEN,
    VOCAB,
};

fn server() -> Server {
    server_with(64, 1 << 20)
}

/// The `data:` payloads of an SSE body, checking the framing on the way.
fn sse_payloads(bytes: &[u8]) -> Vec<String> {
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    assert!(
        text.ends_with("\n\n"),
        "events end with a blank line: {text:?}"
    );
    let payloads: Vec<String> = text
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|event| {
            event
                .strip_prefix("data: ")
                .unwrap_or_else(|| panic!("not a data event: {event:?}"))
                .to_string()
        })
        .collect();
    assert_eq!(payloads.last().map(String::as_str), Some("[DONE]"));
    payloads
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_models_tokenize_detokenize_and_metrics() {
    let s = server();
    let (status, body) = call(&s.app, "GET", "/health", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = call(&s.app, "GET", "/v1/models", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["data"][0]["id"], "mock");
    assert_eq!(body["data"][0]["max_model_len"], MAX_MODEL_LEN);
    let (status, body) = call(&s.app, "GET", "/v1/models/mock", None).await;
    assert_eq!(
        (status, body["id"].as_str()),
        (StatusCode::OK, Some("mock"))
    );
    let (status, body) = call(&s.app, "GET", "/v1/models/other", None).await;
    assert_error(status, &body, StatusCode::NOT_FOUND);

    let (status, body) = call(
        &s.app,
        "POST",
        "/tokenize",
        Some(json!({"prompt": "<5> <6> <7>"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["tokens"], json!([5, 6, 7]));
    assert_eq!(body["count"], 3);
    let (status, body) = call(
        &s.app,
        "POST",
        "/detokenize",
        Some(json!({"tokens": [5, 6, 7]})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["prompt"], "<5> <6> <7>");
    let (status, body) = call(
        &s.app,
        "POST",
        "/detokenize",
        Some(json!({"tokens": [5, 999]})),
    )
    .await;
    assert_eq!(
        assert_error(status, &body, StatusCode::BAD_REQUEST),
        "tokens"
    );
    let (status, body) = call(
        &s.app,
        "POST",
        "/tokenize",
        Some(json!({"messages": [{"role": "user", "content": "<9>"}]})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["tokens"], json!([2, 9, 3, 4]));

    let (status, _) = call(
        &s.app,
        "POST",
        "/v1/completions",
        Some(json!({"prompt": "<5>", "max_tokens": 2})),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _, _) = call_raw(&s.app, request("GET", "/metrics", None, None)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "/metrics needs the key");
    let (status, _, text) = call_raw(&s.app, request("GET", "/metrics", None, Some(KEY))).await;
    assert_eq!(status, StatusCode::OK);
    let text = String::from_utf8(text).unwrap();
    for name in [
        "thicket_http_requests_total",
        "thicket_http_request_duration_seconds",
        "thicket_kv_blocks_in_use",
        "thicket_engine_",
        "thicket_engine_step_phase_seconds{phase=\"forward\"",
        "thicket_engine_step_phase_seconds{phase=\"other\"",
        "thicket_engine_step_phase_seconds{phase=\"lookup\"",
        // What routers read, under vLLM's names.
        "vllm:num_requests_running{model_name=\"mock\"} 0\n",
        "vllm:num_requests_waiting{model_name=\"mock\"} 0\n",
        "vllm:kv_cache_usage_perc{model_name=\"mock\"} 0\n",
        "vllm:gpu_cache_usage_perc{model_name=\"mock\"} 0\n",
        "vllm:prefix_cache_queries_total{model_name=\"mock\"} 1\n",
        "vllm:prefix_cache_hits_total{model_name=\"mock\"} 0\n",
        "vllm:cache_config_info{model_name=\"mock\",block_size=\"4\",num_gpu_blocks=\"64\"} 1\n",
        "# TYPE vllm:num_requests_running gauge",
    ] {
        assert!(text.contains(name), "{name} missing from /metrics:\n{text}");
    }
    // `/get_load` and `/version` need no key (routers poll them).
    let (status, _, bytes) = call_raw(&s.app, request("GET", "/get_load", None, None)).await;
    let body: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!((status, body), (StatusCode::OK, json!({"load": 0})));
    let (status, _, bytes) = call_raw(&s.app, request("GET", "/version", None, None)).await;
    let body: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["version"], env!("CARGO_PKG_VERSION"));
    assert!(
        text.contains(
            r#"thicket_http_requests_total{method="POST",path="/v1/completions",status="200"}"#
        ),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_count_usage_over_every_choice_and_prompt() {
    let s = server();
    let prompt: Vec<u32> = vec![5, 6, 7, 8];
    let (status, body) = call(
        &s.app,
        "POST",
        "/v1/completions",
        Some(json!({"model": "mock", "prompt": prompt, "max_tokens": 6, "n": 3, "temperature": 0})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["object"], "text_completion");
    assert!(body["id"].as_str().unwrap().starts_with("cmpl-"));
    let choices = body["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["finish_reason"], "length");
        // Greedy: every choice is the mock model's continuation.
        assert_eq!(c["text"], choices[0]["text"]);
    }
    // The text is the mock model's greedy continuation.
    let mut tokens = prompt.clone();
    for _ in 0..6 {
        tokens.push(MockBackend::next_token(&tokens, VOCAB));
    }
    let want = s
        .engine
        .tokenizer()
        .decode(&tokens[prompt.len()..])
        .unwrap();
    assert_eq!(choices[0]["text"].as_str().unwrap().trim(), want.trim());
    // The prompt counts once, every choice's tokens count.
    assert_eq!(body["usage"]["prompt_tokens"], 4);
    assert_eq!(body["usage"]["completion_tokens"], 18);
    assert_eq!(body["usage"]["total_tokens"], 22);

    // Two prompts, two choices each; echo puts the prompt first.
    let (status, body) = call(
        &s.app,
        "POST",
        "/v1/completions",
        Some(json!({"prompt": ["<5> <6>", "<7> <8> <9>"], "max_tokens": 3, "n": 2, "echo": true, "temperature": 0})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let choices = body["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 4);
    assert!(choices[1]["text"].as_str().unwrap().starts_with("<5> <6>"));
    assert!(choices[2]["text"]
        .as_str()
        .unwrap()
        .starts_with("<7> <8> <9>"));
    assert_eq!(body["usage"]["prompt_tokens"], 5);
    assert_eq!(body["usage"]["completion_tokens"], 12);

    // Stop tokens and logprobs.
    let stop_token = MockBackend::next_token(&[5, 6, 7, 8], VOCAB);
    let (status, body) = call(
        &s.app,
        "POST",
        "/v1/completions",
        Some(json!({"prompt": [5, 6, 7, 8], "max_tokens": 5, "stop_token_ids": [stop_token], "temperature": 0})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    assert_eq!(body["choices"][0]["stop_reason"], stop_token);
    assert_eq!(body["usage"]["completion_tokens"], 1);
    let (status, body) = call(
        &s.app,
        "POST",
        "/v1/completions",
        Some(json!({"prompt": [5, 6], "max_tokens": 4, "logprobs": 2, "temperature": 0})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let lp = &body["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), 4);
    assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), 4);
    assert!(lp["top_logprobs"][0].as_object().unwrap().len() <= 2);
    assert!(lp["token_logprobs"][0].as_f64().unwrap() <= 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_streams_the_same_text_as_it_returns_whole() {
    let s = server();
    let messages = json!([{"role": "system", "content": "<8>"}, {"role": "user", "content": [{"type": "text", "text": "<9> <10>"}]}]);
    let (status, whole) = call(
        &s.app,
        "POST",
        "/v1/chat/completions",
        Some(json!({"messages": messages, "max_completion_tokens": 7, "temperature": 0, "n": 2})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{whole}");
    assert_eq!(whole["object"], "chat.completion");
    assert_eq!(whole["choices"][1]["message"]["role"], "assistant");
    assert_eq!(whole["usage"]["completion_tokens"], 14);

    let body = json!({"messages": messages, "max_tokens": 7, "temperature": 0, "n": 2, "stream": true, "stream_options": {"include_usage": true}});
    let (status, headers, bytes) = call_raw(
        &s.app,
        request(
            "POST",
            "/v1/chat/completions",
            Some(body.to_string().into_bytes()),
            Some(KEY),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(headers[header::CONTENT_TYPE]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let payloads = sse_payloads(&bytes);
    let chunks: Vec<Value> = payloads[..payloads.len() - 1]
        .iter()
        .map(|p| serde_json::from_str(p).unwrap())
        .collect();
    let mut text = [String::new(), String::new()];
    let mut finished = [0, 0];
    let mut roles = [0, 0];
    let id = chunks[0]["id"].clone();
    for chunk in &chunks[..chunks.len() - 1] {
        assert_eq!(chunk["object"], "chat.completion.chunk");
        assert_eq!(chunk["id"], id, "one id for the whole stream");
        assert!(chunk["usage"].is_null() && chunk.get("usage").is_some());
        let choice = &chunk["choices"][0];
        let i = choice["index"].as_u64().unwrap() as usize;
        assert_eq!(finished[i], 0, "chunk after the finish of choice {i}");
        if choice["delta"]["role"] == "assistant" {
            roles[i] += 1;
        }
        if let Some(t) = choice["delta"]["content"].as_str() {
            text[i].push_str(t);
        }
        if !choice["finish_reason"].is_null() {
            finished[i] += 1;
        }
    }
    assert_eq!((roles, finished), ([1, 1], [1, 1]));
    for i in 0..2 {
        assert_eq!(
            text[i],
            whole["choices"][i]["message"]["content"].as_str().unwrap()
        );
    }
    let usage_chunk = chunks.last().unwrap();
    assert_eq!(usage_chunk["choices"], json!([]));
    for field in ["prompt_tokens", "completion_tokens", "total_tokens"] {
        assert_eq!(
            usage_chunk["usage"][field], whole["usage"][field],
            "{field}"
        );
    }
    // The second run of the same prompt reads it from the prefix cache.
    assert!(usage_chunk["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64() > Some(0));

    // A completions stream without include_usage carries no usage at all.
    let body = json!({"prompt": "<5>", "max_tokens": 3, "stream": true});
    let (_, _, bytes) = call_raw(
        &s.app,
        request(
            "POST",
            "/v1/completions",
            Some(body.to_string().into_bytes()),
            Some(KEY),
        ),
    )
    .await;
    let payloads = sse_payloads(&bytes);
    for p in &payloads[..payloads.len() - 1] {
        let chunk: Value = serde_json::from_str(p).unwrap();
        assert!(chunk.get("usage").is_none(), "{chunk}");
        assert_eq!(chunk["object"], "text_completion");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeds_reproduce_sampled_output() {
    let s = server();
    let body = json!({"prompt": "<5> <6>", "max_tokens": 12, "temperature": 1.0, "seed": 42});
    let (_, a) = call(&s.app, "POST", "/v1/completions", Some(body.clone())).await;
    let (_, b) = call(&s.app, "POST", "/v1/completions", Some(body)).await;
    assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"]);
    let mut texts = std::collections::HashSet::new();
    for seed in 0..6 {
        let body = json!({"prompt": "<5> <6>", "max_tokens": 12, "temperature": 1.0, "seed": seed});
        let (_, v) = call(&s.app, "POST", "/v1/completions", Some(body)).await;
        texts.insert(v["choices"][0]["text"].as_str().unwrap().to_string());
    }
    assert!(texts.len() > 1, "different seeds gave the same text");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_mid_stream_frees_its_blocks() {
    // 20 ms a step: each request would need about two seconds to finish on its own.
    let s = server_over(64, 1 << 20, Duration::from_millis(20));
    let mut bodies = Vec::new();
    for i in 0..6u32 {
        let body = json!({"prompt": [5 + i, 6, 7], "max_tokens": MAX_MODEL_LEN - 4, "ignore_eos": true, "stream": true});
        let response = s
            .app
            .clone()
            .oneshot(request(
                "POST",
                "/v1/completions",
                Some(body.to_string().into_bytes()),
                Some(KEY),
            ))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let mut body = response.into_body();
        // Read a few events, then go away.
        for _ in 0..3 {
            let frame = body.frame().await.unwrap().unwrap();
            assert!(frame.is_data());
        }
        bodies.push(body);
    }
    let running = tokio::task::block_in_place(|| s.engine.stats().unwrap());
    assert!(
        running.cache.in_use > 0 && running.scheduler.running > 0,
        "{running:?}"
    );
    drop(bodies);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stats = tokio::task::block_in_place(|| s.engine.stats().unwrap());
        if stats.cache.in_use == 0 && stats.scheduler.running == 0 && s.engine.pending() == 0 {
            // Cancelled, not finished: freed within a step or two of the disconnect.
            let steps = stats.scheduler.steps - running.scheduler.steps;
            assert!(steps <= 3, "{steps} steps ran after the clients left");
            break;
        }
        assert!(Instant::now() < deadline, "blocks still in use: {stats:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
