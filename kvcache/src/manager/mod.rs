//! `BlockManager`: every sequence's block tables over the pools of its slot spaces (one, or
//! two for a model with sliding-window layers: `crate::window`), with copy-on-write sharing
//! and the prefix cache. A sequence's positions `0..len` hold final KV (committed); a table
//! may reach further (room reserved for the next write). Writes only ever go to positions
//! `>= len`, so the only blocks that can need a private copy are those overlapping
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
//! (none without a salt), in every slot space. Admission walks a new prompt's hash chain under
//! its scope and shares the longest prefix every space still holds what it needs of; released
//! blocks keep their hash (cached) until their pool runs dry. Every change checks all spaces
//! first and then changes them all, or none.

use std::collections::{HashMap, HashSet};

use crate::window::Group;
use crate::{
    plan_compaction, BlockHash, BlockPool, BlockTable, KvError, KvGroup, KvMove, PoolStats, SeqId,
    Slot, WindowConfig,
};

/// How a [`BlockManager`] is set up.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ManagerConfig {
    /// Blocks in the (full-attention layers') pool.
    pub num_blocks: usize,
    /// Positions per block.
    pub block_size: usize,
    /// Register committed blocks and reuse them for new prompts.
    pub prefix_caching: bool,
    /// Fraction of each pool that admission leaves free for running sequences to grow into.
    pub watermark: f64,
    /// The windowed layers' own slot space, for a model that has such layers.
    pub window: Option<WindowConfig>,
}

impl Default for ManagerConfig {
    fn default() -> Self {
        Self {
            num_blocks: 1024,
            block_size: 16,
            prefix_caching: true,
            watermark: 0.01,
            window: None,
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
    /// The windowed layers' pool, where there is one.
    pub window: Option<PoolStats>,
}

#[derive(Debug, Clone, Default)]
struct SeqBlocks {
    /// One table per slot space, in the manager's group order.
    tables: Vec<BlockTable>,
    /// Hash chain of the committed full blocks, `hashes[i]` for logical block `i`.
    hashes: Vec<BlockHash>,
    /// The parent of the first block's hash: the sequence's cache-salt scope, if any.
    scope: Option<BlockHash>,
    /// Positions holding final KV.
    len: usize,
}

/// Block tables of every live sequence over the shared pools.
#[derive(Debug, Clone)]
pub struct BlockManager {
    /// The full-attention space first, then the windowed one where configured.
    groups: Vec<Group>,
    seqs: HashMap<SeqId, SeqBlocks>,
    prefix_caching: bool,
    prefix_query_tokens: u64,
    prefix_hit_tokens: u64,
    /// The block boundaries a cached prefix may end at, where not every one may (a model
    /// with recurrent layers resumes only where their state was kept): the hash of the
    /// block ending there. `None`: any boundary.
    resume_points: Option<HashSet<BlockHash>>,
}

impl BlockManager {
    /// An empty manager.
    ///
    /// # Panics
    /// On a zero block size (a start-up configuration error).
    pub fn new(config: ManagerConfig) -> Self {
        let bs = config.block_size;
        let mut groups = vec![Group::new(
            KvGroup::Full,
            config.num_blocks,
            bs,
            None,
            config.watermark,
        )];
        if let Some(w) = config.window {
            groups.push(Group::new(
                KvGroup::Window,
                w.num_blocks,
                bs,
                Some(w.window),
                config.watermark,
            ));
        }
        Self {
            groups,
            seqs: HashMap::new(),
            prefix_caching: config.prefix_caching,
            prefix_query_tokens: 0,
            prefix_hit_tokens: 0,
            resume_points: None,
        }
    }

    /// Positions per block.
    pub fn block_size(&self) -> usize {
        self.groups[0].pool.block_size()
    }

    /// Rows the full-attention layers' KV store needs (`num_blocks * block_size`).
    pub fn num_slots(&self) -> usize {
        self.groups[0].pool.num_slots()
    }

    /// Rows the windowed layers' KV store needs, where they have their own space.
    pub fn num_window_slots(&self) -> Option<usize> {
        self.window_group().map(|g| g.pool.num_slots())
    }

    /// The window the windowed space keeps, where there is one.
    pub fn window(&self) -> Option<usize> {
        self.window_group().and_then(|g| g.window)
    }

    fn window_group(&self) -> Option<&Group> {
        self.groups.iter().find(|g| g.kind == KvGroup::Window)
    }

    /// Whether committed blocks are cached and reused.
    pub fn prefix_caching(&self) -> bool {
        self.prefix_caching
    }

    /// The full-attention pool (read-only: every change goes through the manager).
    pub fn pool(&self) -> &BlockPool {
        &self.groups[0].pool
    }

    /// Whether `seq` holds blocks here.
    pub fn contains(&self, seq: SeqId) -> bool {
        self.seqs.contains_key(&seq)
    }

    /// The block table of `seq` in the full-attention space.
    pub fn block_table(&self, seq: SeqId) -> Option<&BlockTable> {
        self.seqs.get(&seq).map(|s| &s.tables[0])
    }

    /// The block table of `seq` in the windowed space, where there is one.
    pub fn window_table(&self, seq: SeqId) -> Option<&BlockTable> {
        self.seqs.get(&seq).and_then(|s| s.tables.get(1))
    }

    /// Blocks `seq` holds in each space (full first).
    pub fn held_blocks(&self, seq: SeqId) -> Option<Vec<usize>> {
        let entry = self.seqs.get(&seq)?;
        Some(entry.tables.iter().map(|t| t.blocks().len()).collect())
    }

    /// Positions of `seq` holding final KV.
    pub fn seq_len(&self, seq: SeqId) -> Option<usize> {
        self.seqs.get(&seq).map(|s| s.len)
    }

    /// Slot of `position` in `seq`'s full-attention table.
    pub fn slot(&self, seq: SeqId, position: usize) -> Option<Slot> {
        self.block_table(seq)?.slot(position, self.block_size())
    }

    /// Whether a new sequence needing `num_tokens` positions could be admitted now, leaving
    /// the watermark free (prefix-cache hits, which only lower the need, are not counted).
    pub fn can_allocate(&self, num_tokens: usize) -> bool {
        self.groups.iter().all(|g| {
            num_tokens.div_ceil(self.block_size()) + g.watermark_blocks <= g.pool.num_available()
        })
    }

    /// From now on a cached prefix ends only at a boundary marked with
    /// [`BlockManager::add_resume_point`] (none yet).
    pub fn restrict_resume_points(&mut self) {
        self.resume_points.get_or_insert_with(HashSet::new);
    }

    /// A cached prefix may end after the block `hash` (where they are restricted).
    pub fn add_resume_point(&mut self, hash: BlockHash) {
        if let Some(points) = &mut self.resume_points {
            points.insert(hash);
        }
    }

    /// A cached prefix may no longer end after the block `hash` (where they are restricted).
    pub fn remove_resume_point(&mut self, hash: BlockHash) {
        if let Some(points) = &mut self.resume_points {
            points.remove(&hash);
        }
    }

    /// Tokens of `tokens` whose KV is cached right now under `scope` (a cache salt's,
    /// [`BlockHash::scope`]; `None` for none), in whole blocks, in every space as far as the
    /// first query after them needs. At least one token is always left to compute, since
    /// its logits are needed.
    pub fn cached_prefix_len(&self, tokens: &[u32], scope: Option<BlockHash>) -> usize {
        self.prefix_hits(tokens, scope).0.len() * self.block_size()
    }

    /// The hashes of the longest cached prefix, and each space's blocks of it.
    fn prefix_hits(
        &self,
        tokens: &[u32],
        scope: Option<BlockHash>,
    ) -> (Vec<BlockHash>, Vec<Vec<crate::BlockId>>) {
        if !self.prefix_caching {
            return (Vec::new(), vec![Vec::new(); self.groups.len()]);
        }
        let bs = self.block_size();
        let max_blocks = tokens.len().saturating_sub(1) / bs;
        let mut hashes = Vec::new();
        let mut parent = scope;
        for block_tokens in tokens.chunks_exact(bs).take(max_blocks) {
            let hash = BlockHash::new(parent, block_tokens);
            if self.groups[0].pool.lookup(hash).is_none() {
                break;
            }
            hashes.push(hash);
            parent = Some(hash);
        }
        // Where resuming needs more than the blocks: at a boundary that can be resumed.
        if let Some(points) = &self.resume_points {
            while hashes.last().is_some_and(|h| !points.contains(h)) {
                hashes.pop();
            }
        }
        // The longest prefix every space can serve (a window may have let its blocks go).
        loop {
            let hits: Option<Vec<_>> = self.groups.iter().map(|g| g.hits(&hashes)).collect();
            match hits {
                Some(hits) => return (hashes, hits),
                None => {
                    hashes.pop();
                }
            }
        }
    }

    /// Admits `seq` with prompt `tokens` under `scope` (its cache salt's, `None` for none):
    /// shares the longest prefix cached under the same scope, then reserves room for
    /// `reserve` positions in all. Returns the number of prompt tokens whose KV is already
    /// there (the sequence's committed length), or `None`, with nothing changed, when a pool
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
        let (hashes, hits) = self.prefix_hits(tokens, scope);
        let k = hashes.len();
        if !self
            .groups
            .iter()
            .zip(&hits)
            .all(|(g, h)| g.can_admit(h, k, reserve))
        {
            return Ok(None);
        }
        let tables = self
            .groups
            .iter_mut()
            .zip(&hits)
            .map(|(g, h)| g.admit(h, k, reserve))
            .collect();
        let hit_tokens = k * self.block_size();
        self.seqs.insert(
            seq,
            SeqBlocks {
                tables,
                hashes,
                scope,
                len: hit_tokens,
            },
        );
        if self.prefix_caching {
            self.prefix_query_tokens += tokens.len() as u64;
            self.prefix_hit_tokens += hit_tokens as u64;
        }
        Ok(Some(hit_tokens))
    }

    /// Makes `seq`'s tables hold `len` positions and makes every block that positions
    /// `seq_len..len` fall in private to `seq`. Returns the row copies of the copy-on-write
    /// (to run before the write), or `None`, with nothing changed, when a pool is too dry.
    pub fn ensure_capacity(
        &mut self,
        seq: SeqId,
        len: usize,
    ) -> Result<Option<Vec<KvMove>>, KvError> {
        let entry = self.seqs.get_mut(&seq).ok_or(KvError::UnknownSeq(seq))?;
        if len <= entry.len {
            return Ok(Some(Vec::new()));
        }
        let fits = self
            .groups
            .iter()
            .zip(&entry.tables)
            .all(|(g, t)| g.growth_need(t, entry.len, len) <= g.pool.num_available());
        if !fits {
            return Ok(None);
        }
        let mut moves = Vec::new();
        for (g, t) in self.groups.iter_mut().zip(&mut entry.tables) {
            g.grow(t, entry.len, len, &mut moves);
        }
        Ok(Some(moves))
    }

    /// Declares positions `0..tokens.len()` of `seq` final, holding `tokens`. Newly full
    /// blocks are registered in the prefix cache; a windowed space lets go of the blocks no
    /// later query can see. Only ever grows the committed length; use
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
        if entry.tables.iter().any(|t| len > t.capacity(bs)) {
            return Err(KvError::InvalidLength {
                seq,
                len,
                reason: "commit past the table's capacity",
            });
        }
        entry.len = len;
        let from = entry.hashes.len();
        if self.prefix_caching {
            for i in from..len / bs {
                let parent = entry.hashes.last().copied().or(entry.scope);
                entry
                    .hashes
                    .push(BlockHash::new(parent, &tokens[i * bs..(i + 1) * bs]));
            }
        }
        for (g, t) in self.groups.iter_mut().zip(&mut entry.tables) {
            g.commit(t, from, &entry.hashes, len);
        }
        Ok(())
    }

    /// Cuts `seq` to `len` positions: the committed length drops to at most `len` and every
    /// whole block past it returns to its pool. Returns how many full-space blocks were
    /// released. Errors, with nothing changed, when a window has already let go of a block
    /// the query after the cut would see.
    pub fn truncate(&mut self, seq: SeqId, len: usize) -> Result<usize, KvError> {
        let bs = self.block_size();
        let entry = self.seqs.get_mut(&seq).ok_or(KvError::UnknownSeq(seq))?;
        let keep = len.div_ceil(bs);
        let next = entry.len.min(len);
        let behind = |(g, t): (&Group, &BlockTable)| t.skipped() > g.first_needed(next);
        if self.groups.iter().zip(&entry.tables).any(behind) {
            return Err(KvError::InvalidLength {
                seq,
                len,
                reason: "truncate behind the window's held blocks",
            });
        }
        let mut released = 0;
        for (i, (g, t)) in self.groups.iter_mut().zip(&mut entry.tables).enumerate() {
            let dropped = t.split_off(keep);
            for &block in dropped.iter().rev() {
                g.pool.release(block);
            }
            if i == 0 {
                released = dropped.len();
            }
        }
        entry.len = entry.len.min(len);
        entry.hashes.truncate(entry.len / bs);
        Ok(released)
    }

    /// Registers `child` as a copy of `parent`'s committed positions, sharing every block
    /// (no KV is copied now; the shared partial block is copied when either side writes).
    pub fn fork(&mut self, parent: SeqId, child: SeqId) -> Result<(), KvError> {
        if self.seqs.contains_key(&child) {
            return Err(KvError::DuplicateSeq(child));
        }
        let bs = self.block_size();
        let source = self.seqs.get(&parent).ok_or(KvError::UnknownSeq(parent))?;
        let end = source.len.div_ceil(bs);
        let tables: Vec<BlockTable> = source
            .tables
            .iter()
            .map(|t| {
                let held = end.saturating_sub(t.skipped()).min(t.blocks().len());
                BlockTable::from_blocks_after(t.skipped(), t.blocks()[..held].to_vec())
            })
            .collect();
        for (g, t) in self.groups.iter_mut().zip(&tables) {
            for &block in t.blocks() {
                g.pool.retain(block);
            }
        }
        let entry = SeqBlocks {
            tables,
            hashes: source.hashes.clone(),
            scope: source.scope,
            len: source.len,
        };
        self.seqs.insert(child, entry);
        Ok(())
    }

    /// Releases every block of `seq` (last block first, so a sequence's tail is evicted from
    /// the cache before its head) and forgets the sequence.
    pub fn release(&mut self, seq: SeqId) -> Result<(), KvError> {
        let entry = self.seqs.remove(&seq).ok_or(KvError::UnknownSeq(seq))?;
        for (g, t) in self.groups.iter_mut().zip(&entry.tables) {
            g.release(t);
        }
        Ok(())
    }

    /// Row moves that compact `seq`'s accepted tree path (see [`plan_compaction`]), in
    /// every space.
    pub fn plan_compaction(
        &self,
        seq: SeqId,
        num_computed: usize,
        accepted: &[usize],
    ) -> Result<Vec<KvMove>, KvError> {
        let entry = self.seqs.get(&seq).ok_or(KvError::UnknownSeq(seq))?;
        let mut moves = Vec::new();
        for (g, t) in self.groups.iter().zip(&entry.tables) {
            let planned = plan_compaction(t, self.block_size(), num_computed, accepted)?;
            moves.extend(planned.into_iter().map(|m| KvMove { group: g.kind, ..m }));
        }
        Ok(moves)
    }

    /// Block counts and prefix-cache counters.
    pub fn stats(&self) -> CacheStats {
        let PoolStats {
            total,
            free,
            in_use,
            cached,
            evictions,
        } = self.groups[0].pool.stats();
        CacheStats {
            total,
            free,
            in_use,
            cached,
            evictions,
            prefix_query_tokens: self.prefix_query_tokens,
            prefix_hit_tokens: self.prefix_hit_tokens,
            num_seqs: self.seqs.len(),
            window: self.window_group().map(|g| g.pool.stats()),
        }
    }

    /// Checks every invariant; `Err` names the first violation. O(blocks + table entries):
    /// for tests and debugging, not the hot path.
    pub fn check_invariants(&self) -> Result<(), String> {
        let bs = self.block_size();
        for (gi, g) in self.groups.iter().enumerate() {
            g.pool.check_consistency()?;
            let mut holders = vec![0u32; g.pool.num_blocks()];
            for (seq, entry) in &self.seqs {
                let table = &entry.tables[gi];
                for &block in table.blocks() {
                    holders[block.0 as usize] += 1;
                }
                if entry.len > table.capacity(bs) {
                    return Err(format!("{seq:?} committed {} past its table", entry.len));
                }
                if table.skipped() > g.first_needed(entry.len) {
                    return Err(format!(
                        "{seq:?} let go of a block a query at {} still sees",
                        entry.len
                    ));
                }
            }
            for (i, &count) in holders.iter().enumerate() {
                let refs = g.pool.ref_count(crate::BlockId(i as u32));
                if refs != count {
                    return Err(format!(
                        "{:?} block {i}: ref count {refs}, held by {count}",
                        g.kind
                    ));
                }
            }
            let stats = g.pool.stats();
            if stats.free + stats.in_use + stats.cached != stats.total {
                return Err(format!("counts do not add up: {stats:?}"));
            }
        }
        for (seq, entry) in &self.seqs {
            if entry.hashes.len() > entry.len / bs {
                return Err(format!("{seq:?} hashes a block that is not full"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
