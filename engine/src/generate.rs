//! Plain greedy autoregressive generation through the batched forward, for `thicket
//! generate`, the forward-cost bench and the correctness tests. Every prompt is prefilled in
//! one batch, then every unfinished sequence decodes one token per step in one shared
//! forward. (The serving engine's scheduler, with chunking and preemption, builds on the same
//! forward; this is its simplest client.)

use std::time::Instant;

use candle_core::Tensor;
use kvcache::{BlockPool, BlockTable};

use crate::batch::{LogitRows, TreeBatch};
use crate::model::Model;
use crate::tree::TokenTree;
use crate::{Error, Result};

/// Why a generation stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// Produced an end-of-sequence token.
    Eos,
    /// Hit `max_tokens`.
    Length,
}

/// Options shared by every prompt of a call.
#[derive(Debug, Clone)]
pub struct GreedyOptions {
    /// Tokens to generate at most (the EOS token counts).
    pub max_tokens: usize,
    /// Tokens that end a sequence.
    pub eos_ids: Vec<u32>,
    /// KV block size.
    pub block_size: usize,
    /// Hand blocks out in a scrambled order (tests of paging).
    pub scramble_blocks: bool,
}

impl Default for GreedyOptions {
    fn default() -> Self {
        Self {
            max_tokens: 64,
            eos_ids: Vec::new(),
            block_size: 16,
            scramble_blocks: false,
        }
    }
}

/// One prompt's result.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    /// Generated ids (EOS included when it ended the sequence).
    pub token_ids: Vec<u32>,
    /// Why it stopped.
    pub finish: FinishReason,
    /// Seconds spent prefilling (shared by the whole call).
    pub prefill_seconds: f64,
    /// Seconds spent decoding (shared by the whole call).
    pub decode_seconds: f64,
}

/// Index of the largest value; the first one on ties.
pub fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in row.iter().enumerate() {
        if x > row[best] {
            best = i;
        }
    }
    best as u32
}

/// Greedy next token of every logits row.
pub fn argmax_rows(logits: &Tensor) -> Result<Vec<u32>> {
    Ok(logits.to_vec2::<f32>()?.iter().map(|r| argmax(r)).collect())
}

/// Generates greedily for every prompt, all decoding together.
pub fn generate_greedy(
    model: &Model,
    prompts: &[Vec<u32>],
    options: &GreedyOptions,
) -> Result<Vec<Generation>> {
    if prompts.iter().any(Vec::is_empty) {
        return Err(Error::EmptyPrompt);
    }
    let bs = options.block_size;
    let blocks: usize = prompts
        .iter()
        .map(|p| (p.len() + options.max_tokens).div_ceil(bs))
        .sum();
    let mut pool = BlockPool::new(blocks, bs);
    let mut tables: Vec<BlockTable> = vec![BlockTable::new(); prompts.len()];
    if options.scramble_blocks {
        // Take every block, then give each sequence every third one from the end.
        let mut all: Vec<_> = (0..blocks).filter_map(|_| pool.allocate()).collect();
        all.reverse();
        let stride = 3.min(all.len().max(1));
        let order: Vec<_> = (0..stride)
            .flat_map(|s| all.iter().skip(s).step_by(stride).copied())
            .collect();
        let mut it = order.into_iter();
        for (table, p) in tables.iter_mut().zip(prompts) {
            let n = (p.len() + options.max_tokens).div_ceil(bs);
            *table = BlockTable::from_blocks(it.by_ref().take(n).collect());
        }
    } else {
        for (table, p) in tables.iter_mut().zip(prompts) {
            if !table.ensure_capacity(p.len() + options.max_tokens, &mut pool) {
                return Err(Error::OutOfBlocks("generation pool too small".into()));
            }
        }
    }
    let mut kv = model.new_kv_store(pool.num_slots());

    let started = Instant::now();
    let mut batch = TreeBatch::new(bs);
    for (p, table) in prompts.iter().zip(&tables) {
        batch.push(0, table, &TokenTree::chain(p), LogitRows::Last)?;
    }
    let mut next = argmax_rows(&model.forward(&batch, &mut kv)?)?;
    let prefill_seconds = started.elapsed().as_secs_f64();

    let started = Instant::now();
    let mut outputs: Vec<Vec<u32>> = vec![Vec::new(); prompts.len()];
    let mut finish: Vec<Option<FinishReason>> = vec![None; prompts.len()];
    let mut lens: Vec<usize> = prompts.iter().map(Vec::len).collect();
    loop {
        let mut active = Vec::new();
        for (i, &token) in next.iter().enumerate() {
            if finish[i].is_some() {
                continue;
            }
            outputs[i].push(token);
            if options.eos_ids.contains(&token) {
                finish[i] = Some(FinishReason::Eos);
            } else if outputs[i].len() >= options.max_tokens {
                finish[i] = Some(FinishReason::Length);
            } else {
                active.push(i);
            }
        }
        if active.is_empty() {
            break;
        }
        let mut batch = TreeBatch::new(bs);
        for &i in &active {
            let token = *outputs[i].last().expect("invariant: just pushed");
            batch.push(
                lens[i],
                &tables[i],
                &TokenTree::chain(&[token]),
                LogitRows::Last,
            )?;
            lens[i] += 1;
        }
        let step = argmax_rows(&model.forward(&batch, &mut kv)?)?;
        next = vec![0; prompts.len()];
        for (&i, &token) in active.iter().zip(&step) {
            next[i] = token;
        }
    }
    let decode_seconds = started.elapsed().as_secs_f64();
    Ok(outputs
        .into_iter()
        .zip(finish)
        .map(|(token_ids, finish)| Generation {
            token_ids,
            finish: finish.unwrap_or(FinishReason::Length),
            prefill_seconds,
            decode_seconds,
        })
        .collect())
}
