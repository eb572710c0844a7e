//! `thicket bench ...`: the benchmark subcommands. `forward` and `engine` take their few
//! flags here; `spec`, `edits`, `serve`, `sweep` and `tot` take the flags their benches
//! define. The in-process benches get the model loaded here; the client benches only a URL.

use clap::Subcommand;

use super::load;
use crate::args::{EngineArgs, ModelArgs};
use crate::bench::edits::{self, EditBenchArgs};
use crate::bench::serve::{self, ServeBenchArgs};
use crate::bench::spec::{self, SpecBenchArgs};
use crate::bench::sweep::{self, SweepArgs};
use crate::bench::tot::{self, TotArgs};
use crate::bench::{engine as engine_bench, forward};

// The subcommands' doc comments are their help text.
#[derive(Debug, Subcommand)]
pub(super) enum BenchCommand {
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
        /// Only the last new token's logits, as a prefill chunk that ends its prompt (default:
        /// every token's, as a draft verified).
        #[arg(long)]
        last_logits: bool,
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

/// Runs one benchmark.
pub(super) fn run(bench: BenchCommand) -> anyhow::Result<()> {
    match bench {
        BenchCommand::Forward {
            model,
            context,
            sizes,
            repeats,
            last_logits,
        } => forward::run(&load(&model)?, context, &sizes, (repeats, last_logits)),
        BenchCommand::Engine {
            model,
            engine,
            concurrency,
            max_tokens,
        } => engine_bench::run(&load(&model)?, &engine, &concurrency, max_tokens),
        BenchCommand::Spec(args) => spec::run(&load(&args.model)?, &args),
        BenchCommand::Edits(args) => edits::run(&load(&args.model)?, &args),
        BenchCommand::Serve(args) => serve::run(&args),
        BenchCommand::Sweep(args) => sweep::run(&args),
        BenchCommand::Tot(args) => tot::run(&args),
    }
}
