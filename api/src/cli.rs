//! The `thicket` command line. Each subcommand parses its flags, loads what it needs through
//! the engine and prints plain text (or one JSON object with `--json`).

use std::time::Instant;

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand};
use engine::cpu::attention::AttentionKernel;
use engine::cpu::kv_store::KvDtype;
use engine::model::fetch::{find_alias, models_dir, DEFAULT_MODEL};
use engine::QuantKernel;
use engine::{load_model, DeviceChoice, LoadOptions, LoadedModel, WeightDType};

use crate::batch::{self, BatchArgs};
use crate::bench::edits::{self, EditBenchArgs};
use crate::bench::serve::{self, ServeBenchArgs};
use crate::bench::spec::{self, SpecBenchArgs};
use crate::bench::sweep::{self, SweepArgs};
use crate::bench::tot::{self, TotArgs};
use crate::bench::{engine as engine_bench, forward};
use crate::engine_args::EngineArgs;
use crate::generate_cmd::{self, GenerateArgs};
use crate::server::serve_cmd::{self, ServeArgs};

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
        /// Model alias (smollm2-135m, qwen2.5-coder-0.5b, qwen2.5-coder-1.5b).
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

/// Flags shared by everything that loads a model.
#[derive(Debug, Args)]
pub struct ModelArgs {
    /// Alias, GGUF file, or HF directory.
    #[arg(long, default_value = DEFAULT_MODEL)]
    pub model: String,
    /// Weight representation: auto | q | f32 | f16 | bf16.
    #[arg(long, default_value = "auto", value_parser = parse_dtype)]
    pub dtype: WeightDType,
    /// Attention kernel: fused (batch-invariant, tree-exact) | reference (candle's arithmetic).
    #[arg(long, default_value = "fused", value_parser = parse_attention)]
    pub attention: AttentionKernel,
    /// CPU kernel for quantized weights: thicket (weights streamed once for all rows) | candle.
    #[arg(long, default_value = "thicket", value_parser = parse_matmul)]
    pub matmul: QuantKernel,
    /// How the KV cache keeps keys and values: f16 (half the memory of f32) | f32. Default:
    /// f16 with the fused attention, f32 with the reference.
    #[arg(long, value_parser = parse_kv_dtype)]
    pub kv_cache_dtype: Option<KvDtype>,
    /// Where the model runs: auto (a CUDA GPU when built with `cuda` and one is present,
    /// else the CPU) | cpu | cuda | cuda:N.
    #[arg(long, default_value = "auto", value_parser = parse_device)]
    pub device: DeviceChoice,
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Cost of one forward for N new tokens over a cached context.
    Forward {
        #[command(flatten)]
        model: ModelArgs,
        /// Cached context length.
        #[arg(long, default_value_t = 512)]
        context: usize,
        /// New-token counts to measure.
        #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16,32,64,128")]
        sizes: Vec<usize>,
        /// Timed runs per size (median reported).
        #[arg(long, default_value_t = 5)]
        repeats: usize,
    },
    /// Output tokens/s of the serving engine at several concurrencies (greedy, fixed length).
    Engine {
        #[command(flatten)]
        model: ModelArgs,
        #[command(flatten)]
        engine: EngineArgs,
        /// Concurrent requests per level.
        #[arg(long, value_delimiter = ',', default_value = "1,4,16,64")]
        concurrency: Vec<usize>,
        /// Output tokens per request.
        #[arg(long, default_value_t = 64)]
        max_tokens: usize,
    },
    /// Speculation methods on Spec-Bench questions: speedup per category, MAT, tokens/s.
    Spec(SpecBenchArgs),
    /// Real code edits, whole file back, with and without the file as the prediction.
    Edits(EditBenchArgs),
    /// Load on any OpenAI-compatible server: throughput, TTFT, TPOT, ITL, E2E, goodput.
    Serve(Box<ServeBenchArgs>),
    /// `bench serve` over concurrency levels with speculation on and off, with charts.
    Sweep(Box<SweepArgs>),
    /// Tree-of-thought on GSM8K (SEED's workload): serial vs parallel wall time per question.
    Tot(Box<TotArgs>),
}

fn parse_attention(s: &str) -> Result<AttentionKernel, String> {
    AttentionKernel::parse(s)
        .ok_or_else(|| format!("unknown attention kernel '{s}' (fused, reference)"))
}

fn parse_kv_dtype(s: &str) -> Result<KvDtype, String> {
    KvDtype::parse(s).ok_or_else(|| format!("unknown KV cache dtype '{s}' (f16, f32)"))
}

fn parse_device(s: &str) -> Result<DeviceChoice, String> {
    DeviceChoice::parse(s).ok_or_else(|| format!("unknown device '{s}' (auto, cpu, cuda, cuda:N)"))
}

fn parse_matmul(s: &str) -> Result<QuantKernel, String> {
    QuantKernel::parse(s).ok_or_else(|| format!("unknown matmul kernel '{s}' (thicket, candle)"))
}

fn parse_dtype(s: &str) -> Result<WeightDType, String> {
    WeightDType::parse(s).ok_or_else(|| format!("unknown dtype '{s}' (auto, q, f32, f16, bf16)"))
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
        Command::Fetch { alias } => fetch(&alias),
        Command::Generate(args) => generate_cmd::run(&load(&args.model)?, &args),
        Command::Serve(args) => serve_cmd::run(*args),
        Command::Batch(args) => batch::run(*args),
        Command::Bench {
            bench:
                BenchCommand::Forward {
                    model,
                    context,
                    sizes,
                    repeats,
                },
        } => forward::run(&load(&model)?, context, &sizes, repeats),
        Command::Bench {
            bench:
                BenchCommand::Engine {
                    model,
                    engine,
                    concurrency,
                    max_tokens,
                },
        } => engine_bench::run(&load(&model)?, &engine, &concurrency, max_tokens),
        Command::Bench {
            bench: BenchCommand::Spec(args),
        } => spec::run(&load(&args.model)?, &args),
        Command::Bench {
            bench: BenchCommand::Edits(args),
        } => edits::run(&load(&args.model)?, &args),
        Command::Bench {
            bench: BenchCommand::Serve(args),
        } => serve::run(&args),
        Command::Bench {
            bench: BenchCommand::Sweep(args),
        } => sweep::run(&args),
        Command::Bench {
            bench: BenchCommand::Tot(args),
        } => tot::run(&args),
    }
}

fn fetch(alias: &str) -> anyhow::Result<()> {
    let Some(model) = find_alias(alias) else {
        bail!(
            "unknown model alias '{alias}' (known: {})",
            engine::model::fetch::alias_names().join(", ")
        );
    };
    let path = engine::model::fetch::fetch(model, &models_dir())?;
    println!("{}", path.display());
    let (content, _) = engine::model::gguf::read_content(&path)?;
    let tokenizer = engine::ModelTokenizer::from_gguf(&content)?;
    let dir = models_dir().join(format!("{alias}.tokenizer"));
    tokenizer.export_hf(&dir)?;
    announce(&format!("tokenizer for clients: {}", dir.display()));
    Ok(())
}

/// Loads (fetching if needed) the model named by `args`.
pub(crate) fn load(args: &ModelArgs) -> anyhow::Result<LoadedModel> {
    let started = Instant::now();
    let loaded = load_model(
        &args.model,
        &LoadOptions {
            dtype: args.dtype,
            attention: args.attention,
            matmul: args.matmul,
            kv_dtype: args.kv_cache_dtype,
            device: args.device,
        },
    )
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
