//! `BlockTable`: one sequence's logical-block -> `BlockId` map and the position -> slot rule
//! (`slot(p) = table[p / B] * B + p % B`, see the crate diagram). Growing and shrinking go
//! through a [`BlockPool`] so every block a table holds is counted exactly once.

use crate::{BlockId, BlockPool, Slot};

/// The blocks backing one sequence's positions, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BlockTable {
    blocks: Vec<BlockId>,
}

impl BlockTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// A table over the given blocks (already owned by the caller).
    pub fn from_blocks(blocks: Vec<BlockId>) -> Self {
        Self { blocks }
    }

    /// The blocks, logical order.
    pub fn blocks(&self) -> &[BlockId] {
        &self.blocks
    }

    /// Number of blocks.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Whether the table holds no block.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Appends a block the caller already holds a reference to.
    pub fn push(&mut self, block: BlockId) {
        self.blocks.push(block);
    }

    /// Replaces logical block `index` (copy-on-write) and returns the old one.
    ///
    /// # Panics
    /// If `index` is past the end.
    pub fn replace(&mut self, index: usize, block: BlockId) -> BlockId {
        std::mem::replace(&mut self.blocks[index], block)
    }

    /// Removes and returns every block from logical index `keep` on.
    pub fn split_off(&mut self, keep: usize) -> Vec<BlockId> {
        if keep >= self.blocks.len() {
            return Vec::new();
        }
        self.blocks.split_off(keep)
    }

    /// Positions the table can hold.
    pub fn capacity(&self, block_size: usize) -> usize {
        self.blocks.len() * block_size
    }

    /// Slot of `position`, or `None` past the table's capacity.
    pub fn slot(&self, position: usize, block_size: usize) -> Option<Slot> {
        let block = self.blocks.get(position / block_size)?;
        let slot = block.0 as usize * block_size + position % block_size;
        Some(Slot(u32::try_from(slot).ok()?))
    }

    /// Grows the table until it holds `len` positions. Returns false, with the table
    /// unchanged, when the pool has too few free blocks.
    pub fn ensure_capacity(&mut self, len: usize, pool: &mut BlockPool) -> bool {
        let needed = len
            .div_ceil(pool.block_size())
            .saturating_sub(self.blocks.len());
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
