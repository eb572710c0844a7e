//! `thicket serve`: binds the address first (so `/health` answers 503 while the model
//! loads), loads the model and starts the engine in the background, then serves until
//! SIGINT or SIGTERM. Shutdown refuses new requests at once, lets running ones finish for a
//! grace period, then cancels the rest, stops the engine (saving the Token Recycling
//! matrix) and exits.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use tokio::net::TcpListener;

use super::{announce, encoder_path, load, start_encoder};
use crate::args::{spawn, task_value, EngineArgs, ModelArgs, TaskArg};
use crate::chat::check_template;
use crate::server::openai::responses::store::{
    ResponseStore, DEFAULT_MAX_BYTES, DEFAULT_MAX_RESPONSES,
};
use crate::server::reasoning::{ReasoningParser, REASONING_PARSERS};
use crate::server::settings::template::{parse_kwargs, TemplateSetup};
use crate::server::tools::{tool_format, ToolFormat, TOOL_CALL_PARSERS};
use crate::server::{router, AppState, Choice, ServerConfig, DEFAULT_MAX_BODY_BYTES};
use engine::encoder::{decoder_pooler, DecoderTask};

/// Flags of `thicket serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Model flags.
    #[command(flatten)]
    pub model: ModelArgs,
    /// Engine flags.
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Address to listen on (loopback unless told otherwise).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0 picks a free one).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Require `Authorization: Bearer KEY` (or `x-api-key: KEY`) on every /v1 endpoint.
    #[arg(long, env = "THICKET_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// The model name clients send [default: the --model value].
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// An encoder (alias or folder, e.g. all-minilm-l6-v2) served beside the model on
    /// /v1/embeddings, /v1/rerank and /v1/score, on a thread of its own.
    #[arg(long)]
    pub embedding_model: Option<String>,
    /// The name clients send for --embedding-model [default: its value].
    #[arg(long, requires = "embedding_model")]
    pub served_embedding_model_name: Option<String>,
    /// What a generating --model also serves: `generate` (only generation), `embed` (also
    /// /v1/embeddings and /v1/score: the last token's final-normed state, normalized, as
    /// Qwen3-Embedding is used) or `rerank` (also /v1/rerank and /v1/score: the probability
    /// of `yes` against `no` after Qwen3-Reranker's template). Pooling requests are
    /// prefill-only requests of the engine, batched with generation and cached like it.
    /// `--convert` is vLLM's name for it.
    #[arg(long, alias = "convert", value_parser = task_value, default_value = "generate")]
    pub task: TaskArg,
    /// vLLM's `--runner`: `pooling` is `--task embed` unless --task / --convert says
    /// otherwise; `generate` and `auto` change nothing.
    #[arg(long, value_parser = ["auto", "generate", "pooling"], default_value = "auto")]
    pub runner: String,
    /// Split chat answers into thinking (`reasoning_content`) and answer: `deepseek_r1`
    /// (thinking until `</think>`), `qwen3` (thinking inside `<think>...</think>`), `generic`
    /// (thinking inside --reasoning-start and --reasoning-end), `none`, or `auto`: the one
    /// the model's chat template implies (none for templates that do not think). Tool calls
    /// are read from the answer only.
    #[arg(long, default_value = "auto")]
    pub reasoning_parser: String,
    /// The string that opens thinking, for `--reasoning-parser generic`.
    #[arg(long)]
    pub reasoning_start: Option<String>,
    /// The string that ends thinking, for `--reasoning-parser generic`.
    #[arg(long)]
    pub reasoning_end: Option<String>,
    /// The format tool calls are read and written in: `hermes`, `llama3_json`, `mistral`,
    /// `qwen3_coder`, or `auto`: the one the model's chat template writes (`hermes` when it
    /// shows none).
    #[arg(long, value_parser = api_tool_call_parser, default_value = "auto")]
    pub tool_call_parser: Choice<Arc<dyn ToolFormat>>,
    /// A Jinja chat template file to render chat requests with, instead of the model's own.
    #[arg(long)]
    pub chat_template: Option<std::path::PathBuf>,
    /// Variables every chat template render gets, as a JSON object (a request's
    /// `chat_template_kwargs` go over them), e.g. '{"enable_thinking": false}'.
    #[arg(long, value_parser = parse_kwargs)]
    pub default_chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    /// Largest request body, in bytes.
    #[arg(long, default_value_t = DEFAULT_MAX_BODY_BYTES)]
    pub max_body_bytes: usize,
    /// Seconds running requests may take to finish after SIGINT/SIGTERM before they are
    /// cancelled.
    #[arg(long, default_value_t = 30)]
    pub shutdown_grace_secs: u64,
    /// Most responses `/v1/responses` keeps for `GET` and `previous_response_id` (the oldest
    /// dropped first; 0: none kept).
    #[arg(long, default_value_t = DEFAULT_MAX_RESPONSES)]
    pub max_stored_responses: usize,
    /// Most MiB the stored responses and their conversations take.
    #[arg(long, default_value_t = DEFAULT_MAX_BYTES >> 20)]
    pub max_stored_responses_mib: usize,
}

/// Runs the server until a shutdown signal.
pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("thicket-http")
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(serve(args))
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let config = ServerConfig {
        served_model_name: args
            .served_model_name
            .clone()
            .unwrap_or_else(|| args.model.model.clone()),
        api_key: args.api_key.clone().filter(|k| !k.is_empty()),
        max_body_bytes: args.max_body_bytes,
        reasoning_parser: reasoning_parser(&args).map_err(anyhow::Error::msg)?,
        tool_call_parser: args.tool_call_parser.clone(),
        template: TemplateSetup {
            template: match &args.chat_template {
                Some(path) => {
                    let text = std::fs::read_to_string(path)
                        .with_context(|| format!("reading --chat-template {}", path.display()))?;
                    check_template(&text)
                        .with_context(|| format!("--chat-template {}", path.display()))?;
                    Some(text)
                }
                None => None,
            },
            kwargs: args
                .default_chat_template_kwargs
                .clone()
                .unwrap_or_default(),
        },
    };
    let store = ResponseStore::new(
        args.max_stored_responses,
        args.max_stored_responses_mib.saturating_mul(1 << 20),
    );
    let state = AppState::with_response_store(config, store);
    if let Some(embedding) = &args.embedding_model {
        let name = args
            .served_embedding_model_name
            .clone()
            .unwrap_or_else(|| embedding.clone());
        state.expect_encoder_beside(name);
    }
    let listener = TcpListener::bind((args.host.as_str(), args.port))
        .await
        .with_context(|| format!("binding {}:{}", args.host, args.port))?;
    let address = listener.local_addr().context("reading the bound address")?;
    announce(&format!(
        "listening on http://{address} (the model is loading; /health answers 503 until it is ready)"
    ));

    let loader_state = state.clone();
    let grace = Duration::from_secs(args.shutdown_grace_secs);
    let loading = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
        let task = pooling_task(&args);
        if let Some(dir) = encoder_path(&args.model.model)? {
            if task.is_some() {
                anyhow::bail!(
                    "--task and --runner pooling choose what a generating model serves, and                      '{}' is an encoder: it embeds (or scores) as its checkpoint says",
                    args.model.model
                );
            }
            if args.embedding_model.is_some() {
                anyhow::bail!(
                    "--embedding-model goes beside a generating --model, and '{}' is an encoder",
                    args.model.model
                );
            }
            let (handle, thread) = start_encoder(&dir, &args.model.model, args.model.dtype, false)?;
            loader_state.set_encoder(handle);
            announce(&format!(
                "ready: serving '{}' on /v1/embeddings, /v1/rerank and /v1/score",
                loader_state.model_name()
            ));
            return Ok(vec![thread]);
        }
        let mut threads = Vec::new();
        if let (Some(_), Some(embedding)) = (task, &args.embedding_model) {
            anyhow::bail!(
                "--embedding-model '{embedding}' and --task both serve the pooling routes:                  give one"
            );
        }
        if let Some(embedding) = &args.embedding_model {
            let dir = encoder_path(embedding)?.ok_or_else(|| {
                anyhow::anyhow!(
                    "--embedding-model '{embedding}' is not an encoder (a BERT folder or alias)"
                )
            })?;
            // The encoder keeps f32 whatever --dtype says of the generating model.
            let (handle, thread) = start_encoder(&dir, embedding, engine::WeightDType::Auto, true)?;
            loader_state.set_encoder(handle);
            threads.push(thread);
        }
        let loaded = load(&args.model)?;
        let config = args.engine.config(&loaded.model)?;
        let (handle, thread) = spawn(&loaded, config)?;
        if let Some(task) = task {
            let hidden = loaded.model.config().hidden_size;
            loader_state.set_encoder(decoder_pooler(handle.clone(), task, hidden)?);
        }
        loader_state.set_engine(handle);
        threads.push(thread);
        match (&args.embedding_model, task) {
            (_, Some(task)) => announce(&format!(
                "ready: serving '{}', which also {} on {}",
                loader_state.model_name(),
                match task {
                    DecoderTask::Embed => "embeds",
                    DecoderTask::Rerank => "reranks",
                },
                match task {
                    DecoderTask::Embed => "/v1/embeddings and /v1/score",
                    DecoderTask::Rerank => "/v1/rerank and /v1/score",
                }
            )),
            (Some(_), None) => announce(&format!(
                "ready: serving '{}', and '{}' on /v1/embeddings, /v1/rerank and /v1/score",
                loader_state.model_name(),
                loader_state.embedding_model_name()
            )),
            (None, None) => announce(&format!("ready: serving '{}'", loader_state.model_name())),
        }
        Ok(threads)
    });

    let app = router(state.clone());
    let (load_failed_tx, load_failed_rx) = tokio::sync::oneshot::channel::<()>();
    let server = axum::serve(listener, app).with_graceful_shutdown(shutdown_signal(
        state.clone(),
        grace,
        load_failed_rx,
    ));
    let server = tokio::spawn(async move { server.await });

    let worker_threads = match loading.await {
        Ok(Ok(threads)) => threads,
        Ok(Err(e)) => {
            let _ = load_failed_tx.send(());
            let _ = server.await;
            return Err(e.context("the model could not be loaded"));
        }
        Err(e) => {
            let _ = load_failed_tx.send(());
            let _ = server.await;
            anyhow::bail!("the loading task failed: {e}");
        }
    };
    let served = server.await;
    state.stop_workers();
    for thread in worker_threads {
        let _ = tokio::task::spawn_blocking(move || thread.join()).await;
    }
    served
        .context("the server task failed")?
        .context("serving HTTP")?;
    announce("stopped");
    Ok(())
}

/// Resolves when the server should stop taking connections: at once when the model failed
/// to load; on SIGINT or SIGTERM, once the requests already admitted have finished (or
/// `grace` ran out and the engine cancelled the rest). Meanwhile the server keeps answering,
/// `/health` and new requests with 503, so a router in front of it sees it leaving and stops
/// sending while its streams complete.
async fn shutdown_signal(
    state: AppState,
    grace: Duration,
    load_failed: tokio::sync::oneshot::Receiver<()>,
) {
    let interrupt = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = interrupt => {}
        _ = terminate => {}
        result = load_failed => {
            if result.is_ok() {
                return;
            }
            std::future::pending::<()>().await;
        }
    }
    announce(&format!(
        "shutting down: refusing new requests, giving running ones {}s",
        grace.as_secs()
    ));
    state.begin_shutdown();
    let deadline = tokio::time::Instant::now() + grace;
    while state.pending() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    state.stop_workers();
}

/// `--reasoning-parser` (with `--reasoning-start` and `--reasoning-end` for `generic`): `auto`,
/// `none` or a known parser; an error listing them otherwise.
fn reasoning_parser(args: &ServeArgs) -> Result<Choice<ReasoningParser>, String> {
    let markers = (
        args.reasoning_start.as_deref(),
        args.reasoning_end.as_deref(),
    );
    // Harmony calls are read from the channels the harmony parser splits out.
    let harmony_calls = matches!(&args.tool_call_parser, Choice::Use(f) if f.name() == "openai");
    match (args.reasoning_parser.as_str(), markers) {
        ("auto" | "openai_gptoss", (None, None)) if harmony_calls => {
            Ok(Choice::Use(ReasoningParser::Harmony))
        }
        (_, _) if harmony_calls => Err(
            "--tool-call-parser openai reads gpt-oss's harmony channels: use it with \
             --reasoning-parser openai_gptoss (or auto)"
                .into(),
        ),
        ("generic", (Some(start), Some(end))) => {
            ReasoningParser::generic(start, end).map(Choice::Use)
        }
        ("generic", _) => {
            Err("--reasoning-parser generic needs --reasoning-start and --reasoning-end".into())
        }
        (_, (Some(_), _) | (_, Some(_))) => {
            Err("--reasoning-start and --reasoning-end go with --reasoning-parser generic".into())
        }
        ("auto", _) => Ok(Choice::Auto),
        ("none", _) => Ok(Choice::Off),
        (name, _) => ReasoningParser::parse(name).map(Choice::Use).map_err(|_| {
            format!(
                "unknown reasoning parser {name:?} (known: {}, auto, none)",
                REASONING_PARSERS.join(", ")
            )
        }),
    }
}

/// `--tool-call-parser`'s value: `auto` or a known format; an error listing them otherwise.
fn api_tool_call_parser(name: &str) -> Result<Choice<Arc<dyn ToolFormat>>, String> {
    match name {
        "auto" => Ok(Choice::Auto),
        name => tool_format(name).map(Choice::Use).map_err(|_| {
            format!(
                "unknown tool-call parser {name:?} (known: {}, auto)",
                TOOL_CALL_PARSERS.join(", ")
            )
        }),
    }
}

/// The pooling task a generating model serves: `--task`, or `embed` under `--runner pooling`.
fn pooling_task(args: &ServeArgs) -> Option<DecoderTask> {
    args.task.with_runner(&args.runner)
}
