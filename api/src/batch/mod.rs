//! The runner behind `thicket batch`: offline generation over a JSONL file ([`Job`]), its
//! summary returned for the command to print. Every line goes straight into the
//! engine (no HTTP) through the same validation and response building as the server, so a
//! result body is exactly what the endpoint would answer. All lines are in flight at once
//! within the engine's limits, so continuous batching and speculation work as in serving.
//! Each result is written whole and flushed when its request finishes; running again with
//! the same output skips what is done and completes the rest.

pub mod input;
pub mod output;
mod pooling;
pub mod report;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use engine::encoder::EncoderHandle;
use engine::handle::EngineHandle;
use serde_json::Value;
use tokio::sync::{mpsc, Semaphore};

use crate::server::body::generation_body;
use crate::server::error::{ApiError, ApiResult};
use crate::server::openai::body::Endpoint;
use crate::server::openai::completions::request::CompletionRequest;
use crate::server::openai::completions::start_completion;
use crate::server::openai::respond;
use crate::server::pipeline::{start_chat, Started};
use crate::server::request::ChatRequest;
use crate::server::settings::fields::CommonFields;
use crate::server::{AppState, ServerConfig, DEFAULT_MAX_BODY_BYTES};
use input::{parse_input, BatchLine, Target, Work};
use output::{result_line, OutputLog};
use report::{Outcome, Progress, Summary};

/// How long a line refused for a full queue waits before it is offered again.
const RETRY_DELAY: Duration = Duration::from_millis(20);

/// A batch job: where its lines come from and where their results go.
#[derive(Debug, Clone)]
pub struct Job {
    /// Input JSONL: OpenAI batch lines `{"custom_id", "method", "url", "body"}`, or
    /// `{"prompt": ...}` / `{"messages": [...]}` with an optional `id`.
    pub input: PathBuf,
    /// Output JSONL, one result line per input line (in finishing order). Results already
    /// in it are kept and their lines skipped.
    pub output: PathBuf,
    /// The model name lines may give in `model`.
    pub served_model_name: String,
    /// Most lines in flight at once [default: all the engine accepts]; 1 runs them one at a
    /// time.
    pub max_in_flight: Option<usize>,
}

/// What a job's lines run on, as the command's loader started it.
pub struct Workers {
    /// The generating engine, the speculation method its lines default to, and how many
    /// requests it accepts at once.
    pub engine: Option<(EngineHandle, String, usize)>,
    /// The encoder, or the generating model served for pooling (`--task`).
    pub encoder: Option<EncoderHandle>,
    /// Their threads, joined when the job ends.
    pub threads: Vec<std::thread::JoinHandle<()>>,
}

/// Lines in flight at once on an encoder alone.
const ENCODER_IN_FLIGHT: usize = 64;

/// Runs a batch job and returns its summary once every result is written and checked. `load`
/// loads the model and starts what its lines run on; it is called only when a line needs it.
pub fn run(job: &Job, load: impl FnOnce() -> anyhow::Result<Workers>) -> anyhow::Result<Summary> {
    refuse_same_file(&job.input, &job.output)?;
    let text = std::fs::read_to_string(&job.input)
        .with_context(|| format!("reading {}", job.input.display()))?;
    let parsed = parse_input(&text);
    let (mut log, resumed) = OutputLog::open(&job.output)?;
    let mut summary = Summary {
        input_lines: parsed.lines.len() + parsed.duplicates.len(),
        duplicate_ids: parsed.duplicates.len(),
        missing_ids: parsed.missing_ids.len(),
        retried: resumed.retried.len(),
        torn_bytes: resumed.torn_bytes,
        ..Summary::default()
    };
    for (line, id) in &parsed.duplicates {
        eprintln!("warning: line {line} repeats the id {id:?} of an earlier line; skipped");
    }
    for line in &parsed.missing_ids {
        eprintln!(
            "warning: line {line} has no custom_id; its result is written as \"line-{line}\""
        );
    }
    if !resumed.duplicated.is_empty() {
        eprintln!(
            "warning: {} ids already appear more than once in {}",
            resumed.duplicated.len(),
            job.output.display()
        );
    }
    let todo: Vec<BatchLine> = parsed
        .lines
        .into_iter()
        .filter(|l| !resumed.done.contains(&l.custom_id))
        .collect();
    summary.already_done = summary.input_lines - summary.duplicate_ids - todo.len();
    if summary.already_done > 0 || resumed.torn_bytes > 0 || !resumed.retried.is_empty() {
        eprintln!(
            "resuming {}: {} results kept, {} lines to run ({} server-side failures again, {} bytes of a torn line cut)",
            job.output.display(),
            summary.already_done,
            todo.len(),
            resumed.retried.len(),
            resumed.torn_bytes
        );
    }

    let needs_engine = todo.iter().any(|l| matches!(l.work, Work::Request { .. }));
    let started = Instant::now();
    if needs_engine {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the async runtime")?;
        let finished = runtime.block_on(run_with_engine(job, load, todo, &mut log, &mut summary));
        if let Err(e) = finished {
            // What was written stays whole and is kept by the next run.
            let _ = log.sync();
            eprint!("{}", summary.text());
            return Err(e);
        }
    } else {
        let mut progress = Progress::new(todo.len());
        for line in todo {
            let Work::Invalid(error) = line.work else {
                continue;
            };
            write_result(
                &mut log,
                &mut summary,
                &mut progress,
                &line.custom_id,
                "",
                Err(error),
            )?;
        }
        progress.finish();
        summary.finish(started.elapsed());
    }
    log.sync()?;
    verify_output(&text, &job.output)?;
    Ok(summary)
}

/// Loads the model, runs every line through the engine (or the encoder) and writes each
/// result as it finishes. Ctrl-C stops the job (the engine shuts down cleanly, saving the
/// recycling state); the results written so far are kept for the next run.
async fn run_with_engine(
    job: &Job,
    load: impl FnOnce() -> anyhow::Result<Workers>,
    todo: Vec<BatchLine>,
    log: &mut OutputLog,
    summary: &mut Summary,
) -> anyhow::Result<()> {
    let workers = load()?;
    let state = AppState::new(ServerConfig {
        served_model_name: job.served_model_name.clone(),
        api_key: None,
        max_body_bytes: DEFAULT_MAX_BODY_BYTES,
        reasoning_parser: crate::server::Choice::Auto,
        tool_call_parser: crate::server::Choice::Auto,
        template: Default::default(),
    });
    let (default_method, max_pending) = match workers.engine {
        Some((engine, method, max_pending)) => {
            state.set_engine(engine);
            (method, max_pending)
        }
        None => (String::new(), ENCODER_IN_FLIGHT),
    };
    if let Some(encoder) = workers.encoder {
        state.set_encoder(encoder);
    }

    let in_flight = job.max_in_flight.unwrap_or(max_pending).max(1);
    let slots = Arc::new(Semaphore::new(in_flight));
    let (results, mut finished) = mpsc::unbounded_channel();
    let mut progress = Progress::new(todo.len());
    let started = Instant::now();
    let feeder = {
        let state = state.clone();
        tokio::spawn(async move {
            for line in todo {
                let (endpoint, body) = match line.work {
                    Work::Invalid(error) => {
                        let _ = results.send((line.custom_id, String::new(), Err(error)));
                        continue;
                    }
                    Work::Request { endpoint, body } => (endpoint, body),
                };
                let Ok(slot) = slots.clone().acquire_owned().await else {
                    break;
                };
                let state = state.clone();
                let results = results.clone();
                let method = match endpoint {
                    Target::Generate(_) => requested_method(&body)
                        .unwrap_or(&default_method)
                        .to_string(),
                    _ => String::new(),
                };
                tokio::spawn(async move {
                    let outcome = run_line(&state, endpoint, &body).await;
                    drop(slot);
                    let _ = results.send((line.custom_id, method, outcome));
                });
            }
        })
    };
    let mut written = Ok(());
    let interrupt = tokio::signal::ctrl_c();
    tokio::pin!(interrupt);
    loop {
        tokio::select! {
            next = finished.recv() => {
                let Some((custom_id, method, outcome)) = next else {
                    break;
                };
                written = write_result(log, summary, &mut progress, &custom_id, &method, outcome);
                if written.is_err() {
                    break;
                }
            }
            _ = &mut interrupt => {
                written = Err(anyhow::anyhow!(
                    "interrupted after {} results; run the same command again to finish",
                    summary.requests
                ));
                break;
            }
        }
    }
    progress.finish();
    summary.finish(started.elapsed());
    feeder.abort();
    state.stop_workers();
    for thread in workers.threads {
        let _ = tokio::task::spawn_blocking(move || thread.join()).await;
    }
    written
}

/// Writes one result line and counts it.
fn write_result(
    log: &mut OutputLog,
    summary: &mut Summary,
    progress: &mut Progress,
    custom_id: &str,
    method: &str,
    outcome: ApiResult<Value>,
) -> anyhow::Result<()> {
    let line = result_line(custom_id, outcome);
    log.append(&line)?;
    let counted = Outcome::from_body(line.response.status_code, method, &line.response.body);
    summary.record(&counted);
    progress.advance(&counted);
    Ok(())
}

/// The speculation method a body asks for, when it names one (`auto` for a `speculation`
/// object without a method, as the server reads it).
fn requested_method(body: &Value) -> Option<&str> {
    let spec = body.get("speculation").filter(|s| s.is_object())?;
    Some(spec.get("method").and_then(Value::as_str).unwrap_or("auto"))
}

/// Runs one line to its response body, offering it again while the engine's (or the
/// encoder's) queue is full and other lines are still running (they will make room).
async fn run_line(state: &AppState, target: Target, body: &Value) -> ApiResult<Value> {
    loop {
        let outcome = match target {
            Target::Generate(endpoint) => match start(state, endpoint, body) {
                Ok(started) => return respond::body(started, endpoint).await,
                Err(e) => Err(e),
            },
            pooled => pooling::run(state, pooled, body).await,
        };
        match outcome {
            Err(e) if e.status.as_u16() == 429 && state.pending() > 0 => {
                tokio::time::sleep(RETRY_DELAY).await;
            }
            other => return other,
        }
    }
}

fn start(state: &AppState, endpoint: Endpoint, body: &Value) -> ApiResult<Started> {
    match endpoint {
        Endpoint::Completion => {
            let request: CompletionRequest = generation_body(body)?;
            refuse_stream(&request.common)?;
            start_completion(state, request)
        }
        Endpoint::Chat => {
            let request: ChatRequest = generation_body(body)?;
            refuse_stream(&request.common)?;
            start_chat(state, request)
        }
    }
}

fn refuse_stream(common: &CommonFields) -> ApiResult<()> {
    if common.stream == Some(true) {
        return Err(ApiError::invalid(
            "stream",
            "streaming is not available in batch jobs; each result is written whole",
        ));
    }
    Ok(())
}

fn refuse_same_file(input: &Path, output: &Path) -> anyhow::Result<()> {
    if let (Ok(a), Ok(b)) = (input.canonicalize(), output.canonicalize()) {
        if a == b {
            bail!("the output file must not be the input file");
        }
    }
    Ok(())
}

/// Checks that the output holds every input id exactly once.
fn verify_output(input_text: &str, output: &Path) -> anyhow::Result<()> {
    let expected: std::collections::HashSet<String> = parse_input(input_text)
        .lines
        .into_iter()
        .map(|l| l.custom_id)
        .collect();
    let written = std::fs::read_to_string(output)
        .with_context(|| format!("reading back {}", output.display()))?;
    let mut seen = std::collections::HashMap::<String, usize>::new();
    for line in written.lines() {
        let value: Value = serde_json::from_str(line)
            .with_context(|| format!("{} holds a line that is not JSON", output.display()))?;
        if let Some(id) = value["custom_id"].as_str() {
            *seen.entry(id.to_string()).or_default() += 1;
        }
    }
    let missing = expected.iter().filter(|id| !seen.contains_key(*id)).count();
    let repeated = seen.values().filter(|&&n| n > 1).count();
    if missing > 0 || repeated > 0 {
        bail!(
            "{}: {missing} input ids have no result and {repeated} have more than one",
            output.display()
        );
    }
    Ok(())
}
