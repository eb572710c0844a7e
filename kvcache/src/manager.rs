//! `BlockManager`: every sequence's block table over one [`BlockPool`], with copy-on-write
//! sharing and the prefix cache. A sequence's positions `0..len` hold final KV (committed);
//! the table may reach further (room reserved for the next write). Writes only ever go to
//! positions `>= len`, so the only blocks that can need a private copy are those overlapping
//! `[len, new_len)`, and [`BlockManager::ensure_capacity`] makes that copy before the write.
//!
//! ```text
//!  fork(A -> B) at len 6, B = 4:   A: [b0 b1]      b0 full, shared (ref 2)
//!                                  B: [b0 b1]      b1 partial, shared (ref 2)
//!  B.ensure_capacity(7):           B: [b0 b5]      b5 = copy of b1's rows 4, 5 -> KvMoves
//!                                  A: [b0 b1]      b1 back to ref 1; A writes in place
//! ```
//!
//! Prefix cache: when a sequence commits tokens, each newly full block is registered under
//! `BlockHash(parent, tokens)`, the first block's parent being the sequence's cache-salt scope
//! (none without a salt). Admission walks a new prompt's hash chain under its scope and shares
//! every hit; released blocks keep their hash (cached) until the pool runs dry.

use std::collections::HashMap;

use crate::{
    plan_compaction, BlockHash, BlockId, BlockPool, BlockTable, KvError, KvMove, PoolStats, SeqId,
    Slot,
};

/// How a [`BlockManager`] is set up.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ManagerConfig {
    /// Blocks in the pool.
    pub num_blocks: usize,
    /// Positions per block.
    pub block_size: usize,
    /// Register committed blocks and reuse them for new prompts.
    pub prefix_caching: bool,
    /// Fraction of the pool that admission leaves free for running sequences to grow into.
    pub watermark: f64,
}

impl Default for ManagerConfig {
    fn default() -> Self {
        Self {
            num_blocks: 1024,
            block_size: 16,
            prefix_caching: true,
            watermark: 0.01,
        }
    }
}

/// Counts reported by [`BlockManager::stats`]; `free + in_use + cached == total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CacheStats {
    /// Blocks in the pool.
    pub total: usize,
    /// Blocks with no reference and no cached content.
    pub free: usize,
    /// Blocks referenced by live sequences.
    pub in_use: usize,
    /// Unreferenced blocks kept for the prefix cache.
    pub cached: usize,
    /// Cached blocks evicted to satisfy allocations.
    pub evictions: u64,
    /// Prompt tokens looked up in the prefix cache at admission.
    pub prefix_query_tokens: u64,
    /// Of those, tokens whose KV was found cached and reused.
    pub prefix_hit_tokens: u64,
    /// Sequences holding blocks.
    pub num_seqs: usize,
}

#[derive(Debug, Clone, Default)]
struct SeqBlocks {
    table: BlockTable,
    /// Hash chain of the committed full blocks, `hashes[i]` for logical block `i`.
    hashes: Vec<BlockHash>,
    /// The parent of the first block's hash: the sequence's cache-salt scope, if any.
    scope: Option<BlockHash>,
    /// Positions holding final KV.
    len: usize,
}

/// Block tables of every live sequence over one shared pool.
#[derive(Debug, Clone)]
pub struct BlockManager {
    pool: BlockPool,
    seqs: HashMap<SeqId, SeqBlocks>,
    prefix_caching: bool,
    watermark_blocks: usize,
    prefix_query_tokens: u64,
    prefix_hit_tokens: u64,
}

impl BlockManager {
    /// An empty manager.
    ///
    /// # Panics
    /// On a zero block size (a start-up configuration error).
    pub fn new(config: ManagerConfig) -> Self {
        let watermark = config.watermark.clamp(0.0, 1.0) * config.num_blocks as f64;
        Self {
            pool: BlockPool::new(config.num_blocks, config.block_size),
            seqs: HashMap::new(),
            prefix_caching: config.prefix_caching,
            watermark_blocks: watermark.ceil() as usize,
            prefix_query_tokens: 0,
            prefix_hit_tokens: 0,
        }
    }

    /// Positions per block.
    pub fn block_size(&self) -> usize {
        self.pool.block_size()
    }

    /// Rows the KV store needs (`num_blocks * block_size`).
    pub fn num_slots(&self) -> usize {
        self.pool.num_slots()
    }

    /// Whether committed blocks are cached and reused.
    pub fn prefix_caching(&self) -> bool {
        self.prefix_caching
    }

    /// The pool (read-only: every change goes through the manager).
    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// Whether `seq` holds blocks here.
    pub fn contains(&self, seq: SeqId) -> bool {
        self.seqs.contains_key(&seq)
    }

    /// The block table of `seq`.
    pub fn block_table(&self, seq: SeqId) -> Option<&BlockTable> {
        self.seqs.get(&seq).map(|s| &s.table)
    }

    /// Positions of `seq` holding final KV.
    pub fn seq_len(&self, seq: SeqId) -> Option<usize> {
        self.seqs.get(&seq).map(|s| s.len)
    }

    /// Slot of `position` in `seq`'s table.
    pub fn slot(&self, seq: SeqId, position: usize) -> Option<Slot> {
        self.block_table(seq)?.slot(position, self.block_size())
    }

    /// Whether a new sequence needing `num_tokens` positions could be admitted now, leaving
    /// the watermark free (prefix-cache hits, which only lower the need, are not counted).
    pub fn can_allocate(&self, num_tokens: usize) -> bool {
        num_tokens.div_ceil(self.block_size()) + self.watermark_blocks <= self.pool.num_available()
    }

    /// Tokens of `tokens` whose KV is cached right now under `scope` (a cache salt's,
    /// [`BlockHash::scope`]; `None` for none), in whole blocks. At least one token is always
    /// left to compute, since its logits are needed.
    pub fn cached_prefix_len(&self, tokens: &[u32], scope: Option<BlockHash>) -> usize {
        self.prefix_hits(tokens, scope).len() * self.block_size()
    }

    fn prefix_hits(&self, tokens: &[u32], scope: Option<BlockHash>) -> Vec<(BlockId, BlockHash)> {
        if !self.prefix_caching {
            return Vec::new();
        }
        let bs = self.block_size();
        let max_blocks = tokens.len().saturating_sub(1) / bs;
        let mut hits = Vec::new();
        let mut parent = scope;
        for block_tokens in tokens.chunks_exact(bs).take(max_blocks) {
            let hash = BlockHash::new(parent, block_tokens);
            match self.pool.lookup(hash) {
                Some(block) => hits.push((block, hash)),
                None => break,
            }
            parent = Some(hash);
        }
        hits
    }

    /// Admits `seq` with prompt `tokens` under `scope` (its cache salt's, `None` for none):
    /// shares the longest prefix cached under the same scope, then reserves room for
    /// `reserve` positions in all. Returns the number of prompt tokens whose KV is already
    /// there (the sequence's committed length), or `None`, with nothing changed, when the pool
    /// cannot cover the reservation and still keep the watermark free. The blocks it commits
    /// are cached under `scope` too.
    pub fn admit(
        &mut self,
        seq: SeqId,
        tokens: &[u32],
        reserve: usize,
        scope: Option<BlockHash>,
    ) -> Result<Option<usize>, KvError> {
        if self.seqs.contains_key(&seq) {
            return Err(KvError::DuplicateSeq(seq));
        }
        let bs = self.block_size();
        let hits = self.prefix_hits(tokens, scope);
        let hit_tokens = hits.len() * bs;
        let new_blocks = reserve.max(hit_tokens).div_ceil(bs) - hits.len();
        let revived = hits
            .iter()
            .filter(|(block, _)| self.pool.is_cached(*block))
            .count();
        let available = self.pool.num_available() - revived;
        if new_blocks + self.watermark_blocks > available {
            return Ok(None);
        }
        let mut entry = SeqBlocks {
            len: hit_tokens,
            scope,
            ..SeqBlocks::default()
        };
        for (block, hash) in hits {
            self.pool.take_cached(block);
            entry.table.push(block);
            entry.hashes.push(hash);
        }
        for _ in 0..new_blocks {
            let block = self
                .pool
                .allocate()
                .expect("invariant: availability checked above");
            entry.table.push(block);
        }
        self.seqs.insert(seq, entry);
        if self.prefix_caching {
            self.prefix_query_tokens += tokens.len() as u64;
            self.prefix_hit_tokens += hit_tokens as u64;
        }
        Ok(Some(hit_tokens))
    }

    /// Makes `seq`'s table hold `len` positions and makes every block that positions
    /// `seq_len..len` fall in private to `seq`. Returns the row copies of the copy-on-write
    /// (to run before the write), or `None`, with nothing changed, when the pool is too dry.
    pub fn ensure_capacity(
        &mut self,
        seq: SeqId,
        len: usize,
    ) -> Result<Option<Vec<KvMove>>, KvError> {
        let bs = self.block_size();
        let entry = self.seqs.get_mut(&seq).ok_or(KvError::UnknownSeq(seq))?;
        if len <= entry.len {
            return Ok(Some(Vec::new()));
        }
        let first = entry.len / bs;
        let end = len.div_ceil(bs);
        let shared = (first..end.min(entry.table.len()))
            .filter(|&i| self.pool.ref_count(entry.table.blocks()[i]) > 1)
            .count();
        let grow = end.saturating_sub(entry.table.len());
        if shared + grow > self.pool.num_available() {
            return Ok(None);
        }
        let mut moves = Vec::new();
        for i in first..end.min(entry.table.len()) {
            let old = entry.table.blocks()[i];
            if self.pool.ref_count(old) > 1 {
                let new = self
                    .pool
                    .allocate()
                    .expect("invariant: availability checked above");
                let valid = entry.len.min((i + 1) * bs).saturating_sub(i * bs);
                for offset in 0..valid {
                    moves.push(KvMove {
                        from: block_slot(old, bs, offset),
                        to: block_slot(new, bs, offset),
                    });
                }
                entry.table.replace(i, new);
                self.pool.release(old);
            } else {
                // Sole owner about to overwrite rows: the content no longer matches a hash.
                self.pool.unregister(old);
            }
        }
        for _ in 0..grow {
            let block = self
                .pool
                .allocate()
                .expect("invariant: availability checked above");
            entry.table.push(block);
        }
        Ok(Some(moves))
    }

    /// Declares positions `0..tokens.len()` of `seq` final, holding `tokens`. Newly full
    /// blocks are registered in the prefix cache. Only ever grows the committed length; use
    /// [`BlockManager::truncate`] to shrink.
    pub fn commit(&mut self, seq: SeqId, tokens: &[u32]) -> Result<(), KvError> {
        let bs = self.block_size();
        let entry = self.seqs.get_mut(&seq).ok_or(KvError::UnknownSeq(seq))?;
        let len = tokens.len();
        if len < entry.len {
            return Err(KvError::InvalidLength {
                seq,
                len,
                reason: "commit below the committed length",
            });
        }
        if len > entry.table.capacity(bs) {
            return Err(KvError::InvalidLength {
                seq,
                len,
                reason: "commit past the table's capacity",
            });
        }
        entry.len = len;
        if self.prefix_caching {
            for i in entry.hashes.len()..len / bs {
                let parent = entry.hashes.last().copied().or(entry.scope);
                let hash = BlockHash::new(parent, &tokens[i * bs..(i + 1) * bs]);
                // False when another block already holds this content: ours stays private.
                self.pool.register(entry.table.blocks()[i], hash);
                entry.hashes.push(hash);
            }
        }
        Ok(())
    }

    /// Cuts `seq` to `len` positions: the committed length drops to at most `len` and every
    /// whole block past it returns to the pool. Returns how many blocks were released.
    pub fn truncate(&mut self, seq: SeqId, len: usize) -> Result<usize, KvError> {
        let bs = self.block_size();
        let entry = self.seqs.get_mut(&seq).ok_or(KvError::UnknownSeq(seq))?;
        let dropped = entry.table.split_off(len.div_ceil(bs));
        for &block in dropped.iter().rev() {
            self.pool.release(block);
        }
        entry.len = entry.len.min(len);
        entry.hashes.truncate(entry.len / bs);
        Ok(dropped.len())
    }

    /// Registers `child` as a copy of `parent`'s committed positions, sharing every block
    /// (no KV is copied now; the shared partial block is copied when either side writes).
    pub fn fork(&mut self, parent: SeqId, child: SeqId) -> Result<(), KvError> {
        if self.seqs.contains_key(&child) {
            return Err(KvError::DuplicateSeq(child));
        }
        let bs = self.block_size();
        let source = self.seqs.get(&parent).ok_or(KvError::UnknownSeq(parent))?;
        let shared = &source.table.blocks()[..source.len.div_ceil(bs)];
        let entry = SeqBlocks {
            table: BlockTable::from_blocks(shared.to_vec()),
            hashes: source.hashes.clone(),
            scope: source.scope,
            len: source.len,
        };
        for &block in entry.table.blocks() {
            self.pool.retain(block);
        }
        self.seqs.insert(child, entry);
        Ok(())
    }

    /// Releases every block of `seq` (last block first, so a sequence's tail is evicted from
    /// the cache before its head) and forgets the sequence.
    pub fn release(&mut self, seq: SeqId) -> Result<(), KvError> {
        let entry = self.seqs.remove(&seq).ok_or(KvError::UnknownSeq(seq))?;
        for &block in entry.table.blocks().iter().rev() {
            self.pool.release(block);
        }
        Ok(())
    }

    /// Row moves that compact `seq`'s accepted tree path (see [`plan_compaction`]).
    pub fn plan_compaction(
        &self,
        seq: SeqId,
        num_computed: usize,
        accepted: &[usize],
    ) -> Result<Vec<KvMove>, KvError> {
        let table = self.block_table(seq).ok_or(KvError::UnknownSeq(seq))?;
        plan_compaction(table, self.block_size(), num_computed, accepted)
    }

    /// Block counts and prefix-cache counters.
    pub fn stats(&self) -> CacheStats {
        let PoolStats {
            total,
            free,
            in_use,
            cached,
            evictions,
        } = self.pool.stats();
        CacheStats {
            total,
            free,
            in_use,
            cached,
            evictions,
            prefix_query_tokens: self.prefix_query_tokens,
            prefix_hit_tokens: self.prefix_hit_tokens,
            num_seqs: self.seqs.len(),
        }
    }

    /// Checks every invariant; `Err` names the first violation. O(blocks + table entries):
    /// for tests and debugging, not the hot path.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.pool.check_consistency()?;
        let bs = self.block_size();
        let mut holders = vec![0u32; self.pool.num_blocks()];
        for (seq, entry) in &self.seqs {
            for &block in entry.table.blocks() {
                holders[block.0 as usize] += 1;
            }
            if entry.len > entry.table.capacity(bs) {
                return Err(format!("{seq:?} committed {} past its table", entry.len));
            }
            if entry.hashes.len() > entry.len / bs {
                return Err(format!("{seq:?} hashes a block that is not full"));
            }
        }
        for (i, &count) in holders.iter().enumerate() {
            let refs = self.pool.ref_count(BlockId(i as u32));
            if refs != count {
                return Err(format!("block {i}: ref count {refs}, held by {count}"));
            }
        }
        let stats = self.pool.stats();
        if stats.free + stats.in_use + stats.cached != stats.total {
            return Err(format!("counts do not add up: {stats:?}"));
        }
        Ok(())
    }
}

fn block_slot(block: BlockId, block_size: usize, offset: usize) -> Slot {
    Slot(block.0 * block_size as u32 + offset as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manager(num_blocks: usize, block_size: usize) -> BlockManager {
        BlockManager::new(ManagerConfig {
            num_blocks,
            block_size,
            prefix_caching: true,
            watermark: 0.0,
        })
    }

    #[test]
    fn fork_shares_blocks_and_copies_the_partial_one_on_write() {
        let mut m = manager(8, 4);
        let (a, b) = (SeqId(1), SeqId(2));
        let prompt: Vec<u32> = (0..6).collect();
        assert_eq!(m.admit(a, &prompt, 6, None).unwrap(), Some(0));
        m.commit(a, &prompt).unwrap();
        m.fork(a, b).unwrap();
        assert_eq!(m.stats().in_use, 2);
        let moves = m.ensure_capacity(b, 7).unwrap().unwrap();
        // Rows 4 and 5 of the shared partial block are copied to B's private block.
        assert_eq!(moves.len(), 2);
        let (old, new) = (m.block_table(a).unwrap().blocks()[1], {
            m.block_table(b).unwrap().blocks()[1]
        });
        assert_ne!(old, new);
        assert_eq!(moves[0].from, block_slot(old, 4, 0));
        assert_eq!(moves[1].to, block_slot(new, 4, 1));
        // A is sole owner again: no copy.
        assert_eq!(m.ensure_capacity(a, 8).unwrap().unwrap(), vec![]);
        assert_eq!(
            m.block_table(a).unwrap().blocks()[0],
            m.block_table(b).unwrap().blocks()[0]
        );
        m.check_invariants().unwrap();
        m.release(a).unwrap();
        m.release(b).unwrap();
        assert_eq!(m.stats().in_use, 0);
        m.check_invariants().unwrap();
    }

    #[test]
    fn cached_blocks_are_shared_only_within_one_cache_salt() {
        let mut m = manager(16, 4);
        let prompt: Vec<u32> = (10..22).collect();
        let (a, b) = (BlockHash::scope(b"a"), BlockHash::scope(b"b"));
        m.admit(SeqId(1), &prompt, 12, Some(a)).unwrap().unwrap();
        m.commit(SeqId(1), &prompt).unwrap();
        // Neither another salt nor no salt finds salt a's blocks; salt a does.
        assert_eq!(m.cached_prefix_len(&prompt, None), 0);
        assert_eq!(m.cached_prefix_len(&prompt, Some(b)), 0);
        assert_eq!(m.cached_prefix_len(&prompt, Some(a)), 8);
        // A fork commits under its parent's salt.
        m.fork(SeqId(1), SeqId(2)).unwrap();
        let mut longer = prompt.clone();
        longer.extend([7, 7, 7, 7]);
        m.ensure_capacity(SeqId(2), 16).unwrap().unwrap();
        m.commit(SeqId(2), &longer).unwrap();
        m.release(SeqId(1)).unwrap();
        m.release(SeqId(2)).unwrap();
        longer.push(1);
        assert_eq!(m.cached_prefix_len(&longer, Some(a)), 16);
        assert_eq!(m.cached_prefix_len(&longer, None), 0);
        // Unsalted prompts share among themselves as before.
        assert_eq!(m.admit(SeqId(3), &prompt, 12, None).unwrap(), Some(0));
        m.commit(SeqId(3), &prompt).unwrap();
        assert_eq!(m.cached_prefix_len(&prompt, None), 8);
        assert_eq!(m.cached_prefix_len(&prompt, Some(b)), 0);
        m.check_invariants().unwrap();
    }

    #[test]
    fn prefix_hit_reuses_committed_blocks_and_leaves_one_token_to_compute() {
        let mut m = manager(8, 4);
        let prompt: Vec<u32> = (10..22).collect(); // 12 tokens = 3 full blocks
        m.admit(SeqId(1), &prompt, 12, None).unwrap().unwrap();
        m.commit(SeqId(1), &prompt).unwrap();
        m.release(SeqId(1)).unwrap();
        assert_eq!(m.stats().cached, 3);
        // Same prompt: the last block is recomputed so logits exist for the last token.
        assert_eq!(m.admit(SeqId(2), &prompt, 12, None).unwrap(), Some(8));
        assert_eq!(m.stats().cached, 1);
        // A prompt that diverges in block 1 reuses block 0 only.
        let mut other = prompt.clone();
        other[5] = 99;
        assert_eq!(m.admit(SeqId(3), &other, 12, None).unwrap(), Some(4));
        assert_eq!(m.stats().prefix_hit_tokens, 12);
        assert_eq!(m.stats().prefix_query_tokens, 36);
        m.check_invariants().unwrap();
    }

    #[test]
    fn admission_respects_the_pool_and_the_watermark() {
        let mut m = BlockManager::new(ManagerConfig {
            num_blocks: 10,
            block_size: 4,
            prefix_caching: false,
            watermark: 0.2,
        });
        assert!(m.can_allocate(32));
        assert!(!m.can_allocate(33));
        assert_eq!(m.admit(SeqId(1), &[1; 33], 33, None).unwrap(), None);
        assert_eq!(m.stats().in_use, 0);
        assert_eq!(m.admit(SeqId(1), &[1; 32], 32, None).unwrap(), Some(0));
        // Growth may use the watermark, then runs dry without changing anything.
        assert!(m.ensure_capacity(SeqId(1), 40).unwrap().is_some());
        assert_eq!(m.ensure_capacity(SeqId(1), 41).unwrap(), None);
        assert_eq!(m.block_table(SeqId(1)).unwrap().len(), 10);
        assert_eq!(
            m.admit(SeqId(1), &[1], 1, None),
            Err(KvError::DuplicateSeq(SeqId(1)))
        );
        assert_eq!(m.release(SeqId(9)), Err(KvError::UnknownSeq(SeqId(9))));
    }

    #[test]
    fn truncate_returns_trailing_blocks_and_rewrite_drops_a_stale_hash() {
        let mut m = manager(8, 4);
        let s = SeqId(1);
        let tokens: Vec<u32> = (0..8).collect();
        m.admit(s, &tokens, 16, None).unwrap().unwrap();
        m.commit(s, &tokens).unwrap();
        assert_eq!(m.truncate(s, 6).unwrap(), 2);
        assert_eq!(m.seq_len(s), Some(6));
        let block1 = m.block_table(s).unwrap().blocks()[1];
        assert!(m.pool().hash_of(block1).is_some());
        // Writing position 6 overwrites block 1's content: its hash must go.
        assert_eq!(m.ensure_capacity(s, 8).unwrap().unwrap(), vec![]);
        assert_eq!(m.pool().hash_of(block1), None);
        m.check_invariants().unwrap();
    }

    #[test]
    fn eviction_happens_only_when_the_pool_runs_dry() {
        let mut m = manager(4, 2);
        let tokens = [1, 2, 3, 4];
        m.admit(SeqId(1), &tokens, 4, None).unwrap().unwrap();
        m.commit(SeqId(1), &tokens).unwrap();
        m.release(SeqId(1)).unwrap();
        m.admit(SeqId(2), &[9, 9], 4, None).unwrap().unwrap();
        assert_eq!(m.stats().cached, 2);
        assert_eq!(m.stats().evictions, 0);
        m.ensure_capacity(SeqId(2), 6).unwrap().unwrap();
        // The tail block (released first) is evicted; the head is still a hit.
        assert_eq!(m.stats().evictions, 1);
        assert_eq!(m.cached_prefix_len(&[1, 2, 3, 4, 5], None), 2);
        m.check_invariants().unwrap();
    }
}
