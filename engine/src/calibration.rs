//! The start-up calibration: what a forward costs on this machine. The forward-cost curve is
//! the wall time of one forward that verifies N new tokens (a chain with logits for every
//! row, as a verification step needs) over a cached context, for several N
//! ([`forward_cost`]); its shape decides how large draft trees may be: speculation pays only
//! while cost(N) stays close to cost(1). The server measures it once per model and host at
//! start-up and keeps it in the models directory (named with [`cpu_name`]), and the planner
//! prices every step with it. `thicket bench forward` measures several backends at once
//! ([`forward_costs`]) and reports the host's memory [`read_bandwidth`] beside them.

use std::time::Instant;

use kvcache::{BlockPool, BlockTable};

use crate::backend;
use crate::model::fused_pass;
pub use crate::model::fused_pass::ForwardProfile;
use crate::model::Model;
use crate::tree::TokenTree;
use crate::tree_batch::{LogitRows, SeqState, TreeBatch};
use crate::{Error, Result};

/// One measured point.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostPoint {
    /// New tokens in the forward.
    pub new_tokens: usize,
    /// Median seconds per forward.
    pub seconds: f64,
}

/// Measures `cost(n)` for each `n` in `sizes` over a `context_len`-token cached context,
/// taking the median of `repeats` runs (at most `LARGE_REPEATS` for sizes over
/// `SMALL_FORWARD` rows), each after untimed forwards of its size.
pub fn forward_cost(
    model: &Model,
    context_len: usize,
    sizes: &[usize],
    repeats: usize,
) -> Result<Vec<CostPoint>> {
    let mut curves = forward_costs(&[model], context_len, sizes, repeats)?;
    Ok(curves.pop().map(|c| c.points).unwrap_or_default())
}

/// How long forwards of a size run untimed before one of them is timed.
const SETTLE: std::time::Duration = std::time::Duration::from_millis(6);

/// One model's measured curve, with the fused pass's breakdown where it ran (a record of
/// measurements; the planner's curve built from such points is `scheduler::CostCurve`).
#[derive(Debug, Clone, PartialEq)]
pub struct MeasuredCurve {
    /// The backend that ran it ([`crate::Backend::describe`]).
    pub backend: String,
    /// Median seconds per size.
    pub points: Vec<CostPoint>,
    /// Mean seconds per forward in each part, per size (fused pass only).
    pub parts: Vec<Option<ForwardProfile>>,
}

/// `forward_cost` for several models (the same weights run different ways) at once, each
/// through the backend its device gets: each round runs every model in turn over the round's
/// sizes, so the host's noise falls on all of them alike (see `run_round`).
pub fn forward_costs(
    models: &[&Model],
    context_len: usize,
    sizes: &[usize],
    repeats: usize,
) -> Result<Vec<MeasuredCurve>> {
    forward_costs_of(models, context_len, sizes, (repeats, LogitRows::All))
}

/// `forward_costs` with the new tokens' `logits` (every token's, as a draft verified, or
/// the last's, as a prefill chunk that ends its prompt).
pub fn forward_costs_of(
    models: &[&Model],
    context_len: usize,
    sizes: &[usize],
    (repeats, logits): (usize, LogitRows),
) -> Result<Vec<MeasuredCurve>> {
    let block_size = 16;
    let largest = sizes.iter().copied().max().unwrap_or(1);
    let mut pool = BlockPool::new((context_len + largest).div_ceil(block_size), block_size);
    let mut table = BlockTable::new();
    if !table.ensure_capacity(context_len + largest, &mut pool) {
        return Err(Error::OutOfBlocks("bench pool".into()));
    }
    let Some(first) = models.first() else {
        return Ok(Vec::new());
    };
    let vocab = first.config().vocab_size as u32;
    // A deterministic, non-repeating token pattern; content does not change the cost.
    let token = |i: usize| ((i as u32).wrapping_mul(7919) + 13) % vocab;
    let mut backends = Vec::with_capacity(models.len());
    for &model in models {
        let mut backend = backend::for_model(model.clone(), pool.num_slots())?;
        if context_len > 0 {
            let context: Vec<u32> = (0..context_len).map(token).collect();
            let mut batch = TreeBatch::new(block_size);
            batch.push(0, &table, &TokenTree::chain(&context), LogitRows::None)?;
            // A model with recurrent layers keeps the context's state in slot 0.
            batch.set_state(
                0,
                SeqState {
                    slot: 0,
                    commits: true,
                    resume: None,
                },
            )?;
            backend.forward(&batch)?;
        }
        backends.push(backend);
    }
    let mut curves: Vec<MeasuredCurve> = backends
        .iter()
        .map(|b| MeasuredCurve {
            backend: b.describe(),
            points: Vec::new(),
            parts: Vec::new(),
        })
        .collect();
    let repeats = repeats.max(1);
    let batches = sizes
        .iter()
        .map(|&n| {
            let tokens: Vec<u32> = (context_len..context_len + n).map(token).collect();
            let mut batch = TreeBatch::new(block_size);
            batch.push(context_len, &table, &TokenTree::chain(&tokens), logits)?;
            // Verified, not kept: every repeat starts from the context's state.
            batch.set_state(
                0,
                SeqState {
                    slot: 0,
                    commits: false,
                    resume: None,
                },
            )?;
            Ok(batch)
        })
        .collect::<Result<Vec<_>>>()?;
    // times[size][model], parts[size][model]. Rounds go over every size, so a burst of the
    // host's noise falls on one round of every size rather than on every round of one size
    // (which would skew the curve's shape, not only its level). The sizes a draft tree
    // decides among are measured in rounds of their own, before the larger ones: for tens of
    // milliseconds after forwards of 16 to 64 rows, few-row forwards ran up to 1.5 times
    // slower (one row: 4.51 ms in rounds with 64 rows, 2.89 alone and 3.09 in rounds up to
    // 8 rows, where the engine's own one-row steps took 2.84; SmolLM2 on 2 cores of an Intel
    // Xeon), which priced a few more rows at nearly nothing. The larger sizes take at most
    // `LARGE_REPEATS` rounds: they decide only whether many sequences draft at all, a round
    // of them costs several times one of the small ones (Qwen2.5-Coder-1.5B: 0.9 s), and
    // their noise is a smaller share of their time.
    let mut times = vec![vec![Vec::with_capacity(repeats); models.len()]; sizes.len()];
    let mut parts = vec![vec![ForwardProfile::default(); models.len()]; sizes.len()];
    let small = |n: usize| n <= SMALL_FORWARD;
    let groups = [
        (0..sizes.len())
            .filter(|&s| small(sizes[s]))
            .collect::<Vec<_>>(),
        (0..sizes.len()).filter(|&s| !small(sizes[s])).collect(),
    ];
    for (group, repeats) in groups.iter().zip([repeats, repeats.min(LARGE_REPEATS)]) {
        for repeat in 0..=repeats {
            run_round(
                &mut backends,
                &batches,
                group,
                repeat > 0,
                &mut times,
                &mut parts,
            )?;
        }
    }
    for ((&n, times), parts) in sizes.iter().zip(times).zip(parts) {
        for (i, (curve, mut times)) in curves.iter_mut().zip(times).enumerate() {
            times.sort_by(f64::total_cmp);
            // Every size had at least one timed round (`repeats` is at least 1).
            let rounds = times.len().max(1);
            curve.points.push(CostPoint {
                new_tokens: n,
                seconds: times[times.len() / 2],
            });
            curve.parts.push(
                backends[i]
                    .profiles_parts()
                    .then(|| parts[i].scaled(1.0 / rounds as f64)),
            );
        }
    }
    Ok(curves)
}

/// Sizes of at most this many rows are measured in rounds of their own (see
/// [`forward_costs`]).
const SMALL_FORWARD: usize = 8;

/// The most timed rounds of the larger sizes (see [`forward_costs`]).
const LARGE_REPEATS: usize = 9;

/// One round over the batches at `group`'s indices: each backend in turn runs every size;
/// `timed`: each forward is timed after untimed forwards of its own size, into
/// `times[size][model]` and `parts[size][model]` (an untimed round warms up).
///
/// Where several backends share the run (`thicket bench forward`'s reference through
/// candle's ops reads its own copy of the weights), each first decodes untimed for
/// `SWITCH_SETTLE`: on a host whose one-row forward reads the weights faster while they are
/// re-read every few milliseconds, a one-row forward right after another backend's turn ran
/// up to 1.6x slower for some 60 forwards (`benches/resume.rs`), which made the first few
/// sizes look cheaper against one row than the engine's steps show.
fn run_round(
    backends: &mut [Box<dyn backend::Backend>],
    batches: &[TreeBatch],
    group: &[usize],
    timed: bool,
    times: &mut [Vec<Vec<f64>>],
    parts: &mut [Vec<ForwardProfile>],
) -> Result<()> {
    let several = backends.len() > 1;
    for (i, backend) in backends.iter_mut().enumerate() {
        if several {
            if let Some(&first) = group.first() {
                settle(backend.as_mut(), &batches[first], SWITCH_SETTLE)?;
            }
        }
        for &s in group {
            let batch = &batches[s];
            if timed {
                // Each timed forward follows untimed ones of its own size for a few
                // milliseconds, as a decode step follows steps of about its size: for
                // some milliseconds after a much larger forward, forwards run slower
                // (one row right after 64 rows: 2.52 ms, after one or two rows 2.16;
                // after a single forward of one row, 2.15 against 1.89; SmolLM2 on 2
                // cores), which made cost(1) read above cost(2) and small trees look
                // free.
                settle(backend.as_mut(), batch, SETTLE)?;
            }
            fused_pass::profile(timed && backend.profiles_parts());
            let t = Instant::now();
            backend.forward(batch)?;
            let elapsed = t.elapsed().as_secs_f64();
            let part = fused_pass::profile(false);
            if timed {
                times[s][i].push(elapsed);
                parts[s][i].add(&part);
            }
        }
    }
    Ok(())
}

/// Runs `batch` untimed for at least `how_long` (at least once).
fn settle(
    backend: &mut dyn backend::Backend,
    batch: &TreeBatch,
    how_long: std::time::Duration,
) -> Result<()> {
    let warm = Instant::now();
    while {
        backend.forward(batch)?;
        warm.elapsed() < how_long
    } {}
    Ok(())
}

/// How long each backend decodes untimed before its turn in a round shared with others.
const SWITCH_SETTLE: std::time::Duration = std::time::Duration::from_millis(300);

/// The CPU's model name as the OS reports it (`/proc/cpuinfo`), or the architecture.
pub fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, name)| name.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

/// Memory read bandwidth in bytes per second: the best of `repeats` passes summing a
/// `bytes`-sized buffer (much larger than the caches) on every core at once, as a decode
/// step streams the weights. The bound on single-row decoding is this over the weight bytes.
pub fn read_bandwidth(bytes: usize, repeats: usize) -> f64 {
    let words = (bytes / 8).max(1);
    let buffer: Vec<u64> = (0..words as u64).collect();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let chunk = words.div_ceil(threads);
    let mut best = f64::INFINITY;
    let mut checksum = 0u64;
    for _ in 0..repeats.max(1) {
        let started = Instant::now();
        let sums: Vec<u64> = std::thread::scope(|scope| {
            let handles: Vec<_> = buffer
                .chunks(chunk)
                .map(|part| scope.spawn(move || part.iter().fold(0u64, |a, &w| a.wrapping_add(w))))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap_or(0)).collect()
        });
        best = best.min(started.elapsed().as_secs_f64());
        checksum = sums.iter().fold(checksum, |a, &s| a.wrapping_add(s));
    }
    // The checksum keeps the reads from being optimized away.
    std::hint::black_box(checksum);
    (words * 8) as f64 / best.max(1e-12)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_bandwidth_is_a_positive_rate() {
        let rate = read_bandwidth(8 << 20, 2);
        // Any machine reads 8 MiB at more than 10 MB/s and less than 10 TB/s.
        assert!(rate > 1e7 && rate < 1e13, "{rate}");
    }
}
