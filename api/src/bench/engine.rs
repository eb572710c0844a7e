//! `thicket bench engine`: output throughput of the serving engine at several numbers of
//! concurrent greedy requests of a fixed length, as ratios to one request at a time, with
//! the mean time to the first token and per output token, as a markdown table.

use std::time::{Duration, Instant};

use anyhow::Context;
use engine::{Event, LoadedModel, Request, SamplingParams, StopConditions};

use crate::args::{spawn, EngineArgs};

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
pub fn run(
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
    let (handle, _thread) = spawn(loaded, config)?;
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
        thinking: None,
        prediction: None,
        cache_salt: None,
        pooling: None,
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
                            Event::Pooled { .. } => anyhow::bail!("a generation request pooled"),
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
