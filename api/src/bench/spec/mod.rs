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

pub mod charts;
pub mod table;
pub mod workload;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};
use clap::Args;
use engine::{LoadedModel, SpecMethod};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::Serialize;

use super::harness::{read_timed, round_order, run_round, start_warm, BenchEngine, CONTROL};
use crate::args::{EngineArgs, ModelArgs};
use crate::server::{AppState, ServerConfig, DEFAULT_MAX_BODY_BYTES};
use table::{mat, print_table};
use workload::{load_questions, submit, Question, Selection};

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

/// One method's own engine (see [`BenchEngine`]), with the server's request path over it.
struct MethodEngine {
    method: SpecMethod,
    /// The method's name, or `none (control)` for the control engine.
    label: String,
    engine: BenchEngine,
    /// The server's request path over the engine, for questions given as request bodies.
    state: AppState,
}

impl MethodEngine {
    fn start(
        loaded: &LoadedModel,
        args: &SpecBenchArgs,
        (method, label): &(SpecMethod, String),
    ) -> anyhow::Result<Self> {
        let method = *method;
        let engine = start_warm(loaded, &args.engine, method)?;
        let state = AppState::new(ServerConfig {
            served_model_name: args.model.model.clone(),
            api_key: None,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            reasoning_parser: crate::server::Choice::Off,
            tool_call_parser: crate::server::Choice::Auto,
            template: Default::default(),
        });
        state.set_engine(engine.handle.clone());
        Ok(Self {
            method,
            label: label.clone(),
            engine,
            state,
        })
    }

    /// Runs `questions` all at once (one client each) and measures each (see
    /// [`run_round`]).
    fn run(&self, questions: &[Question], max_tokens: usize) -> anyhow::Result<Vec<Measurement>> {
        let (method, label) = (self.method, self.label.as_str());
        run_round(
            questions,
            |q| {
                submit(&self.state, &q.work, max_tokens, method)
                    .with_context(|| format!("question {}", q.id))
            },
            |q, started, stream| read(label, q, started, stream),
        )
    }

    fn stop(self) {
        self.engine.stop();
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
