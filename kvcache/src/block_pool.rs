//! `BlockPool`: a fixed number of KV blocks with an index-based free list and reference
//! counts. Allocation and release are O(1) and never allocate memory after construction.
//! Invariant: a block is on the free list exactly when its reference count is zero.

use crate::BlockId;

/// Counts reported by [`BlockPool::stats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolStats {
    /// Blocks in the pool.
    pub total: usize,
    /// Blocks with no reference.
    pub free: usize,
    /// Blocks referenced at least once.
    pub in_use: usize,
}

/// Fixed set of blocks; `None` from [`BlockPool::allocate`] means the pool is dry, which is
/// normal control flow for the caller (preempt, wait), never a panic.
#[derive(Debug, Clone)]
pub struct BlockPool {
    block_size: usize,
    ref_counts: Vec<u32>,
    /// Stack of free block indices; the top is handed out next.
    free: Vec<u32>,
}

impl BlockPool {
    /// A pool of `num_blocks` blocks of `block_size` slots each.
    ///
    /// # Panics
    /// If `block_size` is zero or `num_blocks` does not fit in `u32` (configuration errors
    /// caught at start-up, not at run time).
    pub fn new(num_blocks: usize, block_size: usize) -> Self {
        assert!(block_size > 0, "block size must be positive");
        let count = u32::try_from(num_blocks).expect("invariant: block count fits in u32");
        Self {
            block_size,
            ref_counts: vec![0; num_blocks],
            // Reversed so block 0 is allocated first: easier to read in tests and dumps.
            free: (0..count).rev().collect(),
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

    /// Blocks with no reference.
    pub fn num_free(&self) -> usize {
        self.free.len()
    }

    /// Takes a free block with reference count 1, or `None` when the pool is dry.
    pub fn allocate(&mut self) -> Option<BlockId> {
        let index = self.free.pop()?;
        self.ref_counts[index as usize] = 1;
        Some(BlockId(index))
    }

    /// Adds one reference to a block in use (sharing it between sequences).
    ///
    /// # Panics
    /// If the block is free: sharing a free block is a bookkeeping bug that would corrupt KV.
    pub fn retain(&mut self, block: BlockId) {
        let count = &mut self.ref_counts[block.0 as usize];
        assert!(*count > 0, "retain of free block {block:?}");
        *count += 1;
    }

    /// Drops one reference; the block returns to the free list when none are left.
    /// Returns true when the block became free.
    ///
    /// # Panics
    /// On a double free, which would hand the same rows to two sequences.
    pub fn release(&mut self, block: BlockId) -> bool {
        let count = &mut self.ref_counts[block.0 as usize];
        assert!(*count > 0, "double free of block {block:?}");
        *count -= 1;
        if *count == 0 {
            self.free.push(block.0);
            true
        } else {
            false
        }
    }

    /// Current reference count of a block.
    pub fn ref_count(&self, block: BlockId) -> u32 {
        self.ref_counts[block.0 as usize]
    }

    /// Free / in-use counts.
    pub fn stats(&self) -> PoolStats {
        PoolStats {
            total: self.num_blocks(),
            free: self.num_free(),
            in_use: self.num_blocks() - self.num_free(),
        }
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
        assert_eq!(pool.num_free(), 1);
        assert!(pool.release(b));
        assert_eq!(pool.num_free(), 2);
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
            assert_eq!(pool.num_free() + held.len(), 64);
        }
    }
}
