//! The HTTP server: the state every handler sees (the engine once the model is loaded, the
//! served name, the API key, the Prometheus recorder, the stored responses) and the route
//! table. The routes live by protocol: [`openai`] (chat, completions, responses) and
//! [`anthropic`] (messages, count_tokens), both over the one generation path, which knows no
//! protocol: the typed [`request`], its setup and submission in [`pipeline`] with the request
//! settings of [`settings`], and the answer read as parts in [`answer`] (tool calls by
//! [`tools`], thinking by [`reasoning`]); the routes that generate nothing
//! (health, models, tokenize, detokenize, metrics, load) are [`admin`]; what every route
//! passes through (API key, body limit, HTTP metrics, JSON 404/405) is `layers`. The
//! `serve` command that runs it is `crate::commands::serve`.

pub mod adapter;
pub mod admin;
pub mod answer;
pub mod anthropic;
pub mod body;
pub mod error;
pub mod gemma4_thinking;
pub mod harmony;
pub mod harmony_formats;
mod layers;
pub mod openai;
pub mod parts;
pub mod pipeline;
pub mod pooling;
pub mod reasoning;
pub mod request;
pub mod settings;
pub mod tools;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::DefaultBodyLimit;
use axum::middleware;
use axum::routing::{get, post};
use axum::Router;
use engine::encoder::EncoderHandle;
use engine::handle::EngineHandle;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use sha2::{Digest, Sha256};

use error::{ApiError, ApiResult};
use openai::responses::store::ResponseStore;

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
    /// How chat answers are split into thinking and answer (`--reasoning-parser`).
    pub reasoning_parser: Choice<reasoning::ReasoningParser>,
    /// How answers are read for tool calls (`--tool-call-parser`).
    pub tool_call_parser: Choice<Arc<dyn tools::ToolFormat>>,
    /// The chat template and its extra variables (`--chat-template`,
    /// `--default-chat-template-kwargs`).
    pub template: settings::template::TemplateSetup,
}

/// A parser setting: the one the model's chat template implies, none, or a named one.
#[derive(Debug, Clone, Default)]
pub enum Choice<T> {
    /// The one the model's chat template implies (none where it implies none).
    #[default]
    Auto,
    /// None.
    Off,
    /// This one.
    Use(T),
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
    encoder: OnceLock<EncoderHandle>,
    /// The name of the encoder served beside a generating model, when there is one.
    embedding_name: OnceLock<String>,
    shutting_down: AtomicBool,
    metrics: PrometheusHandle,
    created: u64,
    api_key_digest: Option<[u8; 32]>,
    responses: Arc<ResponseStore>,
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
        Self::with_response_store(config, ResponseStore::default())
    }

    /// [`AppState::new`] keeping stored responses (`/v1/responses`) in `responses`.
    pub fn with_response_store(config: ServerConfig, responses: ResponseStore) -> Self {
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
                encoder: OnceLock::new(),
                embedding_name: OnceLock::new(),
                shutting_down: AtomicBool::new(false),
                metrics,
                created: unix_now(),
                api_key_digest,
                responses: Arc::new(responses),
            }),
        }
    }

    /// The model is loaded: requests are served from now on.
    pub fn set_engine(&self, engine: EngineHandle) {
        let _ = self.inner.engine.set(engine);
    }

    /// The model is an encoder: the pooling routes are served from now on, and the
    /// generating ones answer 400.
    pub fn set_encoder(&self, encoder: EncoderHandle) {
        let _ = self.inner.encoder.set(encoder);
    }

    /// An encoder named `name` will serve the pooling routes beside the generating model
    /// (`--embedding-model`): until both have loaded the server is not ready.
    pub fn expect_encoder_beside(&self, name: String) {
        let _ = self.inner.embedding_name.set(name);
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
        let engine = match (self.inner.engine.get(), self.inner.encoder.get()) {
            (Some(engine), _) => engine,
            (None, Some(_)) => {
                return Err(ApiError::invalid(
                    "model",
                    format!(
                        "'{}' is an embedding model: it serves /v1/embeddings, /v1/rerank and \
                         /v1/score, not generation",
                        self.model_name()
                    ),
                ))
            }
            (None, None) => return Err(ApiError::unavailable("the model is still loading")),
        };
        if !engine.is_running() {
            return Err(ApiError::unavailable(
                "the engine has stopped (see the server log)",
            ));
        }
        Ok(engine)
    }

    /// The encoder, 400 when the served model generates and has no encoder, or 503 while
    /// loading or shutting down.
    pub fn encoder(&self) -> ApiResult<&EncoderHandle> {
        if self.inner.shutting_down.load(Ordering::SeqCst) {
            return Err(ApiError::unavailable("the server is shutting down"));
        }
        let beside = self.inner.embedding_name.get().is_some();
        let encoder = match (self.inner.encoder.get(), self.inner.engine.get()) {
            (Some(encoder), _) => encoder,
            (None, _) if beside => return Err(ApiError::unavailable("the model is still loading")),
            (None, Some(_)) => {
                return Err(ApiError::invalid(
                    "model",
                    format!(
                        "'{}' generates text and cannot pool: serve an embedding model \
                         (an encoder such as all-minilm-l6-v2) for embeddings, rerank and score",
                        self.model_name()
                    ),
                ))
            }
            (None, None) => return Err(ApiError::unavailable("the model is still loading")),
        };
        if !encoder.is_running() {
            return Err(ApiError::unavailable(
                "the encoder has stopped (see the server log)",
            ));
        }
        Ok(encoder)
    }

    /// 200 once every model serves requests; 503 while loading, after a stop, or shutting
    /// down.
    pub fn ready(&self) -> ApiResult<()> {
        let beside = self.inner.embedding_name.get().is_some();
        if beside || self.inner.encoder.get().is_some() {
            self.encoder()?;
        }
        if beside || self.inner.encoder.get().is_none() {
            self.engine()?;
        }
        Ok(())
    }

    /// The name the pooling routes answer to: the encoder's beside a generating model, else
    /// the served model's.
    pub fn embedding_model_name(&self) -> &str {
        self.inner
            .embedding_name
            .get()
            .map_or(self.model_name(), String::as_str)
    }

    /// For the pooling routes: 404 unless `model` is absent or the encoder's name; the
    /// generating model's name beside it is a 400 saying which model embeds.
    pub fn check_embedding_model(&self, model: Option<&str>) -> ApiResult<()> {
        let name = self.embedding_model_name();
        match model {
            Some(m) if !m.is_empty() && m != name => {
                if self.inner.embedding_name.get().is_some() && m == self.model_name() {
                    return Err(ApiError::invalid(
                        "model",
                        format!("'{m}' generates text and cannot pool; '{name}' serves embeddings, rerank and score"),
                    ));
                }
                Err(ApiError::unknown_model(m, name))
            }
            _ => Ok(()),
        }
    }

    /// Requests accepted and not finished, by the engine or the encoder.
    pub fn pending(&self) -> usize {
        self.inner.engine.get().map_or(0, EngineHandle::pending)
            + self.inner.encoder.get().map_or(0, EncoderHandle::pending)
    }

    /// Stops the engine and the encoder, whichever were started.
    pub fn stop_workers(&self) {
        if let Some(engine) = self.inner.engine.get() {
            engine.shutdown();
        }
        if let Some(encoder) = self.inner.encoder.get() {
            encoder.shutdown();
        }
    }

    /// The encoder if one was started.
    pub fn started_encoder(&self) -> Option<&EncoderHandle> {
        self.inner.encoder.get()
    }

    /// The engine if it was ever started (for shutting it down).
    pub fn started_engine(&self) -> Option<&EngineHandle> {
        self.inner.engine.get()
    }

    /// Where stored responses are kept.
    pub fn response_store(&self) -> Arc<ResponseStore> {
        Arc::clone(&self.inner.responses)
    }

    /// The chat template and its server-wide variables.
    pub fn template(&self) -> &settings::template::TemplateSetup {
        &self.inner.config.template
    }

    /// The reasoning parser chat answers are read with, if any: the one given, or the one
    /// the model's chat template implies.
    pub fn reasoning_parser(&self) -> Option<reasoning::ReasoningParser> {
        match &self.inner.config.reasoning_parser {
            Choice::Use(parser) => Some(*parser),
            Choice::Off => None,
            Choice::Auto => {
                let engine = self.engine().ok()?;
                reasoning::ReasoningParser::default_for_template(engine.tokenizer().chat_template())
            }
        }
    }

    /// The format answers are read for tool calls in: the one given, or the one the model's
    /// chat template writes.
    pub fn tool_format(&self, tokenizer: &engine::ModelTokenizer) -> Arc<dyn tools::ToolFormat> {
        match &self.inner.config.tool_call_parser {
            Choice::Use(format) => Arc::clone(format),
            Choice::Off | Choice::Auto => tools::default_for_template(tokenizer.chat_template()),
        }
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
        .route("/v1/completions", post(openai::completions::create))
        .route("/v1/chat/completions", post(openai::chat::create))
        .route("/v1/responses", post(openai::responses::create))
        .route("/v1/messages", post(anthropic::messages::create))
        .route(
            "/v1/messages/count_tokens",
            post(anthropic::count_tokens::count),
        )
        .route(
            "/v1/responses/{id}",
            get(openai::responses::get).delete(openai::responses::delete),
        )
        .route("/v1/embeddings", post(pooling::embeddings::create))
        .route("/v1/rerank", post(pooling::rerank::rerank))
        .route("/v2/rerank", post(pooling::rerank::rerank))
        .route("/rerank", post(pooling::rerank::rerank))
        .route("/v1/score", post(pooling::rerank::score))
        .route("/score", post(pooling::rerank::score))
        .route("/v1/models", get(admin::models))
        .route("/v1/models/{model}", get(admin::model))
        .route("/tokenize", post(admin::tokenize))
        .route("/detokenize", post(admin::detokenize))
        .route("/metrics", get(admin::render_metrics))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            layers::require_api_key,
        ));
    Router::new()
        .route("/health", get(admin::health))
        .route("/get_load", get(admin::load::get_load))
        .route("/version", get(admin::load::version))
        .merge(protected)
        .fallback(layers::not_found)
        .method_not_allowed_fallback(layers::wrong_method)
        .layer(DefaultBodyLimit::max(limit))
        .layer(middleware::from_fn(layers::record_http_metrics))
        .with_state(state)
}

fn describe_metrics() {
    engine::metrics::describe();
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
