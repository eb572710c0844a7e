//! Engine faults seen through the HTTP router: a forward that fails (injected by a test-only
//! backend) fails the requests of that step with a 5xx and the engine keeps serving, with no
//! KV block leaked; a panic in the engine thread turns `/health` to 503 and fails the
//! requests in flight and every later one at once instead of hanging them. The Responses and
//! Messages routes report a failed step in their own shapes, as a body or as a stream's
//! `error` event.

use std::time::Duration;

use axum::http::StatusCode;
use axum::Router;
use engine::handle::EngineHandle;
use engine::{Backend, MockBackend, TreeBatch};
use serde_json::{json, Value};

use super::mock_server::{call_with_key, mock_server, Server};

/// A prompt starting with this token makes the forward fail.
const FAIL: u32 = 13;
/// A prompt starting with this token makes the forward panic.
const PANIC: u32 = 17;
/// A forward that reaches this position fails: a long enough answer fails part way.
const FAIL_AT: usize = 24;

/// The mock model with faults keyed on the first prompt token, slowed a little per step.
struct FaultyBackend {
    inner: MockBackend,
}

impl Backend for FaultyBackend {
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }

    fn num_slots(&self) -> usize {
        self.inner.num_slots()
    }

    fn describe(&self) -> String {
        format!("faulty {}", self.inner.describe())
    }

    fn forward(&mut self, batch: &TreeBatch) -> engine::Result<Vec<Vec<f32>>> {
        std::thread::sleep(Duration::from_millis(2));
        let starts_with = |token: u32| {
            batch
                .token_ids
                .iter()
                .zip(&batch.positions)
                .any(|(&t, &p)| t == token && p == 0)
        };
        if starts_with(PANIC) {
            panic!("injected panic in the forward");
        }
        if starts_with(FAIL) || batch.positions.iter().any(|&p| p as usize >= FAIL_AT) {
            return Err(engine::Error::InvalidBatch("injected fault".into()));
        }
        self.inner.forward(batch)
    }

    fn move_kv(&mut self, moves: &[kvcache::KvMove]) -> engine::Result<()> {
        self.inner.move_kv(moves)
    }
}

fn faulty_server() -> (Router, EngineHandle, tempfile::TempDir) {
    let faulty = |inner| -> Box<dyn Backend> { Box::new(FaultyBackend { inner }) };
    // A chat template of the bare contents, so a chat-shaped prompt starts with its first
    // message's first token (the fault keys): the Responses and Messages routes need one.
    let template = "{% for message in messages %}{{ message.content }} {% endfor %}";
    let Server {
        app, engine, _dir, ..
    } = mock_server(faulty, Some(template), 64, None, 1 << 20);
    (app, engine, _dir)
}

/// One request without a key (the server asks for none).
async fn call(app: &Router, method: &str, path: &str, body: Option<Value>) -> (StatusCode, Value) {
    call_with_key(app, method, path, body, None).await
}

/// The engine runs, holds no request and no KV block: nothing a failed step touched leaked.
fn assert_nothing_left(engine: &EngineHandle) {
    let stats = engine.stats().expect("the engine is running");
    assert_eq!(
        stats.cache.in_use, 0,
        "no KV block leaked: {:?}",
        stats.cache
    );
    assert_eq!(stats.requests, 0);
}

fn completion(first: u32, max_tokens: usize) -> Value {
    json!({"prompt": [first, 5, 6, 7, 8], "max_tokens": max_tokens, "temperature": 0})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_step_fails_its_requests_and_the_engine_keeps_serving() {
    let (app, engine, _dir) = faulty_server();
    let (status, body) = call(&app, "POST", "/v1/completions", Some(completion(FAIL, 8))).await;
    assert!(status.is_server_error(), "{status}: {body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("injected fault"), "{body}");

    // The engine goes on: requests after the fault, several at once, complete.
    let mut answers = Vec::new();
    for first in [20, 21, 22, 23] {
        let app = app.clone();
        answers.push(tokio::spawn(async move {
            call(&app, "POST", "/v1/completions", Some(completion(first, 12))).await
        }));
    }
    for answer in answers {
        let (status, body) = answer.await.unwrap();
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["usage"]["completion_tokens"], 12);
    }
    // A streamed request that hits the fault gets an error event, not a hang.
    let (status, body) = call(
        &app,
        "POST",
        "/v1/completions",
        Some(json!({"prompt": [FAIL, 1, 2], "max_tokens": 4, "stream": true})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "the stream opened before the fault");
    let text = body.as_str().unwrap_or_default();
    assert!(
        text.contains("injected fault") && text.contains("\"error\""),
        "{text}"
    );
    assert_nothing_left(&engine);
    assert_eq!(call(&app, "GET", "/health", None).await.0, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_in_the_engine_fails_everything_at_once_and_health_turns_503() {
    let (app, engine, _dir) = faulty_server();
    assert_eq!(call(&app, "GET", "/health", None).await.0, StatusCode::OK);
    // A long request in flight when the engine dies.
    let victim = {
        let app = app.clone();
        tokio::spawn(async move {
            call(&app, "POST", "/v1/completions", Some(completion(30, 80))).await
        })
    };
    tokio::time::sleep(Duration::from_millis(30)).await;
    let (status, body) = call(&app, "POST", "/v1/completions", Some(completion(PANIC, 4))).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    let (status, body) = tokio::time::timeout(Duration::from_secs(30), victim)
        .await
        .expect("the request in flight was failed, not left hanging")
        .unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(!engine.is_running());
    let (status, body) = call(&app, "GET", "/health", None).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    let (status, body) = call(&app, "POST", "/v1/completions", Some(completion(20, 4))).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
}

/// The `data:` payloads of the stream events named `event` in `text`.
fn events(text: &str, event: &str) -> Vec<Value> {
    let marker = format!("event: {event}\n");
    text.split("\n\n")
        .filter(|block| block.starts_with(&marker))
        .filter_map(|block| block.lines().find_map(|l| l.strip_prefix("data: ")))
        .filter_map(|data| serde_json::from_str(data).ok())
        .collect()
}

/// Streams `body` to `path`, which must open (200) and end within 30 s with exactly one
/// `error` event: the stream's text and that event's payload.
async fn failed_stream(app: &Router, path: &str, body: Value) -> (String, Value) {
    let (status, body) =
        tokio::time::timeout(Duration::from_secs(30), call(app, "POST", path, Some(body)))
            .await
            .expect("the stream ended");
    assert_eq!(status, StatusCode::OK, "the stream opened before the fault");
    let text = body.as_str().unwrap_or_default().to_string();
    let mut errors = events(&text, "error");
    assert_eq!(errors.len(), 1, "{text}");
    let error = errors.remove(0);
    (text, error)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_routes_report_a_failed_step_in_their_own_shapes() {
    let (app, engine, _dir) = faulty_server();
    let responses = |first: u32, stream: bool| {
        json!({"model": "mock", "input": format!("<{first}> <5> <6>"), "max_output_tokens": 4,
               "temperature": 0, "stream": stream})
    };
    let messages = |first: u32, stream: bool| {
        json!({"model": "mock", "max_tokens": 4, "temperature": 0, "stream": stream,
               "messages": [{"role": "user", "content": format!("<{first}> <5> <6>")}]})
    };
    // Without the fault both routes answer.
    let (status, body) = call(&app, "POST", "/v1/responses", Some(responses(20, false))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["usage"]["output_tokens"], 4, "{body}");
    let (status, body) = call(&app, "POST", "/v1/messages", Some(messages(20, false))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["usage"]["output_tokens"], 4, "{body}");

    // A body: the 503 every route gives a request the engine could not finish (a router may
    // retry it elsewhere), in the route's shape: Anthropic's name for a 503 is
    // `overloaded_error`.
    let (status, body) = call(&app, "POST", "/v1/responses", Some(responses(FAIL, false))).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("injected fault"), "{body}");
    let (status, body) = call(&app, "POST", "/v1/messages", Some(messages(FAIL, false))).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["type"], "error", "{body}");
    assert_eq!(body["error"]["type"], "overloaded_error", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("injected fault"), "{body}");

    // A stream: opened, then one `error` event, and the stream ends rather than hangs.
    let (text, error) = failed_stream(&app, "/v1/responses", responses(FAIL, true)).await;
    assert_eq!(error["type"], "error", "{text}");
    assert!(error["sequence_number"].is_u64(), "{text}");
    let message = error["message"].as_str().unwrap_or_default();
    assert!(message.contains("injected fault"), "{text}");
    assert!(events(&text, "response.completed").is_empty(), "{text}");
    // Then `response.failed`, last, with the response as far as it got; the id the stream
    // announced is stored as failed, and a failed response cannot be continued.
    let failed = events(&text, "response.failed");
    assert_eq!(failed.len(), 1, "{text}");
    let last = text.trim_end().rsplit("\n\n").next().unwrap_or_default();
    assert!(last.starts_with("event: response.failed\n"), "{text}");
    let response = &failed[0]["response"];
    assert_eq!(response["status"], "failed", "{text}");
    assert_eq!(response["error"]["code"], "server_error", "{text}");
    let message = response["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("injected fault"), "{text}");
    let id = response["id"].as_str().unwrap_or_default();
    assert_eq!(
        events(&text, "response.created")[0]["response"]["id"],
        id,
        "{text}"
    );
    let (status, stored) = call(&app, "GET", &format!("/v1/responses/{id}"), None).await;
    assert_eq!(status, StatusCode::OK, "{stored}");
    assert_eq!(stored["status"], "failed", "{stored}");
    assert_eq!(stored["error"], response["error"], "{stored}");
    let mut next = responses(20, false);
    next["previous_response_id"] = json!(id);
    let (status, body) = call(&app, "POST", "/v1/responses", Some(next)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["param"], "previous_response_id", "{body}");
    // A failure part way through the answer: the message item streamed so far ends
    // `incomplete`, and the failed response holds it.
    let mut long = responses(20, true);
    long["max_output_tokens"] = json!(2 * FAIL_AT);
    let (text, _) = failed_stream(&app, "/v1/responses", long).await;
    let failed = events(&text, "response.failed");
    let output = &failed[0]["response"]["output"];
    assert_eq!(output[0]["status"], "incomplete", "{text}");
    let streamed = output[0]["content"][0]["text"].as_str().unwrap_or_default();
    assert!(!streamed.is_empty(), "{text}");
    let deltas: String = events(&text, "response.output_text.delta")
        .iter()
        .filter_map(|d| d["delta"].as_str().map(str::to_string))
        .collect();
    assert_eq!(deltas, streamed, "{text}");
    let (text, error) = failed_stream(&app, "/v1/messages", messages(FAIL, true)).await;
    assert_eq!(error["type"], "error", "{text}");
    assert_eq!(error["error"]["type"], "overloaded_error", "{text}");
    let message = error["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("injected fault"), "{text}");
    assert!(events(&text, "message_stop").is_empty(), "{text}");

    assert_nothing_left(&engine);
}
