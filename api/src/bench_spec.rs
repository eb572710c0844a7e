//! `thicket bench spec`: every question of a Spec-Bench file (`question_id`, `category`,
//! `turns`; the first turn, in the chat template) through each speculation method, greedy,
//! and the Token Recycling paper's Table 1 layout: per category the speedup over `none`,
//! then MAT (tokens per verification step), decoding tokens/s (after the first token, as the
//! papers time generation) and overall speedup; then the speedups a user also sees, in mean
//! time to the first token and end to end (each engine's wall time over all its rounds,
//! prefill included). Each method runs on its own fresh engine (warmed up on one prompt
//! outside the set), so no method reads another's prefixes from the prefix cache or its
//! continuations from the recycling matrix, while the Token Recycling matrix still warms up
//! over the questions as in the paper's hot start. The methods are interleaved question by
//! question (rounds of `--concurrency` questions, each method as often early in a round as
//! late; with several at once, the questions shuffled so that rounds mix categories), so the
//! host's noise falls on all of them alike, and every engine's KV cache is mapped before the
//! timing starts; `--control` adds a second `none` engine whose ratio to the first is the
//! run's noise floor. `--out` writes every measurement as JSON;
//! `--plot-dir` draws acceptance by tree depth and MAT per method.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};
use clap::Args;
use engine::{Event, LoadedModel, Request, SpecMethod};
use rand::seq::SliceRandom;
use rand::SeedableRng;
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
    /// Also run a second `none` engine, reported as `none (control)`: its ratio to `none`
    /// is the noise floor of the run (two identical setups differ only by the host's
    /// noise and their place in each round).
    #[arg(long)]
    pub control: bool,
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
    /// Submission to the first token (its prefill, and its wait for the questions before it).
    ttft_seconds: f64,
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

/// A prompt outside every Spec-Bench file, for each engine's untimed warm-up: it pages the
/// weights in and settles the allocator without putting any question's prefix in the cache
/// or its continuation in the recycling matrix.
const WARM_UP: &str = "List the days of the week.";

/// The label of the second `none` engine (`--control`).
const CONTROL: &str = "none (control)";

/// Starts an engine of `engine_args` drafting with `method` by default, with its KV cache
/// mapped, warmed up untimed on [`WARM_UP`].
pub(crate) fn start_warm(
    loaded: &LoadedModel,
    engine_args: &EngineArgs,
    method: SpecMethod,
) -> anyhow::Result<(engine::EngineHandle, std::thread::JoinHandle<()>)> {
    let mut engine_args = engine_args.clone();
    engine_args.spec.speculation = method;
    // Every engine's pages mapped before the timing starts: otherwise each pays the OS's
    // first touch of its pool inside its rounds, and what a first touch costs varies with
    // what the host did before (on one host the same round took 10% longer at some places
    // in the rotation than at others).
    engine_args.kv.kv_prefault = true;
    let config = engine_args.config(&loaded.model)?;
    let (handle, thread) = engine::spawn(
        loaded.model.clone(),
        Arc::new(loaded.tokenizer.clone()),
        loaded.tokenizer.eos_ids().to_vec(),
        config,
    )?;
    let prompt = loaded
        .tokenizer
        .encode(&user_prompt(&loaded.tokenizer, WARM_UP)?)?;
    let warm = Request::greedy(prompt, 8, Some(method));
    handle.submit(warm)?.wait().map_err(anyhow::Error::msg)?;
    Ok((handle, thread))
}

/// One request's stream read to its end, timed from its submission.
pub(crate) struct Timed {
    /// Its text.
    pub text: String,
    /// Its tokens.
    pub tokens: usize,
    /// Submission to the last token.
    pub seconds: f64,
    /// Submission to the first token.
    pub ttft_seconds: f64,
    /// Its usage.
    pub usage: engine::Usage,
}

/// Reads `stream` (submitted at `started`) to its end.
pub(crate) fn read_timed(started: Instant, stream: engine::RequestStream) -> anyhow::Result<Timed> {
    let (mut first, mut tokens, mut text, mut usage) = (None, 0, String::new(), None);
    while let Some(event) = stream.recv() {
        match event {
            Event::Output {
                token_ids, text: t, ..
            } => {
                first.get_or_insert_with(|| started.elapsed().as_secs_f64());
                tokens += token_ids.len();
                text.push_str(&t);
            }
            Event::Finished { usage: u, .. } => usage = Some(u),
            Event::Error(e) => bail!("{e}"),
        }
    }
    let usage = usage.context("the engine stopped early")?;
    let seconds = started.elapsed().as_secs_f64();
    Ok(Timed {
        text,
        tokens,
        seconds,
        ttft_seconds: first.unwrap_or(seconds),
        usage,
    })
}

/// One method's own engine, alive for the whole bench so that questions can be interleaved
/// across methods while each method still sees only its own traffic.
struct MethodEngine {
    method: SpecMethod,
    /// The method's name, or `none (control)` for the control engine.
    label: String,
    handle: engine::EngineHandle,
    thread: std::thread::JoinHandle<()>,
}

impl MethodEngine {
    fn start(
        loaded: &LoadedModel,
        args: &SpecBenchArgs,
        (method, label): &(SpecMethod, String),
    ) -> anyhow::Result<Self> {
        let method = *method;
        let (handle, thread) = start_warm(loaded, &args.engine, method)?;
        Ok(Self {
            method,
            label: label.clone(),
            handle,
            thread,
        })
    }

    /// Runs `questions` all at once (one client each) and measures each. Every question is
    /// submitted before any stream is read, so each round reaches the engine in the same
    /// order and at once for every method (threads started one by one would let the engine
    /// begin with whichever few had arrived, and the prefill order would vary by method).
    fn run(&self, questions: &[Question], max_tokens: usize) -> anyhow::Result<Vec<Measurement>> {
        let (method, label) = (self.method, self.label.as_str());
        let submitted = questions
            .iter()
            .map(|q| {
                let request = Request::greedy(q.prompt.clone(), max_tokens, Some(method));
                Ok((q, Instant::now(), self.handle.submit(request)?))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        std::thread::scope(|scope| {
            let readers: Vec<_> = submitted
                .into_iter()
                .map(|(q, started, stream)| scope.spawn(move || read(label, q, started, stream)))
                .collect();
            readers
                .into_iter()
                .map(|w| {
                    w.join()
                        .map_err(|_| anyhow::anyhow!("a bench reader panicked"))?
                })
                .collect()
        })
    }

    fn stop(self) {
        self.handle.shutdown();
        let _ = self.thread.join();
    }
}

/// Reads the stream of question `q` (submitted at `started` to the engine `label`) to its
/// end.
fn read(
    label: &str,
    q: &Question,
    started: Instant,
    stream: engine::RequestStream,
) -> anyhow::Result<Measurement> {
    let timed = read_timed(started, stream).with_context(|| format!("question {}", q.id))?;
    Ok(Measurement {
        question_id: q.id.clone(),
        category: q.category.clone(),
        method: label.to_string(),
        output_tokens: timed.tokens,
        seconds: timed.seconds,
        ttft_seconds: timed.ttft_seconds,
        decode_seconds: timed.seconds - timed.ttft_seconds,
        verify_steps: timed.usage.spec_steps,
        draft_tokens: timed.usage.draft_tokens,
        accepted_tokens: timed.usage.accepted_tokens,
    })
}

/// Decoding speed: tokens after the first over the time after the first token.
fn tokens_per_second(ms: &[&Measurement]) -> f64 {
    let tokens: usize = ms.iter().map(|m| m.output_tokens.saturating_sub(1)).sum();
    let seconds: f64 = ms.iter().map(|m| m.decode_seconds).sum();
    tokens as f64 / seconds.max(1e-9)
}

/// Mean time to the first token.
fn mean_ttft(ms: &[&Measurement]) -> f64 {
    ms.iter().map(|m| m.ttft_seconds).sum::<f64>() / ms.len().max(1) as f64
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

/// The order in which `engines` engines run round `round`. Rounds go in pairs: the second
/// of a pair runs the first's order backwards, so over each pair every engine's two places
/// add up to the same (a host that slows down or speeds up along a round weighs on all
/// alike, however few the rounds), and the order rotates by one from pair to pair.
pub(crate) fn round_order(round: usize, engines: usize) -> Vec<usize> {
    let pair = round / 2;
    let order = (0..engines).map(move |turn| (pair + turn) % engines);
    if round.is_multiple_of(2) {
        order.collect()
    } else {
        order.rev().collect()
    }
}

/// Seed of the questions' order when several run at once.
const SHUFFLE_SEED: u64 = 17;

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
    let mut methods: Vec<(SpecMethod, String)> = methods
        .into_iter()
        .map(|m| (m, m.as_str().to_string()))
        .collect();
    if args.control {
        methods.push((SpecMethod::None, CONTROL.to_string()));
    }
    let mut questions = load_questions(args, loaded)?;
    if args.concurrency > 1 {
        // Spec-Bench files run category by category; in rounds of many questions that would
        // make some rounds several times longer than others (long-context categories), and
        // a long round weighs its few places in the methods' order heavily.
        questions.shuffle(&mut rand::rngs::StdRng::seed_from_u64(SHUFFLE_SEED));
    }
    let counters = args.plot_dir.as_ref().map(|_| crate::server::prometheus());
    let engines = methods
        .iter()
        .map(|m| MethodEngine::start(loaded, args, m))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut results: Vec<Measurement> = Vec::new();
    let mut depth: Vec<(String, charts::DepthCounts)> = methods
        .iter()
        .map(|(_, label)| (label.clone(), charts::DepthCounts::default()))
        .collect();
    let mut busy = vec![0f64; methods.len()];
    // Rounds of `concurrency` questions; every method runs a round on its own engine before
    // the next round starts, in an order that puts every method as often early as late (see
    // `round_order`), so the host's noise falls on every method alike.
    for (round, batch) in questions.chunks(args.concurrency.max(1)).enumerate() {
        for i in round_order(round, engines.len()) {
            let before = counters.as_ref().map(charts::snapshot);
            let started = Instant::now();
            results.extend(engines[i].run(batch, args.max_tokens)?);
            busy[i] += started.elapsed().as_secs_f64();
            if let (Some(handle), Some(before)) = (&counters, before) {
                depth[i].1.add(&charts::snapshot(handle).since(&before));
            }
        }
    }
    for (engine, seconds) in engines.into_iter().zip(&busy) {
        eprintln!(
            "{}: {} questions in {seconds:.1}s",
            engine.label,
            questions.len()
        );
        engine.stop();
    }
    let categories: Vec<String> = {
        let mut c: Vec<String> = questions.iter().map(|q| q.category.clone()).collect();
        c.sort();
        c.dedup();
        c
    };
    let select = |label: &str, category: Option<&str>| -> Vec<&Measurement> {
        results
            .iter()
            .filter(|m| m.method == label)
            .filter(|m| category.is_none_or(|c| m.category == c))
            .collect()
    };
    print!("| method |");
    for c in &categories {
        print!(" {c} |");
    }
    println!(" MAT | tokens/s | speedup | TTFT | end to end |");
    print!("|---|");
    for _ in &categories {
        print!("---:|");
    }
    println!("---:|---:|---:|---:|---:|");
    let base = select(SpecMethod::None.as_str(), None);
    let (base_all, base_ttft) = (tokens_per_second(&base), mean_ttft(&base));
    // `none` is always the first engine (see the top of `run`).
    let base_busy = busy[0];
    for ((_, label), busy) in methods.iter().zip(&busy) {
        let label = label.as_str();
        print!("| {label} |");
        for c in &categories {
            let base = tokens_per_second(&select(SpecMethod::None.as_str(), Some(c)));
            let rate = tokens_per_second(&select(label, Some(c)));
            print!(" {:.2}x |", rate / base);
        }
        let all = select(label, None);
        let rate = tokens_per_second(&all);
        // TTFT and end to end as speedups too (the baseline's time over this method's), so
        // that above 1 is better in every column.
        println!(
            " {:.2} | {:.1} | {:.2}x | {:.2}x | {:.2}x |",
            mat(&all),
            rate,
            rate / base_all,
            base_ttft / mean_ttft(&all).max(1e-9),
            base_busy / busy.max(1e-9)
        );
    }
    if let Some(dir) = &args.plot_dir {
        let mats: Vec<(String, f64)> = methods
            .iter()
            .map(|(_, label)| (label.clone(), mat(&select(label, None))))
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
            "wall_seconds": methods
                .iter()
                .zip(&busy)
                .map(|((_, label), seconds)| (label.clone(), *seconds))
                .collect::<BTreeMap<_, _>>(),
            "acceptance_by_depth": depth,
        });
        std::fs::write(path, serde_json::to_string_pretty(&json)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::round_order;

    #[test]
    fn every_engine_runs_as_often_early_as_late() {
        for engines in 1..=7 {
            let mut places = vec![0; engines];
            for round in 0..2 * engines {
                let order = round_order(round, engines);
                let mut sorted = order.clone();
                sorted.sort();
                assert_eq!(sorted, (0..engines).collect::<Vec<_>>(), "a permutation");
                for (place, &engine) in order.iter().enumerate() {
                    places[engine] += place;
                }
                if !round.is_multiple_of(2) {
                    // After each pair of rounds every engine's places add up alike.
                    let each = round.div_ceil(2) * (engines - 1);
                    assert_eq!(
                        places,
                        vec![each; engines],
                        "{engines} engines, round {round}"
                    );
                }
            }
        }
        // The first place rotates from pair to pair.
        let firsts: Vec<usize> = (0..8).map(|r| round_order(r, 3)[0]).collect();
        assert_eq!(firsts, [0, 2, 1, 0, 2, 1, 0, 2]);
    }
}
