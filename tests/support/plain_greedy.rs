//! A second, minimal way to generate, kept as the tests' oracle: plain greedy decoding
//! straight over the model's backend (`backend::for_model`, the one the engine gets, so on a
//! GPU the oracle runs the same kernels) and a `BlockManager`, with none of the
//! serving engine's scheduling, chunking, preemption or speculation. Every prompt is admitted
//! (reusing cached prefix blocks) and prefilled in one batch, forked `n` ways if asked, then
//! every unfinished sequence decodes one token per step in one shared forward. The engine's
//! outputs are checked against it.

use std::time::Instant;

use engine::sampler::argmax;
use engine::{Backend, Error, FinishReason, LogitRows, Model, Result, TokenTree, TreeBatch};
use kvcache::{BlockManager, BlockTable, ManagerConfig, SeqId};

/// Block manager plus the backend holding the KV rows, kept together so that every plan the
/// manager returns (copy-on-write row copies) is executed on the rows before anyone reads them.
pub struct KvCache {
    blocks: BlockManager,
    backend: Box<dyn Backend>,
    next_seq_id: u64,
}

impl KvCache {
    /// A cache for `model` with the pool described by `config`.
    pub fn new(model: &Model, config: ManagerConfig) -> Self {
        let blocks = BlockManager::new(config);
        let backend =
            engine::backend::for_model(model.clone(), blocks.num_slots()).expect("a backend");
        Self {
            blocks,
            backend,
            next_seq_id: 0,
        }
    }

    /// An id no live sequence of this cache uses, for callers without their own ids.
    pub fn new_seq_id(&mut self) -> SeqId {
        loop {
            let seq = SeqId(self.next_seq_id);
            self.next_seq_id = self.next_seq_id.wrapping_add(1);
            if !self.blocks.contains(seq) {
                return seq;
            }
        }
    }

    /// The block manager (read-only; changes go through this type).
    pub fn blocks(&self) -> &BlockManager {
        &self.blocks
    }

    /// Runs `batch` on the backend (writing its rows' K/V): the logits asked for.
    pub fn forward(&mut self, batch: &TreeBatch) -> Result<Vec<Vec<f32>>> {
        self.backend.forward(batch)
    }

    /// Positions per block.
    pub fn block_size(&self) -> usize {
        self.blocks.block_size()
    }

    /// The block table of a live sequence.
    pub fn table(&self, seq: SeqId) -> Result<&BlockTable> {
        self.blocks
            .block_table(seq)
            .ok_or(Error::KvCache(kvcache::KvError::UnknownSeq(seq)))
    }

    /// Admits `seq` with prompt `tokens`, reserving `reserve` positions. Returns the number
    /// of prompt tokens already cached, or `None` when the pool has no room.
    pub fn admit(&mut self, seq: SeqId, tokens: &[u32], reserve: usize) -> Result<Option<usize>> {
        Ok(self.blocks.admit(seq, tokens, reserve, None)?)
    }

    /// Makes room for `seq` to write up to position `len` (copying shared blocks first).
    /// Returns false, with nothing changed, when the pool has no room.
    pub fn ensure_capacity(&mut self, seq: SeqId, len: usize) -> Result<bool> {
        match self.blocks.ensure_capacity(seq, len)? {
            Some(copies) => {
                self.backend.move_kv(&copies)?;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Declares `tokens` the final content of `seq`'s first `tokens.len()` positions.
    pub fn commit(&mut self, seq: SeqId, tokens: &[u32]) -> Result<()> {
        Ok(self.blocks.commit(seq, tokens)?)
    }

    /// Makes `child` share `parent`'s committed KV (copy-on-write).
    pub fn fork(&mut self, parent: SeqId, child: SeqId) -> Result<()> {
        Ok(self.blocks.fork(parent, child)?)
    }

    /// Block counts and prefix-cache counters.
    pub fn stats(&self) -> kvcache::CacheStats {
        self.blocks.stats()
    }

    /// Frees `seq`'s blocks (hashed ones stay cached).
    pub fn release(&mut self, seq: SeqId) -> Result<()> {
        Ok(self.blocks.release(seq)?)
    }
}

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
fn argmax_rows(logits: &[Vec<f32>]) -> Vec<u32> {
    logits.iter().map(|r| argmax(r)).collect()
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
        window: None,
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
    generate_greedy_with(&mut cache, prompts, options)
}

/// Generates greedily for every prompt, all decoding together, in a cache that outlives the
/// call (so a later call can reuse this one's prompts through the prefix cache). Every
/// sequence is released before returning, also on error.
pub fn generate_greedy_with(
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
    let result = run_greedy(cache, prompts, options, &mut live);
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
    let first = argmax_rows(&cache.forward(&batch)?);
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
        let next = argmax_rows(&cache.forward(&batch)?);
        for (&i, &token) in active.iter().zip(&next) {
            let s = &mut seqs[i];
            cache.commit(s.seq, &s.tokens)?;
            s.tokens.push(token);
        }
    }
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
