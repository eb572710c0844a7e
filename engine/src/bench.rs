//! The forward-cost curve: wall time of one forward that verifies N new tokens (a chain with
//! logits for every row, as a verification step needs) over a cached context, for several N.
//! Its shape decides how large draft trees may be: speculation pays only while cost(N) stays
//! close to cost(1).

use std::time::Instant;

use kvcache::{BlockPool, BlockTable};

use crate::batch::{LogitRows, TreeBatch};
use crate::model::Model;
use crate::tree::TokenTree;
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
/// taking the median of `repeats` runs after one warm-up.
pub fn forward_cost(
    model: &Model,
    context_len: usize,
    sizes: &[usize],
    repeats: usize,
) -> Result<Vec<CostPoint>> {
    let block_size = 16;
    let largest = sizes.iter().copied().max().unwrap_or(1);
    let mut pool = BlockPool::new((context_len + largest).div_ceil(block_size), block_size);
    let mut table = BlockTable::new();
    if !table.ensure_capacity(context_len + largest, &mut pool) {
        return Err(Error::OutOfBlocks("bench pool".into()));
    }
    let mut kv = model.new_kv_store(pool.num_slots());
    let vocab = model.config().vocab_size as u32;
    // A deterministic, non-repeating token pattern; content does not change the cost.
    let token = |i: usize| ((i as u32).wrapping_mul(7919) + 13) % vocab;
    if context_len > 0 {
        let context: Vec<u32> = (0..context_len).map(token).collect();
        let mut batch = TreeBatch::new(block_size);
        batch.push(0, &table, &TokenTree::chain(&context), LogitRows::None)?;
        model.forward(&batch, &mut kv)?;
    }
    let mut points = Vec::with_capacity(sizes.len());
    for &n in sizes {
        let tokens: Vec<u32> = (context_len..context_len + n).map(token).collect();
        let mut batch = TreeBatch::new(block_size);
        batch.push(
            context_len,
            &table,
            &TokenTree::chain(&tokens),
            LogitRows::All,
        )?;
        model.forward(&batch, &mut kv)?;
        let mut times: Vec<f64> = (0..repeats.max(1))
            .map(|_| {
                let t = Instant::now();
                model
                    .forward(&batch, &mut kv)
                    .map(|_| t.elapsed().as_secs_f64())
            })
            .collect::<Result<_>>()?;
        times.sort_by(f64::total_cmp);
        points.push(CostPoint {
            new_tokens: n,
            seconds: times[times.len() / 2],
        });
    }
    Ok(points)
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
