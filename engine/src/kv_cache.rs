//! `KvCache`: the block manager and the KV rows it manages, kept together so that every
//! plan the manager returns (copy-on-write row copies, compaction moves) is executed on the
//! store before anyone can read the rows. The engine owns one; the forward reads the store
//! and the block tables, and this type publishes the KV metrics.

use kvcache::{BlockManager, BlockTable, CacheStats, ManagerConfig, SeqId};

use crate::model::Model;
use crate::{Error, PagedKvStore, Result};

/// Metric names published by [`KvCache::publish_metrics`].
pub mod metric_names {
    /// Gauge: blocks in the pool.
    pub const BLOCKS_TOTAL: &str = "thicket_kv_blocks_total";
    /// Gauge: blocks referenced by live sequences.
    pub const BLOCKS_IN_USE: &str = "thicket_kv_blocks_in_use";
    /// Gauge: unreferenced blocks kept for the prefix cache.
    pub const BLOCKS_CACHED: &str = "thicket_kv_blocks_cached";
    /// Counter: prompt tokens looked up in the prefix cache (as vLLM counts queries).
    pub const PREFIX_QUERIES: &str = "thicket_prefix_cache_queries_total";
    /// Counter: prompt tokens whose KV was reused from the prefix cache.
    pub const PREFIX_HIT_TOKENS: &str = "thicket_prefix_cache_hit_tokens_total";
}

/// Registers descriptions of the KV metrics with the installed recorder.
pub fn describe_metrics() {
    use metric_names::*;
    metrics::describe_gauge!(BLOCKS_TOTAL, "KV cache blocks in the pool");
    metrics::describe_gauge!(
        BLOCKS_IN_USE,
        "KV cache blocks referenced by live sequences"
    );
    metrics::describe_gauge!(
        BLOCKS_CACHED,
        "Unreferenced KV blocks kept for prefix reuse"
    );
    metrics::describe_counter!(
        PREFIX_QUERIES,
        "Prompt tokens looked up in the prefix cache"
    );
    metrics::describe_counter!(
        PREFIX_HIT_TOKENS,
        "Prompt tokens served from the prefix cache"
    );
}

/// Block manager plus KV rows.
#[derive(Debug, Clone)]
pub struct KvCache {
    blocks: BlockManager,
    store: PagedKvStore,
    next_seq_id: u64,
}

impl KvCache {
    /// A cache for `model` with the pool described by `config`.
    pub fn new(model: &Model, config: ManagerConfig) -> Self {
        let blocks = BlockManager::new(config);
        let store = model.new_kv_store(blocks.num_slots());
        Self {
            blocks,
            store,
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

    /// The KV rows, for the forward.
    pub fn store_mut(&mut self) -> &mut PagedKvStore {
        &mut self.store
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
        Ok(self.blocks.admit(seq, tokens, reserve)?)
    }

    /// Makes room for `seq` to write up to position `len` (copying shared blocks first).
    /// Returns false, with nothing changed, when the pool has no room.
    pub fn ensure_capacity(&mut self, seq: SeqId, len: usize) -> Result<bool> {
        match self.blocks.ensure_capacity(seq, len)? {
            Some(copies) => {
                self.store.apply_moves(&copies)?;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Declares `tokens` the final content of `seq`'s first `tokens.len()` positions.
    pub fn commit(&mut self, seq: SeqId, tokens: &[u32]) -> Result<()> {
        Ok(self.blocks.commit(seq, tokens)?)
    }

    /// Moves the accepted tree path (node indices, increasing) written from `num_computed`
    /// into consecutive positions, then frees blocks past `num_computed + accepted.len()`.
    pub fn compact(&mut self, seq: SeqId, num_computed: usize, accepted: &[usize]) -> Result<()> {
        let moves = self.blocks.plan_compaction(seq, num_computed, accepted)?;
        self.store.apply_moves(&moves)?;
        self.blocks.truncate(seq, num_computed + accepted.len())?;
        Ok(())
    }

    /// Cuts `seq` to `len` positions, releasing whole trailing blocks.
    pub fn truncate(&mut self, seq: SeqId, len: usize) -> Result<usize> {
        Ok(self.blocks.truncate(seq, len)?)
    }

    /// Makes `child` share `parent`'s committed KV (copy-on-write).
    pub fn fork(&mut self, parent: SeqId, child: SeqId) -> Result<()> {
        Ok(self.blocks.fork(parent, child)?)
    }

    /// Frees `seq`'s blocks (hashed ones stay cached).
    pub fn release(&mut self, seq: SeqId) -> Result<()> {
        Ok(self.blocks.release(seq)?)
    }

    /// Block counts and prefix-cache counters.
    pub fn stats(&self) -> CacheStats {
        self.blocks.stats()
    }

    /// Publishes the KV gauges and counters to the installed `metrics` recorder.
    pub fn publish_metrics(&self) {
        publish_metrics(&self.stats());
    }
}

/// Publishes KV block counts to the installed `metrics` recorder.
pub fn publish_metrics(stats: &CacheStats) {
    use metric_names::*;
    metrics::gauge!(BLOCKS_TOTAL).set(stats.total as f64);
    metrics::gauge!(BLOCKS_IN_USE).set(stats.in_use as f64);
    metrics::gauge!(BLOCKS_CACHED).set(stats.cached as f64);
    metrics::counter!(PREFIX_QUERIES).absolute(stats.prefix_query_tokens);
    metrics::counter!(PREFIX_HIT_TOKENS).absolute(stats.prefix_hit_tokens);
}
