//! `thicket batch`: its flags, and the batch runner ([`crate::batch`]) run with them: the
//! model loaded only when a line needs it (an encoder on its own thread for pooling lines, a
//! generating model in the engine, serving pooling lines too under `--task`), the summary
//! printed as text (or one JSON object with `--json`) once every result is written.

use std::path::PathBuf;

use clap::Args;

use anyhow::bail;
use engine::encoder::decoder_pooler;

use super::{encoder_path, load, start_encoder};
use crate::args::{spawn, task_value, EngineArgs, ModelArgs, TaskArg};
use crate::batch::{self, Job, Workers};

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
    /// What a generating --model also serves to pooling lines (`/v1/embeddings`,
    /// `/v1/rerank`, `/v1/score`): `embed` or `rerank`, as `thicket serve --task` (an encoder
    /// --model serves them without it).
    #[arg(long, alias = "convert", value_parser = task_value, default_value = "generate")]
    pub task: TaskArg,
}

/// Runs `thicket batch`.
pub fn run(args: BatchArgs) -> anyhow::Result<()> {
    let job = Job {
        input: args.input.clone(),
        output: args.output.clone(),
        served_model_name: args
            .served_model_name
            .clone()
            .unwrap_or_else(|| args.model.model.clone()),
        max_in_flight: args.max_in_flight.map(|n| n as usize),
    };
    let summary = batch::run(&job, || start(&args))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        print!("{}", summary.text());
        println!("results: {}", job.output.display());
    }
    Ok(())
}

/// Loads the model and starts what the job's lines run on.
fn start(args: &BatchArgs) -> anyhow::Result<Workers> {
    if let Some(dir) = encoder_path(&args.model.model)? {
        if args.task.0.is_some() {
            bail!(
                "--task chooses what a generating model serves, and '{}' is an encoder",
                args.model.model
            );
        }
        let (encoder, thread) = start_encoder(&dir, &args.model.model, args.model.dtype, false)?;
        return Ok(Workers {
            engine: None,
            encoder: Some(encoder),
            threads: vec![thread],
        });
    }
    let loaded = load(&args.model)?;
    let config = args.engine.config(&loaded.model)?;
    let method = config.speculation.default.method.as_str().to_string();
    let max_pending = config.max_pending;
    let (engine, thread) = spawn(&loaded, config)?;
    let encoder = match args.task.0 {
        Some(task) => {
            let hidden = loaded.model.config().hidden_size;
            Some(decoder_pooler(engine.clone(), task, hidden)?)
        }
        None => None,
    };
    Ok(Workers {
        engine: Some((engine, method, max_pending)),
        encoder,
        threads: vec![thread],
    })
}
