//! The `thicket` command line. Each subcommand parses its flags, loads what it needs through
//! the engine and prints plain text (or one JSON object with `--json`).

use std::time::Instant;

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand};
use engine::attention::AttentionKernel;
use engine::fetch::{find_alias, models_dir, DEFAULT_MODEL};
use engine::generate::{cache_config_for, generate_greedy_with, GreedyOptions};
use engine::{load_model, KvCache, LoadOptions, LoadedModel, WeightDType};

use crate::chat::{render_chat, ChatMessage};

/// thicket: a continuous-batching LLM engine with per-sequence speculative drafters.
#[derive(Debug, Parser)]
#[command(name = "thicket", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
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
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        bench: BenchCommand,
    },
}

/// Flags shared by everything that loads a model.
#[derive(Debug, Args)]
struct ModelArgs {
    /// Alias, GGUF file, or HF directory.
    #[arg(long, default_value = DEFAULT_MODEL)]
    model: String,
    /// Weight representation: auto | q | f32 | f16 | bf16.
    #[arg(long, default_value = "auto", value_parser = parse_dtype)]
    dtype: WeightDType,
    /// Attention kernel: fused (batch-invariant, tree-exact) | reference (candle's arithmetic).
    #[arg(long, default_value = "fused", value_parser = parse_attention)]
    attention: AttentionKernel,
}

/// KV cache flags shared by everything that runs the engine.
#[derive(Debug, Args)]
struct KvArgs {
    /// Positions per KV block.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=1024))]
    block_size: u16,
    /// Do not reuse the KV of previously computed prompt prefixes.
    #[arg(long)]
    no_prefix_cache: bool,
}

#[derive(Debug, Args)]
struct GenerateArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    kv: KvArgs,
    /// Prompt text.
    #[arg(long)]
    prompt: String,
    /// Wrap the prompt as a user message in the model's chat template.
    #[arg(long)]
    chat: bool,
    /// Tokens to generate at most.
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    /// Print one JSON object instead of the text.
    #[arg(long)]
    json: bool,
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
}

fn parse_attention(s: &str) -> Result<AttentionKernel, String> {
    AttentionKernel::parse(s)
        .ok_or_else(|| format!("unknown attention kernel '{s}' (fused, reference)"))
}

fn parse_dtype(s: &str) -> Result<WeightDType, String> {
    WeightDType::parse(s).ok_or_else(|| format!("unknown dtype '{s}' (auto, q, f32, f16, bf16)"))
}

/// Parses the process arguments and runs the chosen command.
pub fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Fetch { alias } => fetch(&alias),
        Command::Generate(args) => generate(args),
        Command::Bench {
            bench:
                BenchCommand::Forward {
                    model,
                    context,
                    sizes,
                    repeats,
                },
        } => bench_forward(&model, context, &sizes, repeats),
    }
}

fn fetch(alias: &str) -> anyhow::Result<()> {
    let Some(model) = find_alias(alias) else {
        bail!(
            "unknown model alias '{alias}' (known: {})",
            engine::fetch::alias_names().join(", ")
        );
    };
    let path = engine::fetch::fetch(model, &models_dir())?;
    println!("{}", path.display());
    Ok(())
}

fn load(args: &ModelArgs) -> anyhow::Result<LoadedModel> {
    let started = Instant::now();
    let loaded = load_model(
        &args.model,
        &LoadOptions {
            dtype: args.dtype,
            attention: args.attention,
        },
    )
    .with_context(|| format!("loading model '{}'", args.model))?;
    eprintln!(
        "loaded {} ({:?}, {} layers) in {:.1}s",
        args.model,
        loaded.model.config().architecture,
        loaded.model.config().num_layers,
        started.elapsed().as_secs_f64()
    );
    Ok(loaded)
}

fn generate(args: GenerateArgs) -> anyhow::Result<()> {
    if args.prompt.is_empty() {
        bail!("--prompt is empty: give some text to continue");
    }
    let loaded = load(&args.model)?;
    let tokenizer = &loaded.tokenizer;
    let text = if args.chat {
        let template = tokenizer
            .chat_template()
            .context("--chat: this model has no chat template")?;
        let token_text = |id: Option<u32>| {
            id.and_then(|i| tokenizer.inner().id_to_token(i))
                .unwrap_or_default()
        };
        let eos = tokenizer.eos_ids().first().copied();
        render_chat(
            template,
            &[ChatMessage::user(&args.prompt)],
            &token_text(tokenizer.bos_id()),
            &token_text(eos),
        )?
    } else {
        args.prompt.clone()
    };
    let prompt = tokenizer.encode(&text)?;
    let options = GreedyOptions {
        max_tokens: args.max_tokens,
        eos_ids: tokenizer.eos_ids().to_vec(),
        ..GreedyOptions::default()
    };
    let prompts = std::slice::from_ref(&prompt);
    let config = cache_config_for(
        prompts,
        &options,
        usize::from(args.kv.block_size),
        !args.kv.no_prefix_cache,
    );
    let mut cache = KvCache::new(&loaded.model, config);
    let generation = generate_greedy_with(&loaded.model, &mut cache, prompts, &options)?
        .into_iter()
        .next()
        .context("no generation returned")?;
    let text = tokenizer.decode_skip_special(&generation.token_ids)?;
    // The first token comes from the prefill; decode steps produce the rest.
    let decoded = generation.token_ids.len().saturating_sub(1);
    let tokens_per_second = if generation.decode_seconds > 0.0 {
        decoded as f64 / generation.decode_seconds
    } else {
        0.0
    };
    if args.json {
        let out = serde_json::json!({
            "model": args.model.model,
            "prompt_token_ids": prompt,
            "token_ids": generation.token_ids,
            "text": text,
            "finish_reason": format!("{:?}", generation.finish).to_lowercase(),
            "prefill_seconds": generation.prefill_seconds,
            "decode_seconds": generation.decode_seconds,
            "tokens_per_second": tokens_per_second,
        });
        println!("{out}");
    } else {
        println!("{text}");
        eprintln!(
            "{} prompt tokens, {} generated, {:.1} tokens/s decode",
            prompt.len(),
            generation.token_ids.len(),
            tokens_per_second
        );
    }
    Ok(())
}

fn bench_forward(
    args: &ModelArgs,
    context: usize,
    sizes: &[usize],
    repeats: usize,
) -> anyhow::Result<()> {
    let loaded = load(args)?;
    let points = engine::bench::forward_cost(&loaded.model, context, sizes, repeats)?;
    let base = points.first().map(|p| p.seconds).unwrap_or(1.0);
    println!("| new tokens | ms / forward | x cost(1) | ms / token |");
    println!("|---:|---:|---:|---:|");
    for p in &points {
        println!(
            "| {} | {:.2} | {:.2} | {:.2} |",
            p.new_tokens,
            p.seconds * 1e3,
            p.seconds / base,
            p.seconds * 1e3 / p.new_tokens as f64
        );
    }
    Ok(())
}
