//! The in-process server the HTTP tests drive: the router over an engine on the mock backend
//! (wrapped in a backend of the test's choosing), its tokenizer and chat template (if any) in
//! a temporary directory; requests sent with `tower::ServiceExt::oneshot`, with or without the
//! API key; and OpenAI's error shape checked.

use std::sync::Arc;
use std::time::Duration;

use api::server::{router, AppState, Choice, ServerConfig};
use axum::body::Body;
use axum::http::{header, Request as HttpRequest, StatusCode};
use axum::Router;
use engine::handle::EngineHandle;
use engine::model::testing::write_tiny_tokenizer;
use engine::model::tokenizer::ModelTokenizer;
use engine::{
    Backend, CostCurve, EngineConfig, ManagerConfig, MockBackend, SchedulerConfig,
    SpeculationConfig, TreeBatch,
};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

pub(crate) const VOCAB: usize = 64;
pub(crate) const KEY: &str = "test-key";
pub(crate) const MAX_MODEL_LEN: usize = 96;
const CHATML: &str = "{% for m in messages %}<2> {{ m.content }} <3> {% endfor %}{% if add_generation_prompt %}<4> {% endif %}";

/// The router, its state and engine, and the directory holding its tokenizer (kept while the
/// server lives).
pub(crate) struct Server {
    pub(crate) app: Router,
    pub(crate) state: AppState,
    pub(crate) engine: EngineHandle,
    pub(crate) _dir: tempfile::TempDir,
}

/// The mock model, slowed to `step` per forward so requests outlive a client's first reads.
struct SlowBackend {
    inner: MockBackend,
    step: Duration,
}

impl Backend for SlowBackend {
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }

    fn num_slots(&self) -> usize {
        self.inner.num_slots()
    }

    fn describe(&self) -> String {
        format!("slow {}", self.inner.describe())
    }

    fn forward(&mut self, batch: &TreeBatch) -> engine::Result<Vec<Vec<f32>>> {
        std::thread::sleep(self.step);
        self.inner.forward(batch)
    }

    fn move_kv(&mut self, moves: &[kvcache::KvMove]) -> engine::Result<()> {
        self.inner.move_kv(moves)
    }

    fn returns_states(&self) -> bool {
        self.inner.returns_states()
    }
}

/// The mock model behind the API key `KEY`, answering at once.
pub(crate) fn server_with(max_pending: usize, max_body_bytes: usize) -> Server {
    server_over(max_pending, max_body_bytes, Duration::ZERO)
}

/// `server_with`, each forward taking `step`.
pub(crate) fn server_over(max_pending: usize, max_body_bytes: usize, step: Duration) -> Server {
    let slow = move |inner| -> Box<dyn Backend> { Box::new(SlowBackend { inner, step }) };
    mock_server(slow, Some(CHATML), max_pending, Some(KEY), max_body_bytes)
}

/// The router over an engine on `backend` (given the mock model to wrap: 64 tokens, 64 blocks
/// of 4), its tokenizer with `chat_template` (or none) in a temporary directory, guarded by
/// `api_key`.
pub(crate) fn mock_server(
    backend: impl FnOnce(MockBackend) -> Box<dyn Backend>,
    chat_template: Option<&str>,
    max_pending: usize,
    api_key: Option<&str>,
    max_body_bytes: usize,
) -> Server {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_tokenizer(dir.path(), VOCAB).unwrap();
    if let Some(chat_template) = chat_template {
        std::fs::write(
            dir.path().join("tokenizer_config.json"),
            json!({ "chat_template": chat_template }).to_string(),
        )
        .unwrap();
    }
    let tokenizer = Arc::new(ModelTokenizer::from_hf_dir(dir.path(), Vec::new()).unwrap());
    let kv = ManagerConfig {
        num_blocks: 64,
        block_size: 4,
        prefix_caching: true,
        watermark: 0.0,
        window: None,
    };
    let config = EngineConfig {
        scheduler: SchedulerConfig {
            max_num_batched_tokens: 64,
            max_num_seqs: 8,
            max_model_len: MAX_MODEL_LEN,
            kv,
        },
        max_pending,
        speculation: SpeculationConfig {
            cost: CostCurve::flat(),
            ..SpeculationConfig::default()
        },
        kv_prefault: false,
        state_snapshots: Default::default(),
    };
    let backend = backend(MockBackend::new(VOCAB, kv.num_blocks * kv.block_size));
    let (engine, _) = engine::spawn_with_backend(backend, tokenizer, Vec::new(), config).unwrap();
    let state = AppState::new(ServerConfig {
        served_model_name: "mock".into(),
        api_key: api_key.map(Into::into),
        max_body_bytes,
        reasoning_parser: Choice::Off,
        tool_call_parser: Choice::Auto,
        template: Default::default(),
    });
    state.set_engine(engine.clone());
    Server {
        app: router(state.clone()),
        state,
        engine,
        _dir: dir,
    }
}

pub(crate) fn request(
    method: &str,
    path: &str,
    body: Option<Vec<u8>>,
    key: Option<&str>,
) -> HttpRequest<Body> {
    let mut builder = HttpRequest::builder().method(method).uri(path);
    if let Some(key) = key {
        builder = builder.header(header::AUTHORIZATION, format!("Bearer {key}"));
    }
    if body.is_some() {
        builder = builder.header(header::CONTENT_TYPE, "application/json");
    }
    builder
        .body(body.map(Body::from).unwrap_or_else(Body::empty))
        .unwrap()
}

/// Sends one request; returns the status, the headers and the body.
pub(crate) async fn call_raw(
    app: &Router,
    req: HttpRequest<Body>,
) -> (StatusCode, header::HeaderMap, Vec<u8>) {
    let response = app.clone().oneshot(req).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, headers, bytes.to_vec())
}

/// Sends one request with the server's key; returns the status and the body as JSON (or as a
/// JSON string when it is not JSON).
pub(crate) async fn call(
    app: &Router,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    call_with_key(app, method, path, body, Some(KEY)).await
}

/// `call` with `key` (or none) as the bearer token.
pub(crate) async fn call_with_key(
    app: &Router,
    method: &str,
    path: &str,
    body: Option<Value>,
    key: Option<&str>,
) -> (StatusCode, Value) {
    let body = body.map(|b| b.to_string().into_bytes());
    let (status, _, bytes) = call_raw(app, request(method, path, body, key)).await;
    let value = serde_json::from_slice(&bytes)
        .unwrap_or(Value::String(String::from_utf8_lossy(&bytes).into()));
    (status, value)
}

/// Asserts an OpenAI-shaped error with `status`; returns its `param`.
pub(crate) fn assert_error(status: StatusCode, body: &Value, want: StatusCode) -> String {
    assert_eq!(status, want, "{body}");
    let error = &body["error"];
    assert!(
        error["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    assert!(error["type"].is_string(), "{body}");
    assert!(
        error.get("param").is_some() && error.get("code").is_some(),
        "{body}"
    );
    error["param"].as_str().unwrap_or_default().to_string()
}
