//! Plain greedy autoregressive generation through the batched forward and the KV cache, for
//! `thicket generate`, the forward-cost bench and the correctness tests. Every prompt is
//! admitted (reusing cached prefix blocks) and prefilled in one batch, forked `n` ways if
//! asked, then every unfinished sequence decodes one token per step in one shared forward. (The serving engine's scheduler, with chunking and preemption, builds on the same
//! forward; this is its simplest client.)

use std::time::Instant;

use candle_core::Tensor;
use kvcache::{ManagerConfig, SeqId};

use crate::batch::{LogitRows, TreeBatch};
use crate::kv_cache::KvCache;
use crate::model::Model;
pub use crate::request::FinishReason;
pub use crate::sampler::argmax;
use crate::tree::TokenTree;
use crate::{Error, Result};

/// Options shared by every prompt of a call.
#[derive(Debug, Clone)]
pub struct GreedyOptions {
    /// Tokens to generate at most (the EOS token counts).
    pub max_tokens: usize,
    /// Tokens that end a sequence.
    pub eos_ids: Vec<u32>,
    /// Sequences per prompt; they share the prompt's KV blocks (forked after its prefill).
    pub n: usize,
}

impl Default for GreedyOptions {
    fn default() -> Self {
        Self {
            max_tokens: 64,
            eos_ids: Vec::new(),
            n: 1,
        }
    }
}

/// One sequence's result.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    /// Generated ids (EOS included when it ended the sequence).
    pub token_ids: Vec<u32>,
    /// Why it stopped.
    pub finish: FinishReason,
    /// Prompt tokens whose KV came from the prefix cache instead of being computed.
    pub cached_tokens: usize,
    /// Seconds spent prefilling (shared by the whole call).
    pub prefill_seconds: f64,
    /// Seconds spent decoding (shared by the whole call).
    pub decode_seconds: f64,
}

/// Greedy next token of every logits row.
pub fn argmax_rows(logits: &Tensor) -> Result<Vec<u32>> {
    Ok(logits.to_vec2::<f32>()?.iter().map(|r| argmax(r)).collect())
}

/// A KV pool just large enough for one [`generate_greedy_with`] call over `prompts`.
pub fn cache_config_for(
    prompts: &[Vec<u32>],
    options: &GreedyOptions,
    block_size: usize,
    prefix_caching: bool,
) -> ManagerConfig {
    let per_seq = |p: &Vec<u32>| (p.len() + options.max_tokens).div_ceil(block_size);
    ManagerConfig {
        num_blocks: prompts.iter().map(per_seq).sum::<usize>() * options.n.max(1),
        block_size,
        prefix_caching,
        watermark: 0.0,
    }
}

/// Generates greedily for every prompt in a cache made for the call (blocks of 16).
/// Results are in prompt order, `n` per prompt.
pub fn generate_greedy(
    model: &Model,
    prompts: &[Vec<u32>],
    options: &GreedyOptions,
) -> Result<Vec<Generation>> {
    let mut cache = KvCache::new(model, cache_config_for(prompts, options, 16, true));
    generate_greedy_with(model, &mut cache, prompts, options)
}

/// Generates greedily for every prompt, all decoding together, in a cache that outlives the
/// call (so a later call can reuse this one's prompts through the prefix cache). Every
/// sequence is released before returning, also on error.
pub fn generate_greedy_with(
    model: &Model,
    cache: &mut KvCache,
    prompts: &[Vec<u32>],
    options: &GreedyOptions,
) -> Result<Vec<Generation>> {
    if prompts.iter().any(Vec::is_empty) {
        return Err(Error::EmptyPrompt);
    }
    if options.n == 0 {
        return Err(Error::InvalidBatch("n must be at least 1".into()));
    }
    let mut live = Vec::new();
    let result = run_greedy(model, cache, prompts, options, &mut live);
    for seq in live {
        cache.release(seq)?;
    }
    result
}

/// One sequence being decoded.
struct Decoding {
    seq: SeqId,
    /// Tokens whose KV is committed, then the pending one.
    tokens: Vec<u32>,
    output: Vec<u32>,
    cached_tokens: usize,
    finish: Option<FinishReason>,
}

fn run_greedy(
    model: &Model,
    cache: &mut KvCache,
    prompts: &[Vec<u32>],
    options: &GreedyOptions,
    live: &mut Vec<SeqId>,
) -> Result<Vec<Generation>> {
    let bs = cache.block_size();
    let started = Instant::now();
    let mut batch = TreeBatch::new(bs);
    let mut parents = Vec::with_capacity(prompts.len());
    for prompt in prompts {
        let seq = cache.new_seq_id();
        let reserve = prompt.len() + options.max_tokens;
        let cached = cache
            .admit(seq, prompt, reserve)?
            .ok_or_else(|| Error::OutOfBlocks(format!("no room for a {reserve}-token sequence")))?;
        live.push(seq);
        let table = cache.table(seq)?;
        batch.push(
            cached,
            table,
            &TokenTree::chain(&prompt[cached..]),
            LogitRows::Last,
        )?;
        parents.push((seq, cached));
    }
    let first = argmax_rows(&model.forward(&batch, cache.store_mut())?)?;
    let prefill_seconds = started.elapsed().as_secs_f64();

    let started = Instant::now();
    let mut seqs = Vec::with_capacity(prompts.len() * options.n);
    for ((prompt, &(parent, cached)), &token) in prompts.iter().zip(&parents).zip(&first) {
        cache.commit(parent, prompt)?;
        for sample in 0..options.n {
            let seq = if sample == 0 {
                parent
            } else {
                let child = cache.new_seq_id();
                cache.fork(parent, child)?;
                live.push(child);
                child
            };
            let mut tokens = prompt.clone();
            tokens.push(token);
            seqs.push(Decoding {
                seq,
                tokens,
                output: Vec::new(),
                cached_tokens: cached,
                finish: None,
            });
        }
    }
    loop {
        let mut batch = TreeBatch::new(bs);
        let mut active = Vec::new();
        for (i, s) in seqs.iter_mut().enumerate() {
            if s.finish.is_some() {
                continue;
            }
            let token = *s.tokens.last().expect("invariant: a pending token");
            s.output.push(token);
            if options.eos_ids.contains(&token) {
                s.finish = Some(FinishReason::Eos);
            } else if s.output.len() >= options.max_tokens {
                s.finish = Some(FinishReason::Length);
            } else {
                let context = s.tokens.len() - 1;
                if !cache.ensure_capacity(s.seq, context + 1)? {
                    return Err(Error::OutOfBlocks("pool ran dry while decoding".into()));
                }
                batch.push(
                    context,
                    cache.table(s.seq)?,
                    &TokenTree::chain(&[token]),
                    LogitRows::Last,
                )?;
                active.push(i);
            }
        }
        if active.is_empty() {
            break;
        }
        let next = argmax_rows(&model.forward(&batch, cache.store_mut())?)?;
        for (&i, &token) in active.iter().zip(&next) {
            let s = &mut seqs[i];
            cache.commit(s.seq, &s.tokens)?;
            s.tokens.push(token);
        }
    }
    cache.publish_metrics();
    let decode_seconds = started.elapsed().as_secs_f64();
    Ok(seqs
        .into_iter()
        .map(|s| Generation {
            token_ids: s.output,
            finish: s.finish.unwrap_or(FinishReason::Length),
            cached_tokens: s.cached_tokens,
            prefill_seconds,
            decode_seconds,
        })
        .collect())
}
