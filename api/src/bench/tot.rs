//! `thicket bench tot`: a tree-of-thought workload in the shape of the SEED paper's, on
//! GSM8K questions. Breadth-first with one kept state: at each step a thought generator asks
//! for `n` continuations of the same prompt, a state evaluator scores each with its own
//! prompt, and the best is kept. Every question runs twice against the same server: serially
//! (one request at a time, speculation off) and in parallel (the evaluations at once,
//! speculation on). Both use the same seeds, so with lossless speculation they produce the
//! same thoughts; the report gives wall time per question and the speedup. The two runs
//! alternate in order; run the server with `--no-prefix-cache` so the second run of a
//! question does not find the first one's prompts cached.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};
use clap::Args;
use futures_util::future::join_all;
use serde::Serialize;
use serde_json::{json, Value};

use super::serve::client::{post_json, ServerUrl};
use super::serve::runtime;

/// Flags of `thicket bench tot`.
#[derive(Debug, Clone, Args)]
pub struct TotArgs {
    /// Base URL of the server (http only).
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    pub url: String,
    /// Model name to send [default: the first one `/v1/models` lists].
    #[arg(long)]
    pub model: Option<String>,
    /// Bearer token for the server.
    #[arg(long, env = "OPENAI_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// GSM8K questions (JSON lines with `question` and `answer`).
    #[arg(long, default_value = "benches/data/gsm8k_30.jsonl")]
    pub dataset: PathBuf,
    /// Questions to run.
    #[arg(long, default_value_t = 5)]
    pub questions: usize,
    /// Reasoning steps per question (tree depth).
    #[arg(long, default_value_t = 3)]
    pub depth: usize,
    /// Thoughts generated per step (`n`).
    #[arg(long, default_value_t = 3)]
    pub breadth: usize,
    /// Tokens per thought at most.
    #[arg(long, default_value_t = 48)]
    pub thought_tokens: usize,
    /// Sampling temperature of the thought generator.
    #[arg(long, default_value_t = 0.7)]
    pub temperature: f64,
    /// Seed of the first question (each step of each question gets its own).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Speculation method of the parallel run.
    #[arg(long, default_value = "auto")]
    pub speculation: String,
    /// Where to write the JSON report.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// How the calls of one question are issued.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Schedule {
    /// One request at a time, speculation off.
    Serial,
    /// The evaluations of a step at once, speculation on.
    Parallel,
}

/// One question under one schedule.
#[derive(Debug, Clone, Serialize)]
pub struct TotRun {
    /// Wall seconds.
    pub seconds: f64,
    /// Requests sent.
    pub requests: usize,
    /// Completion tokens over all requests.
    pub completion_tokens: u64,
    /// The kept thoughts, one per step.
    pub thoughts: Vec<String>,
    /// Their scores.
    pub scores: Vec<u32>,
}

/// One question under both schedules.
#[derive(Debug, Clone, Serialize)]
pub struct TotQuestion {
    /// Index in the dataset.
    pub index: usize,
    /// Serial run.
    pub serial: TotRun,
    /// Parallel run.
    pub parallel: TotRun,
    /// Serial seconds over parallel seconds.
    pub speedup: f64,
    /// Whether both runs kept the same thoughts.
    pub identical: bool,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct TotReport {
    /// Model name.
    pub model: String,
    /// Steps, thoughts per step, tokens per thought.
    pub depth: usize,
    /// Thoughts per step.
    pub breadth: usize,
    /// Tokens per thought at most.
    pub thought_tokens: usize,
    /// Speculation of the parallel run.
    pub speculation: String,
    /// Per question.
    pub questions: Vec<TotQuestion>,
    /// Mean serial seconds per question.
    pub serial_seconds_per_question: f64,
    /// Mean parallel seconds per question.
    pub parallel_seconds_per_question: f64,
    /// Total serial time over total parallel time.
    pub speedup: f64,
    /// Questions whose two runs kept the same thoughts.
    pub identical: usize,
}

struct Caller<'a> {
    server: &'a ServerUrl,
    model: &'a str,
    args: &'a TotArgs,
    schedule: Schedule,
    requests: usize,
    completion_tokens: u64,
}

impl Caller<'_> {
    fn speculation(&self) -> &str {
        match self.schedule {
            Schedule::Serial => "none",
            Schedule::Parallel => &self.args.speculation,
        }
    }

    fn count(&mut self, body: &Value) {
        self.requests += 1;
        self.completion_tokens += body["usage"]["completion_tokens"].as_u64().unwrap_or(0);
    }

    /// `breadth` thoughts continuing `prompt`.
    async fn thoughts(&mut self, prompt: &str, seed: u64) -> anyhow::Result<Vec<String>> {
        let body = json!({
            "model": self.model,
            "prompt": prompt,
            "n": self.args.breadth,
            "max_tokens": self.args.thought_tokens,
            "temperature": self.args.temperature,
            "seed": seed,
            "stop": ["\nStep", "\n\n"],
            "speculation": {"method": self.speculation()},
        });
        let answer = post_json(self.server, "/v1/completions", &body).await?;
        self.count(&answer);
        let texts: Vec<String> = answer["choices"]
            .as_array()
            .map(|c| {
                c.iter()
                    .map(|c| c["text"].as_str().unwrap_or_default().to_string())
                    .collect()
            })
            .unwrap_or_default();
        if texts.len() != self.args.breadth {
            bail!(
                "asked for {} thoughts, got {}",
                self.args.breadth,
                texts.len()
            );
        }
        Ok(texts)
    }

    /// Scores of `candidates` (each a prompt of the evaluator).
    async fn scores(&mut self, candidates: &[String]) -> anyhow::Result<Vec<u32>> {
        let bodies: Vec<Value> = candidates
            .iter()
            .map(|prompt| {
                json!({
                    "model": self.model,
                    "prompt": prompt,
                    "max_tokens": 4,
                    "temperature": 0,
                    "speculation": {"method": self.speculation()},
                })
            })
            .collect();
        let answers = match self.schedule {
            Schedule::Serial => {
                let mut answers = Vec::with_capacity(bodies.len());
                for body in &bodies {
                    answers.push(post_json(self.server, "/v1/completions", body).await?);
                }
                answers
            }
            Schedule::Parallel => join_all(
                bodies
                    .iter()
                    .map(|body| post_json(self.server, "/v1/completions", body)),
            )
            .await
            .into_iter()
            .collect::<anyhow::Result<Vec<_>>>()?,
        };
        Ok(answers
            .iter()
            .map(|a| {
                self.count(a);
                parse_score(a["choices"][0]["text"].as_str().unwrap_or_default())
            })
            .collect())
    }
}

/// The first integer in `text`, clamped to 0..=10 (0 when there is none).
pub fn parse_score(text: &str) -> u32 {
    let digits: String = text
        .chars()
        .skip_while(|c| !c.is_ascii_digit())
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse::<u32>().map_or(0, |v| v.min(10))
}

fn generator_prompt(question: &str, kept: &[String]) -> String {
    let mut prompt = format!("Question: {question}\nLet's solve it step by step.\n");
    for (i, thought) in kept.iter().enumerate() {
        prompt.push_str(&format!("Step {}:{thought}\n", i + 1));
    }
    prompt.push_str(&format!("Step {}:", kept.len() + 1));
    prompt
}

fn evaluator_prompt(question: &str, kept: &[String], thought: &str) -> String {
    let mut steps = String::new();
    for (i, t) in kept
        .iter()
        .chain(std::iter::once(&thought.to_string()))
        .enumerate()
    {
        steps.push_str(&format!("Step {}:{t}\n", i + 1));
    }
    format!(
        "Question: {question}\nPartial solution:\n{steps}\nHow likely is this partial solution to be correct and on track, from 1 (wrong) to 10 (certainly right)?\nScore:"
    )
}

async fn solve(
    caller: &mut Caller<'_>,
    question: &str,
    question_seed: u64,
) -> anyhow::Result<TotRun> {
    let started = Instant::now();
    let mut kept = Vec::new();
    let mut scores = Vec::new();
    for step in 0..caller.args.depth {
        let seed = question_seed.wrapping_mul(1000).wrapping_add(step as u64);
        let thoughts = caller
            .thoughts(&generator_prompt(question, &kept), seed)
            .await?;
        let prompts: Vec<String> = thoughts
            .iter()
            .map(|t| evaluator_prompt(question, &kept, t))
            .collect();
        let step_scores = caller.scores(&prompts).await?;
        let best = (0..thoughts.len())
            .max_by_key(|&i| (step_scores[i], std::cmp::Reverse(i)))
            .unwrap_or(0);
        kept.push(thoughts[best].clone());
        scores.push(step_scores[best]);
    }
    Ok(TotRun {
        seconds: started.elapsed().as_secs_f64(),
        requests: caller.requests,
        completion_tokens: caller.completion_tokens,
        thoughts: kept,
        scores,
    })
}

/// Runs `thicket bench tot`.
pub fn run(args: &TotArgs) -> anyhow::Result<()> {
    if args.depth == 0 || args.breadth == 0 || args.questions == 0 {
        bail!("--depth, --breadth and --questions must be positive");
    }
    let text = std::fs::read_to_string(&args.dataset)
        .with_context(|| format!("reading {}", args.dataset.display()))?;
    let questions: Vec<String> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .take(args.questions)
        .map(|l| {
            let v: Value = serde_json::from_str(l).context("a GSM8K line is not JSON")?;
            v["question"]
                .as_str()
                .map(str::to_string)
                .context("a GSM8K line has no question")
        })
        .collect::<anyhow::Result<_>>()?;
    let report = runtime()?.block_on(async {
        let server = ServerUrl::parse(&args.url, args.api_key.clone())?;
        let model = match &args.model {
            Some(m) => m.clone(),
            None => server.first_model().await?,
        };
        let mut results = Vec::new();
        for (index, question) in questions.iter().enumerate() {
            let seed = args.seed + index as u64;
            // Alternate which schedule goes first, so warm-up effects fall on both alike.
            let mut order = [Schedule::Serial, Schedule::Parallel];
            if index % 2 == 1 {
                order.reverse();
            }
            let mut runs = Vec::new();
            for schedule in order {
                let mut caller = Caller {
                    server: &server,
                    model: &model,
                    args,
                    schedule,
                    requests: 0,
                    completion_tokens: 0,
                };
                runs.push(solve(&mut caller, question, seed).await?);
            }
            if index % 2 == 1 {
                runs.reverse();
            }
            let parallel = runs.pop().context("two runs")?;
            let serial = runs.pop().context("two runs")?;
            let q = TotQuestion {
                index,
                speedup: serial.seconds / parallel.seconds.max(1e-9),
                identical: serial.thoughts == parallel.thoughts,
                serial,
                parallel,
            };
            eprintln!(
                "question {index}: serial {:.2}s, parallel {:.2}s ({:.2}x), same thoughts: {}",
                q.serial.seconds, q.parallel.seconds, q.speedup, q.identical
            );
            results.push(q);
        }
        anyhow::Ok(summarize(args, model, results))
    })?;
    println!(
        "tree of thought, {} questions (depth {}, breadth {}, {} tokens per thought):\n  serial (one request at a time, speculation off): {:.2} s per question\n  parallel (evaluations batched, speculation {}): {:.2} s per question\n  speedup {:.2}x; same thoughts in {} of {} questions",
        report.questions.len(),
        report.depth,
        report.breadth,
        report.thought_tokens,
        report.serial_seconds_per_question,
        report.speculation,
        report.parallel_seconds_per_question,
        report.speedup,
        report.identical,
        report.questions.len()
    );
    if let Some(path) = &args.out {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

fn summarize(args: &TotArgs, model: String, questions: Vec<TotQuestion>) -> TotReport {
    let n = questions.len().max(1) as f64;
    let serial: f64 = questions.iter().map(|q| q.serial.seconds).sum();
    let parallel: f64 = questions.iter().map(|q| q.parallel.seconds).sum();
    TotReport {
        model,
        depth: args.depth,
        breadth: args.breadth,
        thought_tokens: args.thought_tokens,
        speculation: args.speculation.clone(),
        serial_seconds_per_question: serial / n,
        parallel_seconds_per_question: parallel / n,
        speedup: serial / parallel.max(1e-9),
        identical: questions.iter().filter(|q| q.identical).count(),
        questions,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scores_and_prompts() {
        assert_eq!(parse_score(" 7/10"), 7);
        assert_eq!(parse_score(" about 42"), 10);
        assert_eq!(parse_score(" none"), 0);
        let kept = vec![" add 2 and 3.".to_string()];
        let g = generator_prompt("What is 2+3?", &kept);
        assert!(g.ends_with("Step 1: add 2 and 3.\nStep 2:"), "{g}");
        let e = evaluator_prompt("What is 2+3?", &kept, " 5.");
        assert!(e.contains("Step 2: 5.\n") && e.ends_with("Score:"), "{e}");
    }
}
