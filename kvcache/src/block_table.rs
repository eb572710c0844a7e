//! `BlockTable`: one sequence's logical-block -> `BlockId` map and the position -> slot rule
//! (`slot(p) = table[p / B] * B + p % B`, see the crate diagram). Growing and shrinking go
//! through a [`BlockPool`] so every block a table holds is counted exactly once. A windowed
//! layer group's table may have let go of its first blocks (`skipped`: positions no query can
//! see again); logical block indices still count from position 0.

use crate::{BlockId, BlockPool, Slot};

/// The blocks backing one sequence's positions, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BlockTable {
    /// Logical blocks before `blocks[0]` that are no longer held.
    skipped: usize,
    blocks: Vec<BlockId>,
}

impl BlockTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// A table over the given blocks (already owned by the caller).
    pub fn from_blocks(blocks: Vec<BlockId>) -> Self {
        Self { skipped: 0, blocks }
    }

    /// A table whose first `skipped` logical blocks are not held, then `blocks`.
    pub fn from_blocks_after(skipped: usize, blocks: Vec<BlockId>) -> Self {
        Self { skipped, blocks }
    }

    /// The held blocks, logical order, from logical block [`BlockTable::skipped`] on.
    pub fn blocks(&self) -> &[BlockId] {
        &self.blocks
    }

    /// Logical blocks before the first held one (0 unless a window let them go).
    pub fn skipped(&self) -> usize {
        self.skipped
    }

    /// Logical block `index`, where it is held.
    pub fn block(&self, index: usize) -> Option<BlockId> {
        index
            .checked_sub(self.skipped)
            .and_then(|i| self.blocks.get(i).copied())
    }

    /// Number of logical blocks (held or skipped).
    pub fn len(&self) -> usize {
        self.skipped + self.blocks.len()
    }

    /// Whether the table covers no position.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends a block the caller already holds a reference to.
    pub fn push(&mut self, block: BlockId) {
        self.blocks.push(block);
    }

    /// Replaces held logical block `index` (copy-on-write) and returns the old one.
    ///
    /// # Panics
    /// If `index` is past the end or not held.
    pub fn replace(&mut self, index: usize, block: BlockId) -> BlockId {
        std::mem::replace(&mut self.blocks[index - self.skipped], block)
    }

    /// Removes and returns every held block from logical index `keep` on.
    pub fn split_off(&mut self, keep: usize) -> Vec<BlockId> {
        let keep = keep.saturating_sub(self.skipped);
        if keep >= self.blocks.len() {
            return Vec::new();
        }
        self.blocks.split_off(keep)
    }

    /// Lets go of every held block before logical index `first` and returns them, first
    /// block first (the table then starts at `first`, or stays where it was if further on).
    pub fn drop_front(&mut self, first: usize) -> Vec<BlockId> {
        let n = first.saturating_sub(self.skipped).min(self.blocks.len());
        self.skipped += n;
        self.blocks.drain(..n).collect()
    }

    /// Positions the table can hold (skipped ones included).
    pub fn capacity(&self, block_size: usize) -> usize {
        self.len() * block_size
    }

    /// Slot of `position`, or `None` past the table's capacity or before its first held
    /// block.
    pub fn slot(&self, position: usize, block_size: usize) -> Option<Slot> {
        let block = self.block(position / block_size)?;
        let slot = block.0 as usize * block_size + position % block_size;
        Some(Slot(u32::try_from(slot).ok()?))
    }

    /// Grows the table until it holds `len` positions. Returns false, with the table
    /// unchanged, when the pool has too few free blocks.
    pub fn ensure_capacity(&mut self, len: usize, pool: &mut BlockPool) -> bool {
        let needed = len.div_ceil(pool.block_size()).saturating_sub(self.len());
        if needed > pool.num_available() {
            return false;
        }
        for _ in 0..needed {
            let block = pool
                .allocate()
                .expect("invariant: free count was checked above");
            self.blocks.push(block);
        }
        true
    }

    /// Releases every block back to the pool and empties the table.
    pub fn release(&mut self, pool: &mut BlockPool) {
        for block in self.blocks.drain(..) {
            pool.release(block);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_follows_the_diagram() {
        let table = BlockTable::from_blocks(vec![BlockId(7), BlockId(2), BlockId(5)]);
        assert_eq!(table.slot(0, 4), Some(Slot(28)));
        assert_eq!(table.slot(5, 4), Some(Slot(9)));
        assert_eq!(table.slot(9, 4), Some(Slot(21)));
        assert_eq!(table.slot(12, 4), None);
    }

    #[test]
    fn a_dropped_front_keeps_logical_positions() {
        let mut table = BlockTable::from_blocks(vec![BlockId(7), BlockId(2), BlockId(5)]);
        assert_eq!(table.drop_front(2), vec![BlockId(7), BlockId(2)]);
        assert_eq!(
            (table.skipped(), table.len(), table.capacity(4)),
            (2, 3, 12)
        );
        assert_eq!(table.slot(7, 4), None);
        assert_eq!(table.slot(9, 4), Some(Slot(21)));
        assert_eq!(table.block(2), Some(BlockId(5)));
        // Dropping what is already gone changes nothing; split_off counts logically.
        assert!(table.drop_front(1).is_empty());
        assert_eq!(table.split_off(1), vec![BlockId(5)]);
        assert_eq!(table.len(), 2);
    }

    #[test]
    fn ensure_capacity_is_all_or_nothing() {
        let mut pool = BlockPool::new(3, 4);
        let mut a = BlockTable::new();
        assert!(a.ensure_capacity(9, &mut pool));
        assert_eq!(a.blocks().len(), 3);
        let mut b = BlockTable::new();
        assert!(!b.ensure_capacity(1, &mut pool));
        assert!(b.blocks().is_empty());
        a.release(&mut pool);
        assert_eq!(pool.num_available(), 3);
        assert!(b.ensure_capacity(4, &mut pool));
        assert_eq!(b.blocks().len(), 1);
    }
}
