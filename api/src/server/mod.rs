//! The OpenAI-compatible HTTP server: the shared state every handler sees (the engine once
//! the model is loaded, the served name, the API key, the Prometheus recorder), the router
//! with its middleware (API key, body limit, HTTP metrics, JSON 404/405), and the small
//! endpoints: health, models, metrics, tokenize, detokenize. Generation lives in
//! [`generate`], streaming in [`stream`], the `serve` command in [`serve_cmd`], what routers
//! read (vLLM-named load metrics, `/get_load`, `/version`) in `load`.

pub mod answer;
pub mod body;
pub mod completion_bodies;
pub mod convert;
pub mod error;
pub mod generate;
mod load;
pub mod messages_api;
pub mod prediction;
pub mod protocol;
pub mod responses_api;
pub mod stream;
pub mod tools;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{header, HeaderValue, Method, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use engine::handle::EngineHandle;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use sha2::{Digest, Sha256};

use body::JsonBody;
use error::{ApiError, ApiResult};
use protocol::{DetokenizeRequest, ModelCard, TokenizeRequest};

/// Largest request body accepted, in bytes.
pub const DEFAULT_MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

/// How the server presents itself.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The name clients use in `model`.
    pub served_model_name: String,
    /// Required bearer token, if any.
    pub api_key: Option<String>,
    /// Largest request body.
    pub max_body_bytes: usize,
}

/// State shared by every handler. The engine itself runs on its own thread; this holds only
/// its handle, set once the model has loaded.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Shared>,
}

struct Shared {
    config: ServerConfig,
    engine: OnceLock<EngineHandle>,
    shutting_down: AtomicBool,
    metrics: PrometheusHandle,
    created: u64,
    api_key_digest: Option<[u8; 32]>,
    responses: Arc<responses_api::store::ResponseStore>,
}

/// The process-wide Prometheus recorder (installed on first use).
pub fn prometheus() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new().build_recorder();
            let handle = recorder.handle();
            if metrics::set_global_recorder(recorder).is_err() {
                tracing::warn!("a metrics recorder was already installed; /metrics stays empty");
            }
            handle
        })
        .clone()
}

impl AppState {
    /// State of a server whose engine is still loading, keeping stored responses under the
    /// default bounds.
    pub fn new(config: ServerConfig) -> Self {
        Self::with_response_store(config, responses_api::store::ResponseStore::default())
    }

    /// [`AppState::new`] keeping stored responses (`/v1/responses`) in `responses`.
    pub fn with_response_store(
        config: ServerConfig,
        responses: responses_api::store::ResponseStore,
    ) -> Self {
        let api_key_digest = config
            .api_key
            .as_ref()
            .map(|k| Sha256::digest(k.as_bytes()).into());
        let metrics = prometheus();
        describe_metrics();
        Self {
            inner: Arc::new(Shared {
                config,
                engine: OnceLock::new(),
                shutting_down: AtomicBool::new(false),
                metrics,
                created: completion_bodies::unix_now(),
                api_key_digest,
                responses: Arc::new(responses),
            }),
        }
    }

    /// The model is loaded: requests are served from now on.
    pub fn set_engine(&self, engine: EngineHandle) {
        let _ = self.inner.engine.set(engine);
    }

    /// Refuse new work from now on (shutdown has begun).
    pub fn begin_shutdown(&self) {
        self.inner.shutting_down.store(true, Ordering::SeqCst);
    }

    /// The engine, or 503 while loading or shutting down.
    pub fn engine(&self) -> ApiResult<&EngineHandle> {
        if self.inner.shutting_down.load(Ordering::SeqCst) {
            return Err(ApiError::unavailable("the server is shutting down"));
        }
        let engine = self
            .inner
            .engine
            .get()
            .ok_or_else(|| ApiError::unavailable("the model is still loading"))?;
        if !engine.is_running() {
            return Err(ApiError::unavailable(
                "the engine has stopped (see the server log)",
            ));
        }
        Ok(engine)
    }

    /// The engine if it was ever started (for shutting it down).
    pub fn started_engine(&self) -> Option<&EngineHandle> {
        self.inner.engine.get()
    }

    /// Where stored responses are kept.
    pub fn response_store(&self) -> Arc<responses_api::store::ResponseStore> {
        Arc::clone(&self.inner.responses)
    }

    /// The served model name.
    pub fn model_name(&self) -> &str {
        &self.inner.config.served_model_name
    }

    /// 404 unless `model` is absent or the served name.
    pub fn check_model(&self, model: Option<&str>) -> ApiResult<()> {
        match model {
            Some(m) if !m.is_empty() && m != self.model_name() => {
                Err(ApiError::unknown_model(m, self.model_name()))
            }
            _ => Ok(()),
        }
    }

    fn key_matches(&self, presented: Option<&str>) -> bool {
        let Some(expected) = &self.inner.api_key_digest else {
            return true;
        };
        let Some(presented) = presented else {
            return false;
        };
        // Compare digests in constant time: neither the key's content nor its length leaks.
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        digest
            .iter()
            .zip(expected)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
    }
}

/// The whole HTTP application over `state`.
pub fn router(state: AppState) -> Router {
    let limit = state.inner.config.max_body_bytes;
    let protected = Router::new()
        .route("/v1/completions", post(generate::completions))
        .route("/v1/chat/completions", post(generate::chat_completions))
        .route("/v1/responses", post(responses_api::create))
        .route("/v1/messages", post(messages_api::create))
        .route(
            "/v1/messages/count_tokens",
            post(messages_api::count_tokens),
        )
        .route(
            "/v1/responses/{id}",
            get(responses_api::get).delete(responses_api::delete),
        )
        .route("/v1/models", get(models))
        .route("/v1/models/{model}", get(model))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/metrics", get(render_metrics))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            require_api_key,
        ));
    Router::new()
        .route("/health", get(health))
        .route("/get_load", get(load::get_load))
        .route("/version", get(load::version))
        .merge(protected)
        .fallback(not_found)
        .method_not_allowed_fallback(wrong_method)
        .layer(DefaultBodyLimit::max(limit))
        .layer(middleware::from_fn(record_http_metrics))
        .with_state(state)
}

fn describe_metrics() {
    engine::metrics::describe();
}

async fn require_api_key(State(state): State<AppState>, request: Request, next: Next) -> Response {
    // `Authorization: Bearer <key>` (OpenAI's clients) or `x-api-key: <key>` (Anthropic's).
    let headers = request.headers();
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()))
        .map(str::trim);
    if state.key_matches(presented) {
        next.run(request).await
    } else if request.uri().path().starts_with(messages_api::PATH_PREFIX) {
        messages_api::MessagesError(ApiError::unauthorized()).into_response()
    } else {
        ApiError::unauthorized().into_response()
    }
}

async fn record_http_metrics(request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = request.method().to_string();
    let path = request
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "unmatched".to_string());
    let response = next.run(request).await;
    let status = response.status().as_u16().to_string();
    metrics::counter!(engine::metrics::http::HTTP_REQUESTS, "method" => method.clone(), "path" => path.clone(), "status" => status)
        .increment(1);
    metrics::histogram!(engine::metrics::http::HTTP_LATENCY, "method" => method, "path" => path)
        .record(started.elapsed().as_secs_f64());
    response
}

async fn not_found(method: Method, uri: Uri) -> ApiError {
    ApiError::unknown_path(method.as_str(), uri.path())
}

async fn wrong_method(method: Method, uri: Uri) -> ApiError {
    ApiError::wrong_method(method.as_str(), uri.path())
}

async fn health(State(state): State<AppState>) -> ApiResult<Json<serde_json::Value>> {
    state.engine()?;
    Ok(Json(serde_json::json!({"status": "ok"})))
}

async fn render_metrics(State(state): State<AppState>) -> Response {
    let handle = &state.inner.metrics;
    handle.run_upkeep();
    let mut text = handle.render();
    text.push_str(&load::vllm_metrics(&state));
    let mut response = text.into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    response
}

fn card(state: &AppState, engine: &EngineHandle) -> ModelCard {
    ModelCard {
        id: state.model_name().to_string(),
        object: "model",
        created: state.inner.created,
        owned_by: "thicket",
        max_model_len: engine.limits().max_model_len,
    }
}

async fn models(State(state): State<AppState>) -> ApiResult<Json<serde_json::Value>> {
    let engine = state.engine()?;
    Ok(Json(serde_json::json!({
        "object": "list",
        "data": [card(&state, engine)],
    })))
}

async fn model(
    State(state): State<AppState>,
    axum::extract::Path(name): axum::extract::Path<String>,
) -> ApiResult<Json<ModelCard>> {
    let engine = state.engine()?;
    if name != state.model_name() {
        return Err(ApiError::unknown_model(&name, state.model_name()));
    }
    Ok(Json(card(&state, engine)))
}

async fn tokenize(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<TokenizeRequest>,
) -> ApiResult<Json<serde_json::Value>> {
    let engine = state.engine()?;
    state.check_model(body.model.as_deref())?;
    let tokenizer = engine.tokenizer();
    let tokens = match (body.prompt, body.messages) {
        (Some(prompt), None) => {
            if body.add_special_tokens.unwrap_or(true) {
                tokenizer.encode(&prompt)
            } else {
                tokenizer.encode_plain(&prompt)
            }
        }
        (None, Some(messages)) => {
            let text = generate::render_messages(tokenizer, &messages, &[])?;
            tokenizer.encode_plain(&text)
        }
        _ => {
            return Err(ApiError::invalid(
                "prompt",
                "give exactly one of prompt or messages",
            ))
        }
    }
    .map_err(|e| ApiError::invalid("prompt", e.to_string()))?;
    Ok(Json(serde_json::json!({
        "count": tokens.len(),
        "max_model_len": engine.limits().max_model_len,
        "tokens": tokens,
    })))
}

async fn detokenize(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<DetokenizeRequest>,
) -> ApiResult<Json<serde_json::Value>> {
    let engine = state.engine()?;
    state.check_model(body.model.as_deref())?;
    let vocab = engine.limits().vocab_size;
    if let Some(bad) = body.tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::invalid(
            "tokens",
            format!("token id {bad} outside the vocabulary of {vocab}"),
        ));
    }
    let text = engine
        .tokenizer()
        .decode(&body.tokens)
        .map_err(|e| ApiError::invalid("tokens", e.to_string()))?;
    Ok(Json(serde_json::json!({ "prompt": text })))
}
