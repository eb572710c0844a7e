//! `thicket bench edits`: real one-file code edits (`benches/data/code_edits.jsonl`, built
//! from public repositories' histories by `benches/code_edits.py`) sent as an editor sends
//! them: one chat message with the instruction (the commit's subject) and the whole file,
//! asking for the whole updated file only, greedy, `max_tokens` well above the file's
//! length, and under configurations such as `auto+prediction` the file before as the
//! request's `prediction`. Each configuration (`none`, a method, a method `+prediction`,
//! and with `--control` a second `none`) runs on its own fresh engine, warmed up on a prompt
//! outside the set, the edits interleaved edit by edit in rounds of `--concurrency`, each
//! engine as often early in a round as late (the harness's `round_order`).
//!
//! The table gives per configuration: decoding speedup (tokens after the first over the
//! time after the first token, against `none`), end-to-end speedup (each engine's wall
//! time), TTFT speedup, the share of time spent before the first token, MAT, the ceiling
//! (the decoding speedup had every drafted token been accepted, at the step costs this run
//! measured), the prediction tokens accepted and rejected, and how many outputs equal the
//! commit's file after (code fences and trailing whitespace stripped).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};
use clap::Args;
use engine::{LoadedModel, Request, SpecMethod};
use serde::Serialize;

use super::harness::{read_timed, round_order, run_round, start_warm, CONTROL};
use crate::args::{EngineArgs, ModelArgs};
use crate::chat::user_prompt;

/// Flags of `thicket bench edits`.
#[derive(Debug, Args)]
pub struct EditBenchArgs {
    /// Model flags.
    #[command(flatten)]
    pub model: ModelArgs,
    /// Engine flags (`--speculation` is ignored: each configuration sets its own).
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Code edits (JSON lines: `instruction`, `path`, `language`, `before`, `after`).
    #[arg(long, default_value = "benches/data/code_edits.jsonl")]
    pub dataset: PathBuf,
    /// Configurations: a method, or a method with `+prediction` (the file before as the
    /// request's prediction); `none` is the baseline and always runs first.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "none,auto,auto+prediction"
    )]
    pub configs: Vec<String>,
    /// Also run a second `none` engine, reported as `none (control)`: the run's noise floor.
    #[arg(long)]
    pub control: bool,
    /// Edits in flight at once.
    #[arg(long, default_value_t = 1)]
    pub concurrency: usize,
    /// Use the first N edits only.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Skip the first N edits (with `--limit`, to run a set in parts).
    #[arg(long, default_value_t = 0)]
    pub skip: usize,
    /// Take every Nth edit only (a sample across every repository of the set).
    #[arg(long, default_value_t = 1)]
    pub every: usize,
    /// Where to write every measurement as JSON.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// One edit, tokenized.
struct Edit {
    id: String,
    prompt: Vec<u32>,
    prediction: Arc<[u32]>,
    max_tokens: usize,
    after: String,
}

/// One configuration: a method, with or without the prediction.
#[derive(Debug, Clone)]
struct Config {
    label: String,
    method: SpecMethod,
    prediction: bool,
}

/// One edit under one configuration.
#[derive(Debug, Clone, Serialize)]
struct Measurement {
    edit: String,
    config: String,
    output_tokens: usize,
    seconds: f64,
    ttft_seconds: f64,
    decode_seconds: f64,
    verify_steps: usize,
    draft_tokens: usize,
    accepted_tokens: usize,
    accepted_prediction_tokens: usize,
    rejected_prediction_tokens: usize,
    equals_reference: bool,
}

/// The request text: the instruction and the whole file, asking for the whole file back.
fn edit_prompt(instruction: &str, path: &str, language: &str, before: &str) -> String {
    format!(
        "{instruction}\n\nApply this change to the file `{path}` below. Reply with the whole \
         updated file only.\n\n```{language}\n{before}```"
    )
}

/// `text` without a surrounding code fence and without trailing whitespace on any line or
/// at the end.
pub fn normalized(text: &str) -> String {
    let mut lines: Vec<&str> = text.trim().lines().collect();
    if lines
        .first()
        .is_some_and(|l| l.trim_start().starts_with("```"))
    {
        lines.remove(0);
        if let Some(end) = lines.iter().rposition(|l| l.trim() == "```") {
            lines.truncate(end);
        }
    }
    let joined: Vec<&str> = lines.iter().map(|l| l.trim_end()).collect();
    joined.join("\n").trim_end().to_string()
}

fn load_edits(args: &EditBenchArgs, loaded: &LoadedModel) -> anyhow::Result<Vec<Edit>> {
    let text = std::fs::read_to_string(&args.dataset)
        .with_context(|| format!("reading {}", args.dataset.display()))?;
    let tokenizer = &loaded.tokenizer;
    let max_len = args.engine.config(&loaded.model)?.scheduler.max_model_len;
    let mut edits = Vec::new();
    let lines = text.lines().filter(|l| !l.trim().is_empty());
    for (n, line) in lines.enumerate().skip(args.skip).step_by(args.every.max(1)) {
        if args.limit.is_some_and(|limit| edits.len() >= limit) {
            break;
        }
        let value: serde_json::Value = serde_json::from_str(line)
            .with_context(|| format!("{} line {}", args.dataset.display(), n + 1))?;
        let field = |name: &str| -> anyhow::Result<&str> {
            value[name]
                .as_str()
                .with_context(|| format!("{} line {}: no {name}", args.dataset.display(), n + 1))
        };
        let before = field("before")?;
        let text = edit_prompt(
            field("instruction")?,
            field("path")?,
            field("language")?,
            before,
        );
        let prompt = tokenizer.encode(&user_prompt(tokenizer, &text)?)?;
        let prediction: Arc<[u32]> = tokenizer.encode_plain(before)?.into();
        // Well above the file's length: the answer is the file with a few lines changed,
        // in a code fence.
        let max_tokens = (prediction.len() * 3 / 2 + 64).min(max_len.saturating_sub(prompt.len()));
        if max_tokens == 0 {
            bail!("edit {} does not fit the model's length", field("id")?);
        }
        edits.push(Edit {
            id: field("id")?.to_string(),
            prompt,
            prediction,
            max_tokens,
            after: normalized(field("after")?),
        });
    }
    if edits.is_empty() {
        bail!("{} holds no edit to run", args.dataset.display());
    }
    Ok(edits)
}

fn parse_configs(args: &EditBenchArgs) -> anyhow::Result<Vec<Config>> {
    let mut configs = vec![Config {
        label: "none".into(),
        method: SpecMethod::None,
        prediction: false,
    }];
    for name in &args.configs {
        let (method, prediction) = match name.strip_suffix("+prediction") {
            Some(m) => (m, true),
            None => (name.as_str(), false),
        };
        let Some(method) = SpecMethod::parse(method) else {
            bail!("unknown method '{method}' in '{name}'");
        };
        if method == SpecMethod::None && !prediction {
            continue;
        }
        if method == SpecMethod::DraftModel && args.engine.spec.draft_model.is_none() {
            bail!("method draft_model needs --draft-model");
        }
        configs.push(Config {
            label: name.clone(),
            method,
            prediction,
        });
    }
    if args.control {
        configs.push(Config {
            label: CONTROL.into(),
            method: SpecMethod::None,
            prediction: false,
        });
    }
    Ok(configs)
}

/// Runs `edits` at once on `handle` under `config` and measures each.
fn measure_round(
    handle: &engine::EngineHandle,
    config: &Config,
    edits: &[Edit],
) -> anyhow::Result<Vec<Measurement>> {
    run_round(
        edits,
        |e| {
            let mut request = Request::greedy(e.prompt.clone(), e.max_tokens, Some(config.method));
            request.prediction = config.prediction.then(|| Arc::clone(&e.prediction));
            Ok(handle.submit(request)?)
        },
        |e, started, stream| {
            let t = read_timed(started, stream).with_context(|| format!("edit {}", e.id))?;
            Ok(Measurement {
                edit: e.id.clone(),
                config: config.label.clone(),
                output_tokens: t.tokens,
                seconds: t.seconds,
                ttft_seconds: t.ttft_seconds,
                decode_seconds: t.seconds - t.ttft_seconds,
                verify_steps: t.usage.spec_steps,
                draft_tokens: t.usage.draft_tokens,
                accepted_tokens: t.usage.accepted_tokens,
                accepted_prediction_tokens: t.usage.accepted_prediction_tokens(),
                rejected_prediction_tokens: t.usage.rejected_prediction_tokens(),
                equals_reference: normalized(&t.text) == e.after,
            })
        },
    )
}

/// Totals of one configuration's measurements.
#[derive(Debug, Default, Clone, Copy)]
struct Totals {
    tokens: usize,
    decode_tokens: usize,
    seconds: f64,
    ttft: f64,
    decode_seconds: f64,
    verify_steps: usize,
    drafted: usize,
    accepted: usize,
    accepted_prediction: usize,
    rejected_prediction: usize,
    equal: usize,
    count: usize,
}

impl Totals {
    fn of<'a>(ms: impl Iterator<Item = &'a Measurement>) -> Self {
        let mut t = Totals::default();
        for m in ms {
            t.tokens += m.output_tokens;
            t.decode_tokens += m.output_tokens.saturating_sub(1);
            t.seconds += m.seconds;
            t.ttft += m.ttft_seconds;
            t.decode_seconds += m.decode_seconds;
            t.verify_steps += m.verify_steps;
            t.drafted += m.draft_tokens;
            t.accepted += m.accepted_tokens;
            t.accepted_prediction += m.accepted_prediction_tokens;
            t.rejected_prediction += m.rejected_prediction_tokens;
            t.equal += usize::from(m.equals_reference);
            t.count += 1;
        }
        t
    }

    /// Decoding tokens per second.
    fn rate(&self) -> f64 {
        self.decode_tokens as f64 / self.decode_seconds.max(1e-9)
    }

    /// Forward steps after the first token (each yields one token plus the accepted
    /// drafts).
    fn steps(&self) -> usize {
        self.decode_tokens.saturating_sub(self.accepted).max(1)
    }

    fn mat(&self) -> f64 {
        self.decode_tokens as f64 / self.steps() as f64
    }

    /// The decoding speedup over `base` had every drafted token been accepted: each step
    /// would yield one token plus its whole tree, at the step time this run measured.
    fn ceiling(&self, base: &Totals) -> f64 {
        let step = self.decode_seconds / self.steps() as f64;
        let base_step = base.decode_seconds / base.steps() as f64;
        let per_step = 1.0 + self.drafted as f64 / self.steps() as f64;
        per_step * base_step / step.max(1e-12)
    }
}

/// Runs the bench and prints the table.
pub fn run(loaded: &LoadedModel, args: &EditBenchArgs) -> anyhow::Result<()> {
    let configs = parse_configs(args)?;
    let edits = load_edits(args, loaded)?;
    let engines = configs
        .iter()
        .map(|c| start_warm(loaded, &args.engine, c.method))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut results: Vec<Measurement> = Vec::new();
    let mut busy = vec![0f64; configs.len()];
    for (round, batch) in edits.chunks(args.concurrency.max(1)).enumerate() {
        for i in round_order(round, engines.len()) {
            let started = Instant::now();
            results.extend(measure_round(&engines[i].handle, &configs[i], batch)?);
            busy[i] += started.elapsed().as_secs_f64();
        }
        eprint!(
            "\r{} of {} edits",
            (round + 1) * args.concurrency.max(1),
            edits.len()
        );
    }
    eprintln!();
    for engine in engines {
        engine.stop();
    }
    let totals: Vec<Totals> = configs
        .iter()
        .map(|c| Totals::of(results.iter().filter(|m| m.config == c.label)))
        .collect();
    let base = totals[0];
    println!(
        "| config | decoding | end to end | TTFT | before 1st token | MAT | ceiling | \
         prediction accepted / rejected | equals reference |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for ((config, t), busy_s) in configs.iter().zip(&totals).zip(&busy) {
        println!(
            "| {} | {:.2}x | {:.2}x | {:.2}x | {:.1}% | {:.2} | {:.2}x | {} / {} | {} of {} |",
            config.label,
            t.rate() / base.rate().max(1e-9),
            busy[0] / busy_s.max(1e-9),
            base.ttft / t.ttft.max(1e-9),
            100.0 * t.ttft / t.seconds.max(1e-9),
            t.mat(),
            t.ceiling(&base),
            t.accepted_prediction,
            t.rejected_prediction,
            t.equal,
            t.count,
        );
    }
    if let Some(path) = &args.out {
        let json = serde_json::json!({
            "model": args.model.model,
            "concurrency": args.concurrency,
            "measurements": results,
            "wall_seconds": configs
                .iter()
                .zip(&busy)
                .map(|(c, s)| (c.label.clone(), *s))
                .collect::<BTreeMap<_, _>>(),
        });
        std::fs::write(path, serde_json::to_string_pretty(&json)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::normalized;

    #[test]
    fn fences_and_trailing_whitespace_do_not_count() {
        let file = "def f():\n    return 1\n";
        assert_eq!(normalized(file), "def f():\n    return 1");
        assert_eq!(
            normalized("```python\ndef f():  \n    return 1\n```\n"),
            normalized(file)
        );
        assert_eq!(
            normalized("Here:\n```python\ndef f():\n```"),
            "Here:\n```python\ndef f():\n```"
        );
        assert_ne!(normalized("def f():\n    return 2\n"), normalized(file));
    }
}
