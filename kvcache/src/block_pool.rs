//! `BlockPool`: a fixed number of KV blocks, their reference counts, and the prefix cache's
//! record of which blocks hold which content. Every block is in exactly one state:
//!
//! ```text
//!   free  (ref 0, no hash) --allocate--> in use (ref >= 1) --last release--+--> free
//!     ^                                    ^    register(hash)            | hashed
//!     |                                    |                              v
//!     +-------- evict (pool dry) ------ cached (ref 0, hash kept, LRU) <--+
//!                                          |  take_cached (prefix hit): back to in use
//! ```
//! Allocation takes a free block first and evicts the least recently released cached block
//! only when none is free. Everything is index based: a free stack, an intrusive LRU list and
//! a hash map sized once, so allocate / release / hit are O(1).

use std::collections::HashMap;

use crate::block_hash::Prehashed;
use crate::lru::LruList;
use crate::{BlockHash, BlockId};

/// Counts reported by [`BlockPool::stats`]; `free + in_use + cached == total` always.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolStats {
    /// Blocks in the pool.
    pub total: usize,
    /// Blocks with no reference and no cached content.
    pub free: usize,
    /// Blocks referenced by at least one sequence.
    pub in_use: usize,
    /// Blocks with no reference whose content stays cached until evicted.
    pub cached: usize,
    /// Cached blocks evicted so far to satisfy an allocation.
    pub evictions: u64,
}

/// Fixed set of blocks; `None` from [`BlockPool::allocate`] means the pool is dry, which is
/// normal control flow for the caller (preempt, wait), never a panic.
#[derive(Debug, Clone)]
pub struct BlockPool {
    block_size: usize,
    ref_counts: Vec<u32>,
    hashes: Vec<Option<BlockHash>>,
    /// Stack of free (uncached) block indices; the top is handed out next.
    free: Vec<u32>,
    /// Cached blocks with no reference, least recently released first.
    evictable: LruList,
    /// Every block that holds registered content, in use or evictable.
    by_hash: HashMap<BlockHash, BlockId, Prehashed>,
    evictions: u64,
}

impl BlockPool {
    /// A pool of `num_blocks` blocks of `block_size` slots each.
    ///
    /// # Panics
    /// If `block_size` is zero or `num_blocks` does not fit in `u32` (configuration errors
    /// caught at start-up, not at run time).
    pub fn new(num_blocks: usize, block_size: usize) -> Self {
        assert!(block_size > 0, "block size must be positive");
        let count = u32::try_from(num_blocks)
            .ok()
            .filter(|&c| c < u32::MAX)
            .expect("invariant: block count fits in u32");
        let mut by_hash = HashMap::default();
        by_hash.reserve(num_blocks);
        Self {
            block_size,
            ref_counts: vec![0; num_blocks],
            hashes: vec![None; num_blocks],
            // Reversed so block 0 is allocated first: easier to read in tests and dumps.
            free: (0..count).rev().collect(),
            evictable: LruList::new(num_blocks),
            by_hash,
            evictions: 0,
        }
    }

    /// Slots per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks in the pool.
    pub fn num_blocks(&self) -> usize {
        self.ref_counts.len()
    }

    /// Slots in the pool (`num_blocks * block_size`): the row count the KV store needs.
    pub fn num_slots(&self) -> usize {
        self.num_blocks() * self.block_size
    }

    /// Blocks an allocation can take right now: free ones plus evictable cached ones.
    pub fn num_available(&self) -> usize {
        self.free.len() + self.evictable.len()
    }

    /// Takes a block with reference count 1: a free one, else the least recently released
    /// cached one (its content is forgotten). `None` when every block is in use.
    pub fn allocate(&mut self) -> Option<BlockId> {
        let index = match self.free.pop() {
            Some(index) => index,
            None => {
                let index = self.evictable.pop_front()?;
                if let Some(hash) = self.hashes[index as usize].take() {
                    self.by_hash.remove(&hash);
                }
                self.evictions += 1;
                index
            }
        };
        self.ref_counts[index as usize] = 1;
        Some(BlockId(index))
    }

    /// Adds one reference to a block in use (sharing it between sequences).
    ///
    /// # Panics
    /// If the block is not in use: sharing a free block is a bookkeeping bug that would
    /// corrupt KV.
    pub fn retain(&mut self, block: BlockId) {
        let count = &mut self.ref_counts[block.0 as usize];
        assert!(*count > 0, "retain of unreferenced block {block:?}");
        *count += 1;
    }

    /// Drops one reference. When none are left the block becomes cached if it holds
    /// registered content, free otherwise. Returns true when the block lost its last
    /// reference.
    ///
    /// # Panics
    /// On a double free, which would hand the same rows to two sequences.
    pub fn release(&mut self, block: BlockId) -> bool {
        let count = &mut self.ref_counts[block.0 as usize];
        assert!(*count > 0, "double free of block {block:?}");
        *count -= 1;
        if *count > 0 {
            return false;
        }
        if self.hashes[block.0 as usize].is_some() {
            self.evictable.push_back(block.0);
        } else {
            self.free.push(block.0);
        }
        true
    }

    /// Current reference count of a block.
    pub fn ref_count(&self, block: BlockId) -> u32 {
        self.ref_counts[block.0 as usize]
    }

    /// The content hash a block is registered under, if any.
    pub fn hash_of(&self, block: BlockId) -> Option<BlockHash> {
        self.hashes[block.0 as usize]
    }

    /// The block holding content `hash`, in use or cached, without touching it.
    pub fn lookup(&self, hash: BlockHash) -> Option<BlockId> {
        self.by_hash.get(&hash).copied()
    }

    /// Whether `block` is cached: unreferenced, content kept, evictable.
    pub fn is_cached(&self, block: BlockId) -> bool {
        self.evictable.contains(block.0)
    }

    /// Takes one reference to a block found by [`BlockPool::lookup`]: a cached block leaves
    /// the eviction list with reference count 1, a block in use is shared.
    pub fn take_cached(&mut self, block: BlockId) {
        if self.evictable.unlink(block.0) {
            self.ref_counts[block.0 as usize] = 1;
        } else {
            self.retain(block);
        }
    }

    /// Records that an in-use block now holds the final content `hash`. Returns false and
    /// changes nothing when another block already holds that content (the caller keeps its
    /// block private) or the block already carries a hash.
    ///
    /// # Panics
    /// If the block is not in use.
    pub fn register(&mut self, block: BlockId, hash: BlockHash) -> bool {
        assert!(
            self.ref_count(block) > 0,
            "register of unreferenced block {block:?}"
        );
        let slot = &mut self.hashes[block.0 as usize];
        if slot.is_some() || self.by_hash.contains_key(&hash) {
            return false;
        }
        *slot = Some(hash);
        self.by_hash.insert(hash, block);
        true
    }

    /// Forgets an in-use block's content hash (its rows are about to be overwritten).
    pub fn unregister(&mut self, block: BlockId) {
        if let Some(hash) = self.hashes[block.0 as usize].take() {
            self.by_hash.remove(&hash);
        }
    }

    /// Free / in-use / cached counts.
    pub fn stats(&self) -> PoolStats {
        let free = self.free.len();
        let cached = self.evictable.len();
        PoolStats {
            total: self.num_blocks(),
            free,
            in_use: self.num_blocks() - free - cached,
            cached,
            evictions: self.evictions,
        }
    }

    /// Checks the pool's internal consistency; `Err` names the first violation. O(blocks).
    pub fn check_consistency(&self) -> Result<(), String> {
        let n = self.num_blocks();
        let mut on_free = vec![false; n];
        for &i in &self.free {
            let i = i as usize;
            if on_free[i] {
                return Err(format!("block {i} twice on the free list"));
            }
            on_free[i] = true;
            if self.ref_counts[i] != 0 || self.hashes[i].is_some() {
                return Err(format!("free block {i} is referenced or hashed"));
            }
        }
        for i in self.evictable.iter() {
            let i = i as usize;
            if on_free[i] || self.ref_counts[i] != 0 || self.hashes[i].is_none() {
                return Err(format!("cached block {i} is free, referenced or unhashed"));
            }
        }
        for (i, &free) in on_free.iter().enumerate() {
            let state_count = usize::from(free)
                + usize::from(self.evictable.contains(i as u32))
                + usize::from(self.ref_counts[i] > 0);
            if state_count != 1 {
                return Err(format!("block {i} is in {state_count} states"));
            }
        }
        let hashed = self.hashes.iter().filter(|h| h.is_some()).count();
        if hashed != self.by_hash.len() {
            return Err(format!(
                "{hashed} hashed blocks but {} cache entries",
                self.by_hash.len()
            ));
        }
        for (hash, block) in &self.by_hash {
            if self.hashes[block.0 as usize] != Some(*hash) {
                return Err(format!("cache entry for {block:?} has a stale hash"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocates_every_block_once_then_runs_dry() {
        let mut pool = BlockPool::new(4, 16);
        let mut seen: Vec<BlockId> = (0..4).map(|_| pool.allocate().unwrap()).collect();
        assert_eq!(pool.allocate(), None);
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), 4);
        assert_eq!(pool.stats().in_use, 4);
    }

    #[test]
    fn shared_block_frees_on_last_release() {
        let mut pool = BlockPool::new(2, 4);
        let b = pool.allocate().unwrap();
        pool.retain(b);
        assert!(!pool.release(b));
        assert_eq!(pool.num_available(), 1);
        assert!(pool.release(b));
        assert_eq!(pool.num_available(), 2);
    }

    #[test]
    #[should_panic(expected = "double free")]
    fn double_free_is_caught() {
        let mut pool = BlockPool::new(1, 4);
        let b = pool.allocate().unwrap();
        pool.release(b);
        pool.release(b);
    }

    #[test]
    fn cached_blocks_are_evicted_oldest_first_and_only_when_dry() {
        let mut pool = BlockPool::new(3, 4);
        let (a, b) = (pool.allocate().unwrap(), pool.allocate().unwrap());
        let (ha, hb) = (BlockHash(1), BlockHash(2));
        assert!(pool.register(a, ha));
        assert!(pool.register(b, hb));
        assert!(!pool.register(a, BlockHash(3)), "already hashed");
        pool.release(b);
        pool.release(a);
        assert_eq!(pool.stats().cached, 2);
        // The free block goes first; content survives.
        let c = pool.allocate().unwrap();
        assert_eq!(pool.lookup(hb), Some(b));
        // Then b, released first, is evicted before a.
        assert_eq!(pool.allocate(), Some(b));
        assert_eq!(pool.lookup(hb), None);
        assert_eq!(pool.lookup(ha), Some(a));
        pool.take_cached(a);
        assert_eq!(pool.ref_count(a), 1);
        assert_eq!(pool.allocate(), None);
        assert_eq!(pool.stats().evictions, 1);
        for block in [a, b, c] {
            pool.release(block);
        }
        pool.check_consistency().unwrap();
        assert_eq!(pool.stats().cached, 1);
    }

    #[test]
    fn duplicate_content_is_not_registered_twice() {
        let mut pool = BlockPool::new(2, 4);
        let (a, b) = (pool.allocate().unwrap(), pool.allocate().unwrap());
        assert!(pool.register(a, BlockHash(7)));
        assert!(!pool.register(b, BlockHash(7)));
        pool.release(b);
        assert_eq!(pool.stats().free, 1);
        pool.check_consistency().unwrap();
    }

    #[test]
    fn random_alloc_release_never_leaks() {
        // Seeded xorshift so the test needs no dependency and is reproducible.
        let mut state = 0x9e3779b97f4a7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut pool = BlockPool::new(64, 8);
        let mut held: Vec<BlockId> = Vec::new();
        for _ in 0..100_000 {
            if next() % 2 == 0 {
                if let Some(b) = pool.allocate() {
                    assert_eq!(pool.ref_count(b), 1);
                    held.push(b);
                } else {
                    assert_eq!(held.len(), 64);
                }
            } else if !held.is_empty() {
                let i = (next() as usize) % held.len();
                pool.release(held.swap_remove(i));
            }
            assert_eq!(pool.num_available() + held.len(), 64);
        }
    }
}
