//! `thicket bench sweep`: the load benchmark at each concurrency (1, 2, 4, ... 64) with each
//! speculation setting, interleaved so drift hits every setting alike, each point on prompts
//! of its own (fresh traffic: no setting reads another's prompts from the server's prefix
//! cache or their continuations from its recycling matrix). Writes the reports
//! as JSON, a markdown table, and two charts (SVG and PNG): output throughput against
//! concurrency, and time per output token against throughput.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use serde::Serialize;

use super::plot::LineChart;
use super::serve::{run_load, runtime, BenchReport, LoadArgs, LoadPlan, Target};

/// Flags of `thicket bench sweep`.
#[derive(Debug, Clone, Args)]
pub struct SweepArgs {
    /// Server, prompts and request shape (`--num-prompts` per point, at least the
    /// concurrency).
    #[command(flatten)]
    pub load: LoadArgs,
    /// Concurrency levels.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16,32,64")]
    pub concurrency: Vec<usize>,
    /// Speculation settings compared, sent as each request's method (`none` turns it off).
    #[arg(long, value_delimiter = ',', default_value = "auto,none")]
    pub speculation: Vec<String>,
    /// Folder for sweep.json, sweep.md and the charts.
    #[arg(long, default_value = "bench-sweep")]
    pub out_dir: PathBuf,
}

/// One point of the sweep.
#[derive(Debug, Clone, Serialize)]
pub struct SweepPoint {
    /// Speculation method sent.
    pub speculation: String,
    /// Requests in flight at most.
    pub concurrency: usize,
    /// The run's report (without per-request rows).
    pub report: BenchReport,
}

/// Runs the sweep.
pub fn run(args: &SweepArgs) -> anyhow::Result<()> {
    if args.concurrency.is_empty() || args.concurrency.contains(&0) {
        anyhow::bail!("--concurrency needs positive levels, e.g. 1,2,4,8");
    }
    std::fs::create_dir_all(&args.out_dir)
        .with_context(|| format!("creating {}", args.out_dir.display()))?;
    let points = runtime()?.block_on(async {
        let target = Target::resolve(&args.load).await?;
        let mut points = Vec::new();
        // Fresh traffic at every point: each (concurrency, method) gets its own prompts, so no
        // method finds another's prompts in the server's prefix cache or their continuations in
        // its recycling matrix; the warm-up prompt is used by no point.
        let per_level: Vec<usize> = args
            .concurrency
            .iter()
            .map(|&c| target.args.num_prompts.max(c))
            .collect();
        let needed = 1 + per_level.iter().sum::<usize>() * args.speculation.len();
        let mut all = target.clone();
        all.args.num_prompts = needed;
        let pool = all.prompts()?;
        let distinct = all.distinct_prompts()?;
        if distinct < needed {
            eprintln!(
                "note: the sweep needs {needed} prompts and the dataset has {distinct}: prompts repeat across points, and a repeated prompt may hit the server's prefix cache"
            );
        }
        let plan = LoadPlan {
            max_concurrency: Some(1),
            ..LoadPlan::default()
        };
        let _ = run_load(&target, &pool[..1], &plan, false).await;
        let mut next = 1;
        for (level, &concurrency) in args.concurrency.iter().enumerate() {
            // The methods' order alternates from level to level.
            let mut methods: Vec<&String> = args.speculation.iter().collect();
            if level % 2 == 1 {
                methods.reverse();
            }
            for method in methods {
                let prompts = &pool[next..next + per_level[level]];
                next += per_level[level];
                let plan = LoadPlan {
                    request_rate: None,
                    burstiness: 1.0,
                    max_concurrency: Some(concurrency),
                    speculation: Some(method.clone()),
                };
                let mut report = run_load(&target, prompts, &plan, true).await;
                report.requests.clear();
                eprintln!(
                    "concurrency {concurrency:>3}, speculation {method:<14}: {:8.1} output tok/s, median TPOT {:7.1} ms, {} failed",
                    report.output_throughput, report.tpot_ms.median, report.failed
                );
                points.push(SweepPoint {
                    speculation: method.clone(),
                    concurrency,
                    report,
                });
            }
        }
        anyhow::Ok(points)
    })?;
    let dir = &args.out_dir;
    std::fs::write(
        dir.join("sweep.json"),
        serde_json::to_string_pretty(&points)?,
    )
    .context("writing sweep.json")?;
    std::fs::write(dir.join("sweep.md"), markdown(&points)).context("writing sweep.md")?;
    for ext in ["svg", "png"] {
        throughput_chart(&points, &args.speculation)
            .draw(&dir.join(format!("throughput.{ext}")))?;
        latency_chart(&points, &args.speculation).draw(&dir.join(format!("latency.{ext}")))?;
    }
    print!("{}", markdown(&points));
    eprintln!(
        "wrote sweep.json, sweep.md, throughput.svg/png and latency.svg/png to {}",
        dir.display()
    );
    Ok(())
}

/// The sweep as a markdown table.
pub fn markdown(points: &[SweepPoint]) -> String {
    let mut out = String::from(
        "| speculation | concurrency | output tok/s | req/s | median TTFT ms | median TPOT ms | p99 E2E ms | failed |\n|---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for p in points {
        let r = &p.report;
        let _ = writeln!(
            out,
            "| {} | {} | {:.1} | {:.2} | {:.0} | {:.1} | {:.0} | {} |",
            p.speculation,
            p.concurrency,
            r.output_throughput,
            r.request_throughput,
            r.ttft_ms.median,
            r.tpot_ms.median,
            r.e2el_ms.p99,
            r.failed
        );
    }
    out
}

fn series(
    points: &[SweepPoint],
    methods: &[String],
    xy: impl Fn(&SweepPoint) -> (f64, f64),
) -> Vec<(String, Vec<(f64, f64)>)> {
    methods
        .iter()
        .map(|m| {
            let label = format!("speculation {m}");
            let line = points
                .iter()
                .filter(|p| &p.speculation == m)
                .map(&xy)
                .collect();
            (label, line)
        })
        .collect()
}

/// Output tokens/s against concurrency, one line per speculation setting.
pub fn throughput_chart(points: &[SweepPoint], methods: &[String]) -> LineChart {
    LineChart {
        title: "Output throughput by concurrency".into(),
        x_label: "concurrent requests".into(),
        y_label: "output tokens/s".into(),
        log2_x: true,
        legend_right: false,
        series: series(points, methods, |p| {
            (p.concurrency as f64, p.report.output_throughput)
        }),
    }
}

/// Median time per output token against output throughput.
pub fn latency_chart(points: &[SweepPoint], methods: &[String]) -> LineChart {
    LineChart {
        title: "Latency against throughput".into(),
        x_label: "output tokens/s".into(),
        y_label: "median time per output token (ms)".into(),
        log2_x: false,
        legend_right: false,
        series: series(points, methods, |p| {
            (p.report.output_throughput, p.report.tpot_ms.median)
        }),
    }
}
