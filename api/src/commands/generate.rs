//! `thicket generate`: one prompt through the serving engine, text streamed to stdout as it
//! is produced (or one JSON object with `--json`). Greedy unless `--temperature` is set.

use std::io::Write;
use std::time::Instant;

use anyhow::{bail, Context};
use clap::Args;
use engine::{Event, LoadedModel, Request, SamplingParams, StopConditions};

use crate::args::{spawn, EngineArgs, ModelArgs};
use crate::chat::user_prompt;

/// Flags of `thicket generate`.
#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// Model flags.
    #[command(flatten)]
    pub model: ModelArgs,
    /// Engine flags.
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Prompt text.
    #[arg(long)]
    pub prompt: String,
    /// Wrap the prompt as a user message in the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// Tokens to generate at most.
    #[arg(long, default_value_t = 128)]
    pub max_tokens: usize,
    /// Sampling temperature (0 = greedy).
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Nucleus sampling: keep the most likely tokens up to this probability.
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Keep only the k most likely tokens.
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Seed for sampling (same seed, same output).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Strings that end generation (repeatable).
    #[arg(long)]
    pub stop: Vec<String>,
    /// Print one JSON object instead of streaming the text.
    #[arg(long)]
    pub json: bool,
}

/// Runs `thicket generate`.
pub fn run(loaded: &LoadedModel, args: &GenerateArgs) -> anyhow::Result<()> {
    if args.prompt.is_empty() {
        bail!("--prompt is empty: give some text to continue");
    }
    let tokenizer = &loaded.tokenizer;
    let text = if args.chat {
        if tokenizer.chat_template().is_none() {
            bail!(
                "--chat: this model has no chat template (a base model); leave out --chat to \
                 continue the prompt as raw text"
            );
        }
        user_prompt(tokenizer, &args.prompt).context("--chat")?
    } else {
        args.prompt.clone()
    };
    let prompt = tokenizer.encode(&text)?;
    let config = args.engine.config(&loaded.model)?;
    let (handle, _thread) = spawn(loaded, config)?;
    let request = Request {
        prompt: prompt.clone(),
        sampling: SamplingParams {
            temperature: args.temperature,
            top_p: args.top_p,
            top_k: args.top_k,
            seed: args.seed,
            ..SamplingParams::default()
        },
        stop: StopConditions {
            max_tokens: args.max_tokens,
            stop: args.stop.clone(),
            ..StopConditions::default()
        },
        n: 1,
        speculation: None,
        constraint: None,
        thinking: None,
        prediction: None,
        cache_salt: None,
        pooling: None,
    };
    let started = Instant::now();
    let stream = handle.submit(request)?;
    let mut token_ids = Vec::new();
    let mut output = String::new();
    let mut first_token = None;
    let mut finish = None;
    let mut usage = engine::Usage::default();
    let mut stdout = std::io::stdout().lock();
    while let Some(event) = stream.recv() {
        match event {
            Event::Output {
                token_ids: ids,
                text,
                ..
            } => {
                first_token.get_or_insert_with(|| started.elapsed().as_secs_f64());
                token_ids.extend(ids);
                if !args.json {
                    write!(stdout, "{text}")?;
                    stdout.flush()?;
                }
                output.push_str(&text);
            }
            Event::Finished {
                reason,
                usage: done,
                ..
            } => {
                finish = Some(reason);
                usage = done;
            }
            Event::Error(e) => bail!("generation failed: {e}"),
            Event::Pooled { .. } => bail!("the engine pooled a generation request"),
        }
    }
    let finish = finish.context("the engine stopped before the request finished")?;
    let total = started.elapsed().as_secs_f64();
    let first_token = first_token.unwrap_or(total);
    // The first token comes with the prefill; the rest are decode steps.
    let decoded = token_ids.len().saturating_sub(1);
    let decode_seconds = total - first_token;
    let tokens_per_second = if decode_seconds > 0.0 {
        decoded as f64 / decode_seconds
    } else {
        0.0
    };
    if args.json {
        let out = serde_json::json!({
            "model": args.model.model,
            "prompt_token_ids": prompt,
            "token_ids": token_ids,
            "text": output,
            "finish_reason": finish.as_openai(),
            "time_to_first_token_seconds": first_token,
            "decode_seconds": decode_seconds,
            "tokens_per_second": tokens_per_second,
            "speculation": {
                "verify_steps": usage.spec_steps,
                "draft_tokens": usage.draft_tokens,
                "accepted_tokens": usage.accepted_tokens,
                "mean_accepted_tokens": mean_accepted_tokens(&usage),
            },
            "mean_accepted_tokens": mean_accepted_tokens(&usage),
        });
        writeln!(stdout, "{out}")?;
    } else {
        writeln!(stdout)?;
        eprintln!(
            "{} prompt tokens, {} generated ({}), {:.1} tokens/s decode",
            prompt.len(),
            token_ids.len(),
            finish.as_openai(),
            tokens_per_second
        );
    }
    handle.shutdown();
    Ok(())
}

/// Tokens produced per verification step (accepted drafts plus the bonus token): the
/// papers' MAT. 1.0 when nothing was drafted.
pub fn mean_accepted_tokens(usage: &engine::Usage) -> f64 {
    if usage.spec_steps == 0 {
        return 1.0;
    }
    (usage.spec_steps + usage.accepted_tokens) as f64 / usage.spec_steps as f64
}
