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
//! run's noise floor. `--warm-up` measures twice, on fresh engines each time: cold, and warm,
//! where every engine first serves a set of warm-up questions disjoint from the measured ones
//! (untimed, under its own method), as a server that has been running would have; what
//! learns across requests (the recycling matrix, acceptance per source) then starts from
//! that traffic and never from the measured questions. `--out` writes every measurement as
//! JSON; `--plot-dir` draws acceptance by tree depth and MAT per method.

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
use crate::bench_spec_table::{mat, print_table};
use crate::bench_spec_workload::{load_questions, submit, Question, Selection};
use crate::chat::user_prompt;
use crate::cli::ModelArgs;
use crate::engine_args::EngineArgs;
use crate::server::{AppState, ServerConfig, DEFAULT_MAX_BODY_BYTES};

/// Flags of `thicket bench spec`.
#[derive(Debug, Args)]
pub struct SpecBenchArgs {
    /// Model flags.
    #[command(flatten)]
    pub model: ModelArgs,
    /// Engine flags (`--speculation` is ignored: every method in `--methods` runs).
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Questions (JSON lines): Spec-Bench's shape, BFCL's agent turns (`classes`,
    /// `turns`), chat bodies (`messages`, `tools`) or completions (`prompt`).
    #[arg(long, default_value = "benches/data/spec_bench_dev.jsonl")]
    pub dataset: PathBuf,
    /// `tool_choice` of the questions that offer tools and name none.
    #[arg(long, default_value = "required")]
    pub tool_choice: String,
    /// The tool sets named by the `classes` of agent turns.
    #[arg(long, default_value = "benches/data/bfcl_tool_sets.json")]
    pub tool_sets: PathBuf,
    /// Methods to compare; `none` is the baseline and always runs.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "none,recycling,ngram_trie,prompt_lookup,suffix,auto"
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
    /// Only the questions of these categories [default: all].
    #[arg(long, value_delimiter = ',')]
    pub categories: Vec<String>,
    /// Questions per category at most (measured, and warm-up unless
    /// `--warm-up-per-category` says otherwise).
    #[arg(long)]
    pub per_category: Option<usize>,
    /// Warm-up questions per category at most [default: `--per-category`]. A server that
    /// has been running has seen more than the measured set; `--warm-up half
    /// --warm-up-per-category 1000` serves the whole other half first.
    #[arg(long)]
    pub warm_up_per_category: Option<usize>,
    /// Also measure warm engines: `half` splits `--dataset` (each category's questions
    /// alternate between the measured set and the warm-up set), or a file of warm-up
    /// questions in Spec-Bench's shape. Every engine of the warm phase serves the warm-up
    /// set untimed first; the table then has each method cold and warm.
    #[arg(long)]
    pub warm_up: Option<String>,
    /// Where to write the JSON results.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Folder for charts of acceptance by tree depth and MAT per method (SVG and PNG).
    #[arg(long)]
    pub plot_dir: Option<PathBuf>,
}

/// One question under one method.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Measurement {
    pub question_id: serde_json::Value,
    pub category: String,
    pub method: String,
    pub output_tokens: usize,
    /// Submission to the last token.
    pub seconds: f64,
    /// Submission to the first token (its prefill, and its wait for the questions before it).
    pub ttft_seconds: f64,
    /// First token to the last (the generation phase the papers time).
    pub decode_seconds: f64,
    pub verify_steps: usize,
    pub draft_tokens: usize,
    pub accepted_tokens: usize,
}

/// The measured questions and the warm-up ones (none without `--warm-up`).
fn question_sets(
    args: &SpecBenchArgs,
    loaded: &LoadedModel,
) -> anyhow::Result<(Vec<Question>, Vec<Question>)> {
    let load = |path: &std::path::Path, split, per_category| {
        let selection = Selection {
            per_category,
            categories: &args.categories,
            split,
            tool_choice: &args.tool_choice,
            tool_sets: &args.tool_sets,
        };
        load_questions(path, &selection, loaded)
    };
    let measured = args.per_category;
    let warm = args.warm_up_per_category.or(args.per_category);
    match args.warm_up.as_deref() {
        None => Ok((load(&args.dataset, (1, 0), measured)?, Vec::new())),
        Some("half") => Ok((
            load(&args.dataset, (2, 0), measured)?,
            load(&args.dataset, (2, 1), warm)?,
        )),
        Some(file) => Ok((
            load(&args.dataset, (1, 0), measured)?,
            load(std::path::Path::new(file), (1, 0), warm)?,
        )),
    }
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
    /// The server's request path over `handle`, for questions given as request bodies.
    state: AppState,
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
        let state = AppState::new(ServerConfig {
            served_model_name: args.model.model.clone(),
            api_key: None,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
        });
        state.set_engine(handle.clone());
        Ok(Self {
            method,
            label: label.clone(),
            handle,
            state,
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
                let started = Instant::now();
                let stream = submit(&self.state, &q.work, max_tokens, method)
                    .with_context(|| format!("question {}", q.id))?;
                Ok((q, started, stream))
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

/// What one phase (cold, or warm) measured: every measurement, and per engine its wall time
/// and acceptance by depth.
struct Phase {
    results: Vec<Measurement>,
    busy: Vec<f64>,
    depth: Vec<(String, charts::DepthCounts)>,
}

/// Runs `questions` through a fresh engine per `(method, label)`, interleaved; each engine
/// first serves `warm_up` untimed.
fn run_phase(
    loaded: &LoadedModel,
    args: &SpecBenchArgs,
    methods: &[(SpecMethod, String)],
    questions: &[Question],
    warm_up: &[Question],
    counters: Option<&metrics_exporter_prometheus::PrometheusHandle>,
) -> anyhow::Result<Phase> {
    let engines = methods
        .iter()
        .map(|m| MethodEngine::start(loaded, args, m))
        .collect::<anyhow::Result<Vec<_>>>()?;
    for engine in &engines {
        for batch in warm_up.chunks(args.concurrency.max(1)) {
            engine.run(batch, args.max_tokens)?;
        }
    }
    let mut phase = Phase {
        results: Vec::new(),
        busy: vec![0f64; methods.len()],
        depth: methods
            .iter()
            .map(|(_, label)| (label.clone(), charts::DepthCounts::default()))
            .collect(),
    };
    // Rounds of `concurrency` questions; every method runs a round on its own engine before
    // the next round starts, in an order that puts every method as often early as late (see
    // `round_order`), so the host's noise falls on every method alike.
    for (round, batch) in questions.chunks(args.concurrency.max(1)).enumerate() {
        for i in round_order(round, engines.len()) {
            let before = counters.map(charts::snapshot);
            let started = Instant::now();
            phase
                .results
                .extend(engines[i].run(batch, args.max_tokens)?);
            phase.busy[i] += started.elapsed().as_secs_f64();
            if let (Some(handle), Some(before)) = (counters, before) {
                phase.depth[i]
                    .1
                    .add(&charts::snapshot(handle).since(&before));
            }
        }
    }
    for (engine, seconds) in engines.into_iter().zip(&phase.busy) {
        eprintln!(
            "{}: {} questions in {seconds:.1}s",
            engine.label,
            questions.len()
        );
        engine.stop();
    }
    Ok(phase)
}

/// Runs the bench and prints the table (with `--warm-up`, one per phase).
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
    let (mut questions, mut warm_up) = question_sets(args, loaded)?;
    if args.concurrency > 1 {
        // Spec-Bench files run category by category; in rounds of many questions that would
        // make some rounds several times longer than others (long-context categories), and
        // a long round weighs its few places in the methods' order heavily.
        let mut rng = rand::rngs::StdRng::seed_from_u64(SHUFFLE_SEED);
        questions.shuffle(&mut rng);
        warm_up.shuffle(&mut rng);
    }
    // Without a warm-up set, one phase on cold engines under the methods' own names; with
    // one, a cold and a warm phase, each method's label saying which.
    let phases: Vec<(Option<&str>, &[Question])> = if warm_up.is_empty() {
        vec![(None, &[])]
    } else {
        vec![(Some("cold"), &[]), (Some("warm"), warm_up.as_slice())]
    };
    // The engines' counters give acceptance by depth, for the charts and the report alike.
    let counters = (args.plot_dir.is_some() || args.out.is_some()).then(crate::server::prometheus);
    let categories: Vec<String> = {
        let mut c: Vec<String> = questions.iter().map(|q| q.category.clone()).collect();
        c.sort();
        c.dedup();
        c
    };
    let mut results: Vec<Measurement> = Vec::new();
    let mut labelled: Vec<(SpecMethod, String)> = Vec::new();
    let mut busy: Vec<f64> = Vec::new();
    let mut depth: Vec<(String, charts::DepthCounts)> = Vec::new();
    for (name, warm_up) in phases {
        let these: Vec<(SpecMethod, String)> = methods
            .iter()
            .map(|(m, label)| match name {
                Some(name) => (*m, format!("{label} ({name})")),
                None => (*m, label.clone()),
            })
            .collect();
        let phase = run_phase(loaded, args, &these, &questions, warm_up, counters.as_ref())?;
        if let Some(name) = name {
            println!(
                "\n{name}: fresh engines{}",
                if warm_up.is_empty() {
                    String::new()
                } else {
                    format!(", each first served {} warm-up questions", warm_up.len())
                }
            );
        }
        print_table(&these, &categories, &phase.results, &phase.busy);
        results.extend(phase.results);
        busy.extend(phase.busy);
        depth.extend(phase.depth);
        labelled.extend(these);
    }
    if let Some(dir) = &args.plot_dir {
        let mats: Vec<(String, f64)> = labelled
            .iter()
            .map(|(_, label)| {
                let all: Vec<&Measurement> =
                    results.iter().filter(|m| &m.method == label).collect();
                (label.clone(), mat(&all))
            })
            .collect();
        charts::draw(dir, &depth, &mats)?;
        eprintln!("charts: {}", dir.display());
    }
    if let Some(path) = &args.out {
        let json = serde_json::json!({
            "model": args.model.model,
            "max_tokens": args.max_tokens,
            "concurrency": args.concurrency,
            "warm_up_questions": warm_up.len(),
            "measurements": results,
            "wall_seconds": labelled
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
