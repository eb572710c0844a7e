//! `thicket bench spec`: every question of a Spec-Bench file (`question_id`, `category`,
//! `turns`; the first turn, in the chat template) through each speculation method, greedy,
//! and the Token Recycling paper's Table 1 layout: per category the speedup over `none`,
//! then MAT (tokens per verification step), decoding tokens/s (after the first token, as the
//! papers time generation) and overall speedup. Each method
//! runs on a fresh engine, so the Token Recycling matrix warms up over the questions as in
//! the paper's hot start. `--out` writes every measurement as JSON; `--plot-dir` draws
//! acceptance by tree depth and MAT per method.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};
use clap::Args;
use engine::{
    Event, LoadedModel, Request, SamplingParams, SpecMethod, SpecRequest, StopConditions,
};
use serde::Serialize;

use crate::bench_spec_charts as charts;
use crate::chat::user_prompt;
use crate::cli::ModelArgs;
use crate::engine_args::EngineArgs;

/// Flags of `thicket bench spec`.
#[derive(Debug, Args)]
pub struct SpecBenchArgs {
    /// Model flags.
    #[command(flatten)]
    pub model: ModelArgs,
    /// Engine flags (`--speculation` is ignored: every method in `--methods` runs).
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Spec-Bench questions (JSON lines).
    #[arg(long, default_value = "benches/data/spec_bench_dev.jsonl")]
    pub dataset: PathBuf,
    /// Methods to compare; `none` is the baseline and always runs.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "none,recycling,ngram_trie,prompt_lookup,auto"
    )]
    pub methods: Vec<String>,
    /// Output tokens per question at most.
    #[arg(long, default_value_t = 128)]
    pub max_tokens: usize,
    /// Questions in flight at once.
    #[arg(long, default_value_t = 1)]
    pub concurrency: usize,
    /// Questions per category at most.
    #[arg(long)]
    pub per_category: Option<usize>,
    /// Where to write the JSON results.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Folder for charts of acceptance by tree depth and MAT per method (SVG and PNG).
    #[arg(long)]
    pub plot_dir: Option<PathBuf>,
}

#[derive(Debug, Clone)]
struct Question {
    id: serde_json::Value,
    category: String,
    prompt: Vec<u32>,
}

/// One question under one method.
#[derive(Debug, Clone, Serialize)]
struct Measurement {
    question_id: serde_json::Value,
    category: String,
    method: String,
    output_tokens: usize,
    /// Submission to the last token.
    seconds: f64,
    /// First token to the last (the generation phase the papers time).
    decode_seconds: f64,
    verify_steps: usize,
    draft_tokens: usize,
    accepted_tokens: usize,
}

fn load_questions(args: &SpecBenchArgs, loaded: &LoadedModel) -> anyhow::Result<Vec<Question>> {
    let text = std::fs::read_to_string(&args.dataset)
        .with_context(|| format!("reading {}", args.dataset.display()))?;
    let mut per_category: BTreeMap<String, usize> = BTreeMap::new();
    let mut questions = Vec::new();
    for (n, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let value: serde_json::Value = serde_json::from_str(line)
            .with_context(|| format!("{} line {}", args.dataset.display(), n + 1))?;
        let category = value["category"]
            .as_str()
            .unwrap_or("uncategorized")
            .to_string();
        let Some(turn) = value["turns"].get(0).and_then(|t| t.as_str()) else {
            bail!("{} line {}: no turns", args.dataset.display(), n + 1);
        };
        let count = per_category.entry(category.clone()).or_default();
        if args.per_category.is_some_and(|limit| *count >= limit) {
            continue;
        }
        *count += 1;
        let prompt = loaded
            .tokenizer
            .encode(&user_prompt(&loaded.tokenizer, turn)?)?;
        questions.push(Question {
            id: value["question_id"].clone(),
            category,
            prompt,
        });
    }
    if questions.is_empty() {
        bail!("{} holds no question", args.dataset.display());
    }
    Ok(questions)
}

fn run_method(
    loaded: &LoadedModel,
    args: &SpecBenchArgs,
    method: SpecMethod,
    questions: &Arc<Vec<Question>>,
) -> anyhow::Result<Vec<Measurement>> {
    let mut engine_args = args.engine.clone();
    engine_args.spec.speculation = method;
    let config = engine_args.config(&loaded.model)?;
    let (handle, thread) = engine::spawn(
        loaded.model.clone(),
        Arc::new(loaded.tokenizer.clone()),
        loaded.tokenizer.eos_ids().to_vec(),
        config,
    )?;
    // Warm-up (weights paged in, allocator settled): the first question, untimed.
    if let Some(q) = questions.first() {
        let warm = Request {
            prompt: q.prompt.clone(),
            sampling: SamplingParams::greedy(),
            stop: StopConditions {
                max_tokens: 4,
                ..StopConditions::default()
            },
            n: 1,
            speculation: None,
        };
        handle.submit(warm)?.wait().map_err(anyhow::Error::msg)?;
    }
    let next = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..args.concurrency.max(1))
        .map(|_| {
            let (handle, next, questions) = (handle.clone(), next.clone(), questions.clone());
            let max_tokens = args.max_tokens;
            std::thread::spawn(move || -> anyhow::Result<Vec<Measurement>> {
                let mut done = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some(q) = questions.get(i) else {
                        return Ok(done);
                    };
                    let request = Request {
                        prompt: q.prompt.clone(),
                        sampling: SamplingParams::greedy(),
                        stop: StopConditions {
                            max_tokens,
                            ..StopConditions::default()
                        },
                        n: 1,
                        speculation: Some(SpecRequest {
                            method,
                            max_draft_tokens: None,
                        }),
                    };
                    let started = Instant::now();
                    let stream = handle.submit(request)?;
                    let (mut first, mut tokens, mut usage) = (None, 0, None);
                    while let Some(event) = stream.recv() {
                        match event {
                            Event::Output { token_ids, .. } => {
                                first.get_or_insert_with(|| started.elapsed().as_secs_f64());
                                tokens += token_ids.len();
                            }
                            Event::Finished { usage: u, .. } => usage = Some(u),
                            Event::Error(e) => bail!("question {}: {e}", q.id),
                        }
                    }
                    let usage = usage.context("the engine stopped early")?;
                    let seconds = started.elapsed().as_secs_f64();
                    let first = first.unwrap_or(seconds);
                    done.push(Measurement {
                        question_id: q.id.clone(),
                        category: q.category.clone(),
                        method: method.as_str().to_string(),
                        output_tokens: tokens,
                        seconds,
                        decode_seconds: seconds - first,
                        verify_steps: usage.spec_steps,
                        draft_tokens: usage.draft_tokens,
                        accepted_tokens: usage.accepted_tokens,
                    });
                }
            })
        })
        .collect();
    let mut all = Vec::new();
    for worker in workers {
        all.extend(
            worker
                .join()
                .map_err(|_| anyhow::anyhow!("a bench worker panicked"))??,
        );
    }
    handle.shutdown();
    let _ = thread.join();
    Ok(all)
}

/// Decoding speed: tokens after the first over the time after the first token.
fn tokens_per_second(ms: &[&Measurement]) -> f64 {
    let tokens: usize = ms.iter().map(|m| m.output_tokens.saturating_sub(1)).sum();
    let seconds: f64 = ms.iter().map(|m| m.decode_seconds).sum();
    tokens as f64 / seconds.max(1e-9)
}

fn mat(ms: &[&Measurement]) -> f64 {
    let steps: usize = ms.iter().map(|m| m.verify_steps).sum();
    let accepted: usize = ms.iter().map(|m| m.accepted_tokens).sum();
    if steps == 0 {
        1.0
    } else {
        (steps + accepted) as f64 / steps as f64
    }
}

/// Runs the bench and prints the table.
pub fn run(loaded: &LoadedModel, args: &SpecBenchArgs) -> anyhow::Result<()> {
    let mut methods = vec![SpecMethod::None];
    for name in &args.methods {
        match SpecMethod::parse(name) {
            Some(SpecMethod::None) => {}
            Some(SpecMethod::DraftModel) if args.engine.spec.draft_model.is_none() => {
                bail!("method draft_model needs --draft-model")
            }
            None => bail!("unknown method '{name}'"),
            Some(m) => methods.push(m),
        }
    }
    let questions = Arc::new(load_questions(args, loaded)?);
    let mut results: Vec<Measurement> = Vec::new();
    let counters = args.plot_dir.as_ref().map(|_| crate::server::prometheus());
    let mut depth = Vec::new();
    for &method in &methods {
        let started = Instant::now();
        let before = counters.as_ref().map(charts::snapshot);
        let ms = run_method(loaded, args, method, &questions)?;
        if let (Some(handle), Some(before)) = (&counters, before) {
            let counts = charts::snapshot(handle).since(&before);
            depth.push((method.as_str().to_string(), counts));
        }
        eprintln!(
            "{}: {} questions in {:.1}s",
            method.as_str(),
            ms.len(),
            started.elapsed().as_secs_f64()
        );
        results.extend(ms);
    }
    let categories: Vec<String> = {
        let mut c: Vec<String> = questions.iter().map(|q| q.category.clone()).collect();
        c.sort();
        c.dedup();
        c
    };
    let select = |method: SpecMethod, category: Option<&str>| -> Vec<&Measurement> {
        results
            .iter()
            .filter(|m| m.method == method.as_str())
            .filter(|m| category.is_none_or(|c| m.category == c))
            .collect()
    };
    print!("| method |");
    for c in &categories {
        print!(" {c} |");
    }
    println!(" MAT | tokens/s | speedup |");
    print!("|---|");
    for _ in &categories {
        print!("---:|");
    }
    println!("---:|---:|---:|");
    let base_all = tokens_per_second(&select(SpecMethod::None, None));
    for &method in &methods {
        print!("| {} |", method.as_str());
        for c in &categories {
            let base = tokens_per_second(&select(SpecMethod::None, Some(c)));
            let rate = tokens_per_second(&select(method, Some(c)));
            print!(" {:.2}x |", rate / base);
        }
        let all = select(method, None);
        let rate = tokens_per_second(&all);
        println!(
            " {:.2} | {:.1} | {:.2}x |",
            mat(&all),
            rate,
            rate / base_all
        );
    }
    if let Some(dir) = &args.plot_dir {
        let mats: Vec<(String, f64)> = methods
            .iter()
            .map(|&m| (m.as_str().to_string(), mat(&select(m, None))))
            .collect();
        charts::draw(dir, &depth, &mats)?;
        eprintln!("charts: {}", dir.display());
    }
    if let Some(path) = &args.out {
        let json = serde_json::json!({
            "model": args.model.model,
            "max_tokens": args.max_tokens,
            "concurrency": args.concurrency,
            "measurements": results,
            "acceptance_by_depth": depth,
        });
        std::fs::write(path, serde_json::to_string_pretty(&json)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
