//! `thicket batch`: its flags, and the batch runner ([`crate::batch`]) run with them: the
//! model loaded only when a line needs the engine, the summary printed as text (or one JSON
//! object with `--json`) once every result is written.

use std::path::PathBuf;

use clap::Args;

use super::load;
use crate::args::{EngineArgs, ModelArgs};
use crate::batch::{self, Job};

/// Flags of `thicket batch`.
#[derive(Debug, Args)]
pub struct BatchArgs {
    /// Model flags.
    #[command(flatten)]
    pub model: ModelArgs,
    /// Engine flags.
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Input JSONL: OpenAI batch lines `{"custom_id", "method", "url", "body"}`, or
    /// `{"prompt": ...}` / `{"messages": [...]}` with an optional `id`.
    #[arg(short = 'i', long)]
    pub input: PathBuf,
    /// Output JSONL, one result line per input line (in finishing order). Results already
    /// in it are kept and their lines skipped.
    #[arg(short = 'o', long)]
    pub output: PathBuf,
    /// The model name lines may give in `model` [default: the --model value].
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Most lines in flight at once [default: all the engine accepts, --max-num-seqs plus
    /// --max-queue]; 1 runs them one at a time.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_in_flight: Option<u32>,
    /// Print the summary as one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Runs `thicket batch`.
pub fn run(args: BatchArgs) -> anyhow::Result<()> {
    let job = Job {
        input: args.input,
        output: args.output,
        served_model_name: args
            .served_model_name
            .unwrap_or_else(|| args.model.model.clone()),
        max_in_flight: args.max_in_flight.map(|n| n as usize),
    };
    let summary = batch::run(&job, || {
        let loaded = load(&args.model)?;
        let config = args.engine.config(&loaded.model)?;
        Ok((loaded, config))
    })?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        print!("{}", summary.text());
        println!("results: {}", job.output.display());
    }
    Ok(())
}
