//! `thicket bench serve`: load on any OpenAI-compatible server, measured as a client sees
//! it. Requests arrive as a Poisson (or gamma) process or all at once, optionally capped in
//! concurrency, each streamed and timed; the report gives request, output-token and
//! total-token throughput, TTFT, TPOT, ITL and end-to-end latency (mean, median, p90, p99),
//! goodput under latency objectives, and failures, as text and JSON, with an optional chart.
//! The sweep and tree-of-thought benchmarks (`super::sweep`, `super::tot`) build on the same
//! pieces.

mod chart;
pub mod client;
pub mod dataset;
pub mod stats;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use serde_json::{json, Value};
use tokio::sync::Semaphore;

use client::{stream_request, RequestResult, ServerUrl};
use dataset::{DatasetFormat, Prompt};
use stats::{arrival_times, time_per_output_token, LatencySummary, Slo};

/// What every load benchmark needs: the server, the prompts and the request shape.
#[derive(Debug, Clone, Args)]
pub struct LoadArgs {
    /// Base URL of the server (http only).
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    pub url: String,
    /// Model name to send [default: the first one `/v1/models` lists].
    #[arg(long)]
    pub model: Option<String>,
    /// `/v1/chat/completions` or `/v1/completions`.
    #[arg(long, default_value = "/v1/chat/completions")]
    pub endpoint: String,
    /// Prompts file.
    #[arg(long, default_value = "benches/data/sharegpt_200.json")]
    pub dataset: PathBuf,
    /// Layout of the prompts file [default: guessed from its name].
    #[arg(long, value_enum)]
    pub dataset_format: Option<DatasetFormat>,
    /// Requests to send.
    #[arg(long, default_value_t = 100)]
    pub num_prompts: usize,
    /// Output tokens per request at most.
    #[arg(long, default_value_t = 128)]
    pub max_tokens: usize,
    /// Keep generating past end-of-sequence (every request produces `--max-tokens`).
    #[arg(long)]
    pub ignore_eos: bool,
    /// Sampling temperature (0: greedy).
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f64,
    /// Seed of the prompt order and the arrival times.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Latency objectives for goodput, e.g. `ttft:500,tpot:50` (milliseconds; also `e2el`).
    #[arg(long, value_parser = Slo::parse)]
    pub goodput: Option<Slo>,
    /// Bearer token for the server.
    #[arg(long, env = "OPENAI_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Seconds one request may take before it counts as failed.
    #[arg(long, default_value_t = 600)]
    pub request_timeout_secs: u64,
}

/// Flags of `thicket bench serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeBenchArgs {
    /// Server, prompts and request shape.
    #[command(flatten)]
    pub load: LoadArgs,
    /// Requests per second (`inf`: all at once).
    #[arg(long, default_value = "inf", value_parser = parse_rate)]
    pub request_rate: f64,
    /// Shape of the gamma-distributed gaps between arrivals: 1 is Poisson, below 1 burstier.
    #[arg(long, default_value_t = 1.0)]
    pub burstiness: f64,
    /// Requests in flight at most.
    #[arg(long)]
    pub max_concurrency: Option<usize>,
    /// thicket's speculation method for every request (other servers ignore the field).
    #[arg(long)]
    pub speculation: Option<String>,
    /// Where to write the JSON report.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Where to draw the latency chart (`.svg` or `.png`).
    #[arg(long)]
    pub plot: Option<PathBuf>,
}

fn parse_rate(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(r) if r > 0.0 => Ok(r),
        _ => Err(format!("'{s}' is not a positive rate or 'inf'")),
    }
}

/// How requests are offered in one run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LoadPlan {
    /// Requests per second (`None`: all at once).
    pub request_rate: Option<f64>,
    /// Gamma shape of the gaps.
    pub burstiness: f64,
    /// Requests in flight at most.
    pub max_concurrency: Option<usize>,
    /// Speculation method sent with every request.
    pub speculation: Option<String>,
}

/// The report of one run, in the field names vLLM's `bench serve` uses.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    /// When it ran (Unix seconds).
    pub date: u64,
    /// Server URL.
    pub url: String,
    /// Endpoint path.
    pub endpoint: String,
    /// Model name sent.
    pub model: String,
    /// How requests were offered.
    pub plan: LoadPlan,
    /// Requests sent.
    pub num_prompts: usize,
    /// Seconds from the first request to the last answer.
    pub duration: f64,
    /// Requests that completed.
    pub completed: usize,
    /// Requests that failed.
    pub failed: usize,
    /// A few failure messages.
    pub errors: Vec<String>,
    /// Prompt tokens of completed requests.
    pub total_input_tokens: u64,
    /// Output tokens of completed requests.
    pub total_output_tokens: u64,
    /// Completed requests per second.
    pub request_throughput: f64,
    /// Output tokens per second.
    pub output_throughput: f64,
    /// Prompt plus output tokens per second.
    pub total_token_throughput: f64,
    /// Requests per second that met every objective (when `--goodput` was given).
    pub request_goodput: Option<f64>,
    /// The objectives.
    pub goodput_slo: Option<Slo>,
    /// Time to first token.
    pub ttft_ms: LatencySummary,
    /// Time per output token after the first.
    pub tpot_ms: LatencySummary,
    /// Gaps between streamed chunks.
    pub itl_ms: LatencySummary,
    /// End-to-end latency.
    pub e2el_ms: LatencySummary,
    /// Every request.
    pub requests: Vec<RequestResult>,
}

/// A server to load, resolved: its URL and model, and the request shape.
#[derive(Debug, Clone)]
pub struct Target {
    /// Where.
    pub server: ServerUrl,
    /// Model name.
    pub model: String,
    /// The flags.
    pub args: LoadArgs,
}

impl Target {
    /// Resolves the model name (asking the server when not given).
    pub async fn resolve(args: &LoadArgs) -> anyhow::Result<Self> {
        if args.endpoint != "/v1/chat/completions" && args.endpoint != "/v1/completions" {
            anyhow::bail!("--endpoint must be /v1/chat/completions or /v1/completions");
        }
        let server = ServerUrl::parse(&args.url, args.api_key.clone())?;
        let model = match &args.model {
            Some(m) => m.clone(),
            None => server
                .first_model()
                .await
                .with_context(|| format!("asking {} for its model", args.url))?,
        };
        Ok(Self {
            server,
            model,
            args: args.clone(),
        })
    }

    /// The streaming request body for `prompt`.
    pub fn body(&self, prompt: &Prompt, speculation: Option<&str>) -> Value {
        let mut body = json!({
            "model": self.model,
            "max_tokens": self.args.max_tokens,
            "temperature": self.args.temperature,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        if self.args.endpoint == "/v1/completions" {
            body["prompt"] = json!(prompt.text);
        } else {
            body["messages"] = prompt.messages.clone();
        }
        if self.args.ignore_eos {
            body["ignore_eos"] = json!(true);
        }
        if let Some(method) = speculation {
            body["speculation"] = json!({ "method": method });
        }
        body
    }

    /// The prompts of the dataset, sampled with the seed.
    pub fn prompts(&self) -> anyhow::Result<Vec<Prompt>> {
        Ok(dataset::sample(
            &self.dataset()?,
            self.args.num_prompts,
            self.args.seed,
        ))
    }

    /// How many prompts the dataset holds.
    pub fn distinct_prompts(&self) -> anyhow::Result<usize> {
        Ok(self.dataset()?.len())
    }

    fn dataset(&self) -> anyhow::Result<Vec<Prompt>> {
        let format = self
            .args
            .dataset_format
            .unwrap_or_else(|| DatasetFormat::guess(&self.args.dataset));
        dataset::load(&self.args.dataset, format)
    }
}

/// Runs one load: every prompt sent at its arrival time, within the concurrency cap.
pub async fn run_load(
    target: &Target,
    prompts: &[Prompt],
    plan: &LoadPlan,
    progress: bool,
) -> BenchReport {
    let arrivals = arrival_times(
        prompts.len(),
        plan.request_rate,
        plan.burstiness,
        target.args.seed,
    );
    let slots = Arc::new(Semaphore::new(
        plan.max_concurrency
            .unwrap_or(Semaphore::MAX_PERMITS)
            .clamp(1, Semaphore::MAX_PERMITS),
    ));
    let bar = if progress {
        ProgressBar::new(prompts.len() as u64)
    } else {
        ProgressBar::hidden()
    };
    if let Ok(style) = ProgressStyle::with_template(
        "{elapsed_precise} [{wide_bar}] {pos}/{len} requests, ETA {eta}",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    let timeout = Duration::from_secs(target.args.request_timeout_secs.max(1));
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(prompts.len());
    for (prompt, at) in prompts.iter().zip(arrivals) {
        let due = started + Duration::from_secs_f64(at);
        tokio::time::sleep_until(due.into()).await;
        let Ok(slot) = slots.clone().acquire_owned().await else {
            break;
        };
        let server = target.server.clone();
        let path = target.args.endpoint.clone();
        let body = target.body(prompt, plan.speculation.as_deref());
        let bar = bar.clone();
        tasks.push(tokio::spawn(async move {
            let result = stream_request(&server, &path, &body, started, timeout).await;
            drop(slot);
            bar.inc(1);
            result
        }));
    }
    let mut results = Vec::with_capacity(tasks.len());
    for task in tasks {
        results.push(task.await.unwrap_or_else(|e| RequestResult {
            error: Some(format!("the request task failed: {e}")),
            ..RequestResult::default()
        }));
    }
    bar.finish_and_clear();
    let duration = results
        .iter()
        .map(|r| r.sent_at + r.e2el)
        .fold(0.0, f64::max);
    report(target, plan, prompts.len(), duration, results)
}

/// Aggregates request results into the report.
pub fn report(
    target: &Target,
    plan: &LoadPlan,
    num_prompts: usize,
    duration: f64,
    requests: Vec<RequestResult>,
) -> BenchReport {
    let ok: Vec<&RequestResult> = requests.iter().filter(|r| r.success).collect();
    let per_second = |x: f64| if duration > 0.0 { x / duration } else { 0.0 };
    let total_input_tokens = ok.iter().map(|r| r.prompt_tokens).sum::<u64>();
    let total_output_tokens = ok.iter().map(|r| r.output_tokens).sum::<u64>();
    let tpots: Vec<f64> = ok
        .iter()
        .filter_map(|r| time_per_output_token(r.ttft, r.e2el, r.output_tokens))
        .collect();
    let itls: Vec<f64> = ok.iter().flat_map(|r| r.itl.iter().copied()).collect();
    let goodput_slo = target.args.goodput;
    let request_goodput = goodput_slo.map(|slo| {
        let good = ok
            .iter()
            .filter(|r| {
                let tpot = time_per_output_token(r.ttft, r.e2el, r.output_tokens).unwrap_or(0.0);
                slo.met(r.ttft, tpot, r.e2el)
            })
            .count();
        per_second(good as f64)
    });
    let mut errors: Vec<String> = requests.iter().filter_map(|r| r.error.clone()).collect();
    errors.dedup();
    errors.truncate(5);
    BenchReport {
        date: crate::server::unix_now(),
        url: target.args.url.clone(),
        endpoint: target.args.endpoint.clone(),
        model: target.model.clone(),
        plan: plan.clone(),
        num_prompts,
        duration,
        completed: ok.len(),
        failed: requests.len() - ok.len() + num_prompts.saturating_sub(requests.len()),
        errors,
        total_input_tokens,
        total_output_tokens,
        request_throughput: per_second(ok.len() as f64),
        output_throughput: per_second(total_output_tokens as f64),
        total_token_throughput: per_second((total_input_tokens + total_output_tokens) as f64),
        request_goodput,
        goodput_slo,
        ttft_ms: LatencySummary::of_seconds(&ok.iter().map(|r| r.ttft).collect::<Vec<_>>()),
        tpot_ms: LatencySummary::of_seconds(&tpots),
        itl_ms: LatencySummary::of_seconds(&itls),
        e2el_ms: LatencySummary::of_seconds(&ok.iter().map(|r| r.e2el).collect::<Vec<_>>()),
        requests,
    }
}

impl BenchReport {
    /// The report for a person, laid out like vLLM's.
    pub fn text(&self) -> String {
        let mut out = String::from("============ Serving Benchmark Result ============\n");
        let mut row = |name: &str, value: String| out.push_str(&format!("{name:<40}{value:>10}\n"));
        row("Successful requests:", self.completed.to_string());
        row("Failed requests:", self.failed.to_string());
        row("Benchmark duration (s):", format!("{:.2}", self.duration));
        row("Total input tokens:", self.total_input_tokens.to_string());
        row(
            "Total generated tokens:",
            self.total_output_tokens.to_string(),
        );
        row(
            "Request throughput (req/s):",
            format!("{:.2}", self.request_throughput),
        );
        row(
            "Output token throughput (tok/s):",
            format!("{:.2}", self.output_throughput),
        );
        row(
            "Total token throughput (tok/s):",
            format!("{:.2}", self.total_token_throughput),
        );
        if let Some(goodput) = self.request_goodput {
            row("Request goodput (req/s):", format!("{goodput:.2}"));
        }
        for (title, s) in [
            ("Time to First Token", &self.ttft_ms),
            ("Time per Output Token (excl. 1st token)", &self.tpot_ms),
            ("Inter-token Latency", &self.itl_ms),
            ("End-to-end Latency", &self.e2el_ms),
        ] {
            out.push_str(&format!("{:-^50}\n", title));
            for (name, v) in [
                ("Mean", s.mean),
                ("Median", s.median),
                ("P90", s.p90),
                ("P99", s.p99),
            ] {
                out.push_str(&format!("{:<40}{:>10.2}\n", format!("{name} (ms):"), v));
            }
        }
        out.push_str(&"=".repeat(50));
        out.push('\n');
        for e in &self.errors {
            out.push_str(&format!("error: {e}\n"));
        }
        out
    }
}

/// Builds the async runtime the client benchmarks run on.
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// Runs `thicket bench serve`.
pub fn run(args: &ServeBenchArgs) -> anyhow::Result<()> {
    runtime()?.block_on(async {
        let target = Target::resolve(&args.load).await?;
        let prompts = target.prompts()?;
        let plan = LoadPlan {
            request_rate: Some(args.request_rate).filter(|r| r.is_finite()),
            burstiness: args.burstiness,
            max_concurrency: args.max_concurrency,
            speculation: args.speculation.clone(),
        };
        eprintln!(
            "sending {} requests to {}{} ({}), rate {}/s, concurrency {}",
            prompts.len(),
            args.load.url,
            args.load.endpoint,
            target.model,
            args.request_rate,
            args.max_concurrency
                .map_or("unlimited".to_string(), |c| c.to_string()),
        );
        let report = run_load(&target, &prompts, &plan, true).await;
        print!("{}", report.text());
        if let Some(path) = &args.out {
            let json = serde_json::to_string_pretty(&report)?;
            std::fs::write(path, json).with_context(|| format!("writing {}", path.display()))?;
            eprintln!("report: {}", path.display());
        }
        if let Some(path) = &args.plot {
            chart::latency_cdf(path, &report)?;
            eprintln!("chart: {}", path.display());
        }
        Ok(())
    })
}
