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
