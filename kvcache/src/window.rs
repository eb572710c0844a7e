//! `Group`: one slot space's pool and the rules its sequences' tables follow in it. The
//! full-attention layers' group keeps every block of a sequence; a windowed group
//! ([`WindowConfig`]) keeps only the blocks a query at the sequence's next position, or later,
//! can still see, and lets the others go back to its pool, where they stay cached under their
//! hash until evicted. A prefix is served from a windowed group's cache only if the blocks
//! its first computed query sees are all still there.
//!
//! ```text
//!  window 6, block 4, committed len 13: the next query (position 13) sees 8..=13
//!  full:    [b0 b1 b2 b3]        positions 0..16
//!  window:  [ -  - w2 w3]        blocks 0 and 1 (positions 0..8) went back to the pool
//! ```

use crate::{BlockHash, BlockId, BlockPool, BlockTable, KvGroup, KvMove, Slot};

/// A second slot space for the layers that attend through a sliding window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowConfig {
    /// Keys a query sees, its own included (the widest window of the model's layers).
    pub window: usize,
    /// Blocks in the windowed layers' pool.
    pub num_blocks: usize,
}

impl WindowConfig {
    /// Blocks a windowed pool needs so that it never runs dry before a full pool would:
    /// every running sequence's window and one partly filled block either side, plus the
    /// rows of one step.
    pub fn blocks_for(
        window: usize,
        block_size: usize,
        max_num_seqs: usize,
        max_num_batched_tokens: usize,
    ) -> usize {
        let bs = block_size.max(1);
        max_num_seqs * (window.div_ceil(bs) + 2) + max_num_batched_tokens.div_ceil(bs)
    }
}

/// One slot space: its pool, its window (none for full attention), its watermark.
#[derive(Debug, Clone)]
pub(crate) struct Group {
    pub(crate) kind: KvGroup,
    pub(crate) pool: BlockPool,
    pub(crate) window: Option<usize>,
    pub(crate) watermark_blocks: usize,
}

impl Group {
    pub(crate) fn new(
        kind: KvGroup,
        num_blocks: usize,
        block_size: usize,
        window: Option<usize>,
        watermark: f64,
    ) -> Self {
        let watermark = watermark.clamp(0.0, 1.0) * num_blocks as f64;
        Self {
            kind,
            pool: BlockPool::new(num_blocks, block_size),
            window,
            watermark_blocks: watermark.ceil() as usize,
        }
    }

    fn bs(&self) -> usize {
        self.pool.block_size()
    }

    /// The first logical block a query at position `len` or later can see.
    pub(crate) fn first_needed(&self, len: usize) -> usize {
        match self.window {
            None => 0,
            Some(w) => (len + 1).saturating_sub(w.max(1)) / self.bs(),
        }
    }

    /// The cached blocks a sequence whose first `hashes.len()` blocks are cached would hold
    /// here, or `None` where one it needs is gone.
    pub(crate) fn hits(&self, hashes: &[BlockHash]) -> Option<Vec<BlockId>> {
        let first = self.first_needed(hashes.len() * self.bs());
        hashes[first.min(hashes.len())..]
            .iter()
            .map(|&h| self.pool.lookup(h))
            .collect()
    }

    /// Whether a sequence taking `hits` (of `k` cached blocks) and growing to `reserve`
    /// positions fits, leaving the watermark free.
    pub(crate) fn can_admit(&self, hits: &[BlockId], k: usize, reserve: usize) -> bool {
        let new_blocks = reserve.max(k * self.bs()).div_ceil(self.bs()) - k;
        let revived = hits.iter().filter(|&&b| self.pool.is_cached(b)).count();
        new_blocks + self.watermark_blocks + revived <= self.pool.num_available()
    }

    /// The table of a sequence taking `hits` (of `k` cached blocks) and growing to `reserve`
    /// positions (checked by [`Group::can_admit`]).
    pub(crate) fn admit(&mut self, hits: &[BlockId], k: usize, reserve: usize) -> BlockTable {
        let new_blocks = reserve.max(k * self.bs()).div_ceil(self.bs()) - k;
        for &block in hits {
            self.pool.take_cached(block);
        }
        let mut blocks = hits.to_vec();
        blocks.extend((0..new_blocks).map(|_| {
            self.pool
                .allocate()
                .expect("invariant: availability checked by can_admit")
        }));
        BlockTable::from_blocks_after(k - hits.len(), blocks)
    }

    /// Blocks `table` (committed to `committed`) must allocate to hold `len` positions with
    /// every block from `committed` on private.
    pub(crate) fn growth_need(&self, table: &BlockTable, committed: usize, len: usize) -> usize {
        let (first, end) = (committed / self.bs(), len.div_ceil(self.bs()));
        let shared = (first..end.min(table.len()))
            .filter_map(|i| table.block(i))
            .filter(|&b| self.pool.ref_count(b) > 1)
            .count();
        shared + end.saturating_sub(table.len())
    }

    /// Grows `table` as [`Group::growth_need`] counted (checked available), appending the
    /// copy-on-write row copies to `moves`.
    pub(crate) fn grow(
        &mut self,
        table: &mut BlockTable,
        committed: usize,
        len: usize,
        moves: &mut Vec<KvMove>,
    ) {
        let bs = self.bs();
        let (first, end) = (committed / bs, len.div_ceil(bs));
        for i in first..end.min(table.len()) {
            let Some(old) = table.block(i) else { continue };
            if self.pool.ref_count(old) > 1 {
                let new = self
                    .pool
                    .allocate()
                    .expect("invariant: availability checked by growth_need");
                let valid = committed.min((i + 1) * bs).saturating_sub(i * bs);
                moves.extend((0..valid).map(|offset| KvMove {
                    from: block_slot(old, bs, offset),
                    to: block_slot(new, bs, offset),
                    group: self.kind,
                }));
                table.replace(i, new);
                self.pool.release(old);
            } else {
                // Sole owner about to overwrite rows: the content no longer matches a hash.
                self.pool.unregister(old);
            }
        }
        for _ in table.len()..end {
            let block = self
                .pool
                .allocate()
                .expect("invariant: availability checked by growth_need");
            table.push(block);
        }
    }

    /// Registers the table's blocks `from..hashes.len()` under `hashes`, then lets go of
    /// what no query from position `len` on can see.
    pub(crate) fn commit(
        &mut self,
        table: &mut BlockTable,
        from: usize,
        hashes: &[BlockHash],
        len: usize,
    ) {
        for (i, &hash) in hashes.iter().enumerate().skip(from) {
            if let Some(block) = table.block(i) {
                // False when another block already holds this content: ours stays private.
                self.pool.register(block, hash);
            }
        }
        for block in table.drop_front(self.first_needed(len)) {
            self.pool.release(block);
        }
    }

    /// Every held block back to the pool, the last first (so a sequence's tail is evicted
    /// from the cache before its head).
    pub(crate) fn release(&mut self, table: &BlockTable) {
        for &block in table.blocks().iter().rev() {
            self.pool.release(block);
        }
    }
}

/// Row `offset` of `block`.
pub(crate) fn block_slot(block: BlockId, block_size: usize, offset: usize) -> Slot {
    Slot(block.0 * block_size as u32 + offset as u32)
}
