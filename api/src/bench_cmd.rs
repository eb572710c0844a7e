//! `thicket bench ...`: measurements printed as markdown tables. `forward` is the cost of one
//! forward for N new tokens over a cached context; `engine` is output throughput of the
//! serving engine at several numbers of concurrent greedy requests, as ratios to one.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use engine::{Event, LoadedModel, Request, SamplingParams, StopConditions};

use crate::engine_args::EngineArgs;

/// Prints the forward-cost table.
pub fn forward(
    loaded: &LoadedModel,
    context: usize,
    sizes: &[usize],
    repeats: usize,
) -> anyhow::Result<()> {
    println!(
        "CPU: {}; quantized matmul: {} kernel, {} path; layers: {}",
        engine::calibration::cpu_name(),
        match loaded.model.quant_kernel() {
            Some(engine::QuantKernel::Candle) => "candle",
            Some(engine::QuantKernel::Thicket) => "thicket",
            None => "none (dense weights)",
        },
        engine::cpu::qgemm::process_isa().name(),
        if loaded.model.is_fused() {
            "fused CPU pass"
        } else {
            "candle ops"
        }
    );
    println!();
    // Where the fused CPU pass runs, the same weights through candle's ops are measured in
    // the same run, interleaved, as the reference it replaces.
    let unfused = loaded
        .model
        .is_fused()
        .then(|| loaded.model.clone().without_fused_pass());
    let mut models = vec![&loaded.model];
    models.extend(unfused.as_ref());
    let curves = engine::calibration::forward_costs(&models, context, sizes, repeats)?;
    for curve in &curves {
        println!("Backend: {}", curve.backend);
    }
    println!();
    let points = &curves[0].points;
    let base = points.first().map(|p| p.seconds).unwrap_or(1.0);
    if let Some(candle) = curves.get(1) {
        let candle_base = candle.points.first().map(|p| p.seconds).unwrap_or(1.0);
        println!("| new tokens | ms / forward | x cost(1) | ms / token | matmul ms | attention ms | other ms | head ms | candle ops: ms | x cost(1) |");
        println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        for ((p, parts), c) in points.iter().zip(&curves[0].parts).zip(&candle.points) {
            let parts = parts.unwrap_or_default();
            println!(
                "| {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
                p.new_tokens,
                p.seconds * 1e3,
                p.seconds / base,
                p.seconds * 1e3 / p.new_tokens as f64,
                parts.matmul * 1e3,
                parts.attention * 1e3,
                parts.other * 1e3,
                parts.head * 1e3,
                c.seconds * 1e3,
                c.seconds / candle_base
            );
        }
    } else {
        println!("| new tokens | ms / forward | x cost(1) | ms / token |");
        println!("|---:|---:|---:|---:|");
        for p in points {
            println!(
                "| {} | {:.2} | {:.2} | {:.2} |",
                p.new_tokens,
                p.seconds * 1e3,
                p.seconds / base,
                p.seconds * 1e3 / p.new_tokens as f64
            );
        }
    }
    // The memory-bandwidth bound on one-row decoding, measured in the same run: a row reads
    // every weight, and the keys and values of its context too. It is the host's bandwidth,
    // so it bounds only a model on the CPU.
    if !loaded.model.device().is_cpu() {
        return Ok(());
    }
    let bandwidth = engine::calibration::read_bandwidth(1 << 30, 3);
    let weight_bytes = loaded.model.weight_bytes() as f64;
    let kv_bytes = (context * loaded.model.kv_bytes_per_position()) as f64;
    let bound = bandwidth / weight_bytes;
    let with_kv = bandwidth / (weight_bytes + kv_bytes);
    let one_row = 1.0 / base;
    println!();
    println!(
        "memory read bandwidth {:.1} GB/s over {:.1} MB of weights: at most {bound:.1} forwards/s; one row measured {one_row:.1}/s = {:.0}% of that bound",
        bandwidth / 1e9,
        weight_bytes / 1e6,
        100.0 * one_row / bound
    );
    if kv_bytes > 0.0 {
        println!(
            "with the {:.1} MB of K/V its {context}-token context holds: at most {with_kv:.1} forwards/s, {:.0}% of that bound",
            kv_bytes / 1e6,
            100.0 * one_row / with_kv
        );
    }
    Ok(())
}

/// Prompts the engine bench cycles through (request i gets prompt i mod len).
const PROMPTS: &[&str] = &[
    "The history of the printing press begins",
    "def merge_sort(items):\n",
    "Write a short story about a lighthouse keeper who",
    "The three most important ideas in thermodynamics are",
    "Q: Why is the sky blue?\nA:",
    "Once upon a time in a city built on water,",
    "A recipe for bread needs flour, water, salt and",
    "The best way to learn a new language is",
];

/// Timings of one request.
struct RequestTiming {
    first_token: Duration,
    total: Duration,
    tokens: usize,
}

/// Runs `concurrency` greedy requests of exactly `max_tokens` at once per level and prints
/// output tokens per second against one request at a time.
pub fn engine(
    loaded: &LoadedModel,
    args: &EngineArgs,
    levels: &[usize],
    max_tokens: usize,
) -> anyhow::Result<()> {
    let config = engine::EngineConfig {
        // The pool mapped before the timing starts (see `bench spec`).
        kv_prefault: true,
        ..args.config(&loaded.model)?
    };
    let (handle, _thread) = engine::spawn(
        loaded.model.clone(),
        Arc::new(loaded.tokenizer.clone()),
        loaded.tokenizer.eos_ids().to_vec(),
        config,
    )?;
    let prompts: Vec<Vec<u32>> = PROMPTS
        .iter()
        .map(|p| loaded.tokenizer.encode(p))
        .collect::<engine::Result<_>>()?;
    let request = |i: usize, max_tokens: usize| Request {
        prompt: prompts[i % prompts.len()].clone(),
        sampling: SamplingParams::greedy(),
        stop: StopConditions {
            max_tokens,
            ignore_eos: true,
            ..StopConditions::default()
        },
        n: 1,
        speculation: None,
        constraint: None,
        prediction: None,
        cache_salt: None,
    };
    // Warm-up: page in the weights.
    handle
        .submit(request(0, 8))?
        .wait()
        .map_err(anyhow::Error::msg)?;
    println!("| concurrent requests | output tokens/s | x (1 request) | mean TTFT ms | mean ms / output token per request |");
    println!("|---:|---:|---:|---:|---:|");
    let mut base = None;
    for &level in levels {
        let started = Instant::now();
        let streams = (0..level)
            .map(|i| handle.submit(request(i, max_tokens)))
            .collect::<Result<Vec<_>, _>>()?;
        let workers: Vec<_> = streams
            .into_iter()
            .map(|stream| {
                std::thread::spawn(move || -> anyhow::Result<RequestTiming> {
                    let mut first = None;
                    let mut tokens = 0;
                    while let Some(event) = stream.recv() {
                        match event {
                            Event::Output { token_ids, .. } => {
                                first.get_or_insert_with(|| started.elapsed());
                                tokens += token_ids.len();
                            }
                            Event::Error(e) => anyhow::bail!("request failed: {e}"),
                            Event::Finished { .. } => {}
                        }
                    }
                    Ok(RequestTiming {
                        first_token: first.context("no output")?,
                        total: started.elapsed(),
                        tokens,
                    })
                })
            })
            .collect();
        let mut timings = Vec::with_capacity(level);
        for worker in workers {
            let timing = worker
                .join()
                .map_err(|_| anyhow::anyhow!("a bench worker panicked"))??;
            timings.push(timing);
        }
        let wall = started.elapsed().as_secs_f64();
        let tokens: usize = timings.iter().map(|t| t.tokens).sum();
        let rate = tokens as f64 / wall;
        let base_rate = *base.get_or_insert(rate);
        let ttft = timings
            .iter()
            .map(|t| t.first_token.as_secs_f64())
            .sum::<f64>()
            / level as f64;
        let per_token = timings
            .iter()
            .map(|t| (t.total - t.first_token).as_secs_f64() / (t.tokens.max(2) - 1) as f64)
            .sum::<f64>()
            / level as f64;
        println!(
            "| {level} | {rate:.1} | {:.2} | {:.0} | {:.1} |",
            rate / base_rate,
            ttft * 1e3,
            per_token * 1e3
        );
    }
    handle.shutdown();
    Ok(())
}
