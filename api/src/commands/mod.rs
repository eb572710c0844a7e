//! The `thicket` command line: the flags common to every command ([`Cli`]), the command
//! tree, and one file per command ([`fetch`], [`generate`], [`serve`], [`batch`], [`bench`]),
//! each turning its flags into a call into the library that does the work (the engine, the
//! HTTP server, the batch runner, the benches). Commands print plain text (or one JSON
//! object with `--json`); lines about the process's progress go through [`announce`].

pub mod batch;
pub mod bench;
pub mod fetch;
pub mod generate;
pub mod serve;

use std::time::Instant;

use anyhow::Context;
use clap::{Parser, Subcommand};
use engine::{load_model, LoadedModel};

use crate::args::ModelArgs;
use batch::BatchArgs;
use bench::BenchCommand;
use generate::GenerateArgs;
use serve::ServeArgs;

/// thicket: a continuous-batching LLM engine with per-sequence speculative drafters.
#[derive(Debug, Parser)]
#[command(name = "thicket", version, about)]
pub struct Cli {
    /// Log lines on stderr: `text` (coloured only on a terminal) or `json` (one object per
    /// line, for log collectors).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines; ANSI colours only when stderr is a terminal.
    Text,
    /// One JSON object per line, never coloured.
    Json,
}

/// Whether `--log-format json` is in force (set once, by the binary, before anything logs).
static JSON_LOGS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Makes [`announce`] write log events (for `--log-format json`).
pub fn use_json_logs() {
    JSON_LOGS.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// A line about the process's progress (model loaded, listening, ready, stopping): printed
/// on stderr as it is, or as a log event when logs are JSON, so that a log collector reads
/// every line.
pub fn announce(line: &str) {
    if JSON_LOGS.load(std::sync::atomic::Ordering::Relaxed) {
        tracing::info!("{line}");
    } else {
        eprintln!("{line}");
    }
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Download, assemble and verify a model; prints its path.
    Fetch {
        /// Model alias (smollm2-135m, qwen2.5-coder-0.5b, qwen2.5-coder-1.5b, gemma3-270m).
        alias: String,
    },
    /// Generate greedily from one prompt.
    Generate(GenerateArgs),
    /// OpenAI-compatible HTTP server.
    Serve(Box<ServeArgs>),
    /// Offline generation over a JSONL file of requests (resumable).
    Batch(Box<BatchArgs>),
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        bench: BenchCommand,
    },
}

/// Parses the process arguments and runs the chosen command.
pub fn run() -> anyhow::Result<()> {
    run_parsed(parse())
}

/// The command line of this process (exits with clap's message when it does not parse).
pub fn parse() -> Cli {
    Cli::parse()
}

/// Parses a command line (`argv[0]` first) without exiting on an error: for checking
/// command lines kept elsewhere (the Kubernetes example's).
pub fn try_parse_from<I, T>(argv: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    Cli::try_parse_from(argv)
}

/// Runs an already parsed command line (the binary parses first, to set up logging).
pub fn run_parsed(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Fetch { alias } => fetch::run(&alias),
        Command::Generate(args) => generate::run(&load(&args.model)?, &args),
        Command::Serve(args) => serve::run(*args),
        Command::Batch(args) => batch::run(*args),
        Command::Bench { bench } => bench::run(bench),
    }
}

/// Where the encoder `spec` names is (a `bert` GGUF, or a folder, fetching an alias if
/// needed), `None` for a model that generates.
fn encoder_path(spec: &str) -> anyhow::Result<Option<std::path::PathBuf>> {
    let path = std::path::Path::new(spec);
    if path.is_file() {
        return Ok(engine::encoder::is_encoder_gguf(path).then(|| path.to_path_buf()));
    }
    let is_alias = engine::model::fetch::find_alias(spec).is_some_and(|a| a.is_directory());
    if !(path.is_dir() || is_alias && !path.exists()) {
        return Ok(None);
    }
    match engine::model::fetch::resolve_model(spec)
        .with_context(|| format!("fetching model '{spec}'"))?
    {
        engine::model::fetch::ModelSource::HfDir(dir) if engine::encoder::is_encoder_dir(&dir) => {
            Ok(Some(dir))
        }
        _ => Ok(None),
    }
}

/// Loads the encoder in `dir` (named `spec`) with weights in `dtype`, and starts its thread
/// (`sharing_cores` when a generating engine runs beside it).
fn start_encoder(
    dir: &std::path::Path,
    spec: &str,
    dtype: engine::WeightDType,
    sharing_cores: bool,
) -> anyhow::Result<(engine::encoder::EncoderHandle, std::thread::JoinHandle<()>)> {
    let started = Instant::now();
    let encoder = engine::encoder::Encoder::load(dir, dtype)
        .with_context(|| format!("loading encoder '{spec}'"))?;
    announce(&format!(
        "loaded {} (an encoder: {} layers, {} wide, {:?}, inputs up to {} tokens) in {:.1}s",
        spec,
        encoder.model.config().num_layers,
        encoder.model.config().hidden_size,
        encoder.task,
        encoder.tokenizer.max_length(),
        started.elapsed().as_secs_f64()
    ));
    Ok(engine::encoder::spawn_encoder(
        encoder,
        engine::encoder::EncoderServeConfig {
            sharing_cores,
            ..Default::default()
        },
    )?)
}

/// Loads (fetching if needed) the model named by `args`.
fn load(args: &ModelArgs) -> anyhow::Result<LoadedModel> {
    let started = Instant::now();
    let loaded = load_model(&args.model, &args.options())
        .with_context(|| format!("loading model '{}'", args.model))?;
    announce(&format!(
        "loaded {} ({:?}, {} layers) in {:.1}s",
        args.model,
        loaded.model.config().architecture,
        loaded.model.config().num_layers,
        started.elapsed().as_secs_f64()
    ));
    Ok(loaded)
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn every_command_has_consistent_flags() {
        // Catches duplicate or conflicting flag names across flattened argument groups.
        Cli::command().debug_assert();
        let serve = Cli::try_parse_from([
            "thicket",
            "serve",
            "--port",
            "0",
            "--api-key",
            "k",
            "--max-model-len",
            "512",
            "--speculation",
            "none",
        ]);
        assert!(serve.is_ok(), "{serve:?}");
        assert!(Cli::try_parse_from(["thicket", "serve", "--port", "70000"]).is_err());
        let batch = Cli::try_parse_from([
            "thicket",
            "batch",
            "-i",
            "in.jsonl",
            "-o",
            "out.jsonl",
            "--dtype",
            "f32",
        ]);
        assert!(batch.is_ok(), "{batch:?}");
        let zero_in_flight = [
            "thicket",
            "batch",
            "-i",
            "a",
            "-o",
            "b",
            "--max-in-flight",
            "0",
        ];
        assert!(Cli::try_parse_from(zero_in_flight).is_err());
        assert!(Cli::try_parse_from(["thicket", "batch", "-i", "in.jsonl"]).is_err());
        let bench = [
            "thicket",
            "bench",
            "serve",
            "--request-rate",
            "inf",
            "--goodput",
            "ttft:500",
        ];
        assert!(Cli::try_parse_from(bench).is_ok());
        let bench = [
            "thicket",
            "bench",
            "serve",
            "--request-rate",
            "2.5",
            "--max-concurrency",
            "4",
        ];
        assert!(Cli::try_parse_from(bench).is_ok());
        let bench = ["thicket", "bench", "serve", "--request-rate", "-1"];
        assert!(Cli::try_parse_from(bench).is_err());
        let sweep = [
            "thicket",
            "bench",
            "sweep",
            "--concurrency",
            "1,2,4",
            "--speculation",
            "auto,none",
        ];
        assert!(Cli::try_parse_from(sweep).is_ok());
    }
}
