//! How one-row forwards run when decoding resumes: SmolLM2 (or the model named first on the
//! command line) decodes one row at a time over a 200-token context, and every round first
//! interrupts that with one of the given disturbances (a sleep of `msN` milliseconds, or a
//! forward of `rowsN` rows, as a prompt's prefill chunk would be), then times the next 60
//! one-row forwards. Each disturbance's line is the median, over 24 rounds, of the time of
//! the 1st, 2nd, ... 60th forward after it; `steady` is the same without a disturbance.
//! A host whose one-row forward reads its weights faster while they are re-read every few
//! milliseconds shows a first forward well above the last after a pause. The model comes
//! from the model directory as the tests' does (`THICKET_MODELS`).
//!
//! `everyPxK` instead decodes in cycles of `P` forwards, the last of each `K` rows (as a
//! draft tree's verification would be), and prints the mean time of the one-row forwards
//! and of the `K`-row ones: whether forwards of a few rows slow the one-row forwards
//! between them.
//!
//! `cargo bench --bench resume -- [MODEL] [steady|msN|rowsN|everyPxK ...]`

use std::time::{Duration, Instant};

use engine::{LogitRows, TokenTree, TreeBatch};
use kvcache::{BlockPool, BlockTable};

const CONTEXT: usize = 200;
const BLOCK: usize = 16;
const AFTER: usize = 60;
const ROUNDS: usize = 24;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let (model, kinds) = match args.split_first() {
        Some((first, rest)) if !is_disturbance(first) => (first.clone(), rest.to_vec()),
        _ => ("smollm2-135m".to_string(), args.clone()),
    };
    let kinds = if kinds.is_empty() {
        ["steady", "ms5", "ms20", "ms400", "rows8", "rows32"]
            .map(String::from)
            .to_vec()
    } else {
        kinds
    };
    let loaded = engine::load_model(&model, &Default::default())?;
    let largest = kinds
        .iter()
        .filter_map(|k| rows(k).or(cycle(k).map(|c| c.1)))
        .max()
        .unwrap_or(1);
    let mut pool = BlockPool::new((CONTEXT + largest).div_ceil(BLOCK), BLOCK);
    let mut table = BlockTable::new();
    anyhow::ensure!(table.ensure_capacity(CONTEXT + largest, &mut pool));
    let vocab = loaded.model.config().vocab_size as u32;
    let token = |i: usize| ((i as u32).wrapping_mul(7919) + 13) % vocab;
    let mut backend = engine::backend::for_model(loaded.model.clone(), pool.num_slots())?;
    let chain = |from: usize, n: usize, logits: LogitRows| -> anyhow::Result<TreeBatch> {
        let tokens: Vec<u32> = (from..from + n).map(token).collect();
        let mut batch = TreeBatch::new(BLOCK);
        batch.push(from, &table, &TokenTree::chain(&tokens), logits)?;
        Ok(batch)
    };
    backend.forward(&chain(0, CONTEXT, LogitRows::Last)?)?;
    let one = chain(CONTEXT, 1, LogitRows::All)?;
    println!(
        "{model}, {}, one-row forwards after each disturbance (ms):",
        engine::calibration::cpu_name()
    );
    for kind in &kinds {
        if let Some((period, k)) = cycle(kind) {
            let multi = chain(CONTEXT, k, LogitRows::All)?;
            let (mut single, mut multis) = (Vec::new(), Vec::new());
            for round in 0..=ROUNDS {
                for i in 0..period * 5 {
                    let last = i % period == period - 1;
                    let t = Instant::now();
                    backend.forward(if last { &multi } else { &one })?;
                    let ms = t.elapsed().as_secs_f64() * 1e3;
                    if round > 0 {
                        if last { &mut multis } else { &mut single }.push(ms);
                    }
                }
            }
            let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
            println!(
                "{kind:>7}: one-row forwards {:.3} ms, {k}-row forwards {:.3} ms (means)",
                mean(&single),
                mean(&multis)
            );
            continue;
        }
        let disturbance = match rows(kind) {
            Some(n) => Some(chain(CONTEXT, n, LogitRows::All)?),
            None => None,
        };
        let mut times: Vec<Vec<f64>> = (0..AFTER).map(|_| Vec::with_capacity(ROUNDS)).collect();
        for round in 0..=ROUNDS {
            if let Some(batch) = &disturbance {
                backend.forward(batch)?;
            } else if let Some(ms) = kind.strip_prefix("ms").and_then(|n| n.parse().ok()) {
                std::thread::sleep(Duration::from_millis(ms));
            }
            for slot in times.iter_mut() {
                let t = Instant::now();
                backend.forward(&one)?;
                if round > 0 {
                    slot.push(t.elapsed().as_secs_f64() * 1e3);
                }
            }
        }
        let medians: Vec<String> = times
            .iter_mut()
            .map(|v| {
                v.sort_by(f64::total_cmp);
                format!("{:.2}", v[v.len() / 2])
            })
            .collect();
        println!("{kind:>7}: {}", medians.join(" "));
    }
    Ok(())
}

fn rows(kind: &str) -> Option<usize> {
    kind.strip_prefix("rows").and_then(|n| n.parse().ok())
}

/// `everyPxK`: a `K`-row forward every `P` forwards.
fn cycle(kind: &str) -> Option<(usize, usize)> {
    let (period, k) = kind.strip_prefix("every")?.split_once('x')?;
    let (period, k) = (period.parse().ok()?, k.parse().ok()?);
    (period > 0 && k > 0).then_some((period, k))
}

fn is_disturbance(arg: &str) -> bool {
    arg == "steady"
        || rows(arg).is_some()
        || cycle(arg).is_some()
        || arg
            .strip_prefix("ms")
            .is_some_and(|n| n.parse::<u64>().is_ok())
}
