//! Token Recycling's rows in context: the top-k the model gave after the last two or three
//! tokens fed, where the matrix (`recycling`) keys its rows by the last token alone. On
//! SmolLM2's own chat answers, the first candidate of a row keyed by the last three tokens is
//! the next token 63% of the time, against 30% for a row keyed by one
//! (`benches/recycling_orders.py`; HISTORY.md).
//!
//! One direct-mapped table of [`CONTEXT_SLOTS`] rows holds both orders: a context's 64-bit
//! hash (its length mixed in, never zero) picks the slot and is kept beside the row, and the
//! last context written to a slot owns it, as the matrix's last write wins. A lookup checks
//! the stored hash, so a slot another context took reads as unknown; two contexts with one
//! 64-bit hash would share a row, which costs at most an acceptance. Cells are relaxed
//! atomics, as the matrix's are: drafters hold the table while the engine thread, its only
//! writer and reader, updates it. Kept in memory only (a restarted server relearns it).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Rows of the table (each `8 + 4 * k` bytes: 2.5 MB at k = 8).
pub const CONTEXT_SLOTS: usize = 1 << 16;

/// The longest context a row is keyed by, in tokens (the fed token included).
pub const LONGEST_CONTEXT: usize = 3;

/// Rows keyed by the last two or three tokens fed.
#[derive(Debug)]
pub struct ContextRows {
    k: usize,
    /// Per slot, the hash of the context whose row it holds (0: none yet).
    keys: Vec<AtomicU64>,
    /// `CONTEXT_SLOTS * k` candidates, best first.
    cells: Vec<AtomicU32>,
}

impl ContextRows {
    /// An empty table of rows of `k` candidates.
    pub fn new(k: usize) -> Self {
        Self {
            k,
            keys: (0..CONTEXT_SLOTS).map(|_| AtomicU64::new(0)).collect(),
            cells: (0..CONTEXT_SLOTS * k).map(|_| AtomicU32::new(0)).collect(),
        }
    }

    /// Bytes of the table.
    pub fn bytes(&self) -> usize {
        self.keys.len() * 8 + self.cells.len() * 4
    }

    /// Keeps `top` (best first, `k` of them) as the row after `context` (oldest token first,
    /// the fed one last; two or three tokens).
    pub fn store(&self, context: &[u32], top: &[u32]) {
        if top.len() != self.k || !(2..=LONGEST_CONTEXT).contains(&context.len()) {
            return;
        }
        let key = hash(context);
        let slot = slot_of(key);
        for (cell, &id) in self.cells[slot * self.k..(slot + 1) * self.k]
            .iter()
            .zip(top)
        {
            cell.store(id, Ordering::Relaxed);
        }
        // The key marks the row as written, so it is written last.
        self.keys[slot].store(key, Ordering::Relaxed);
    }

    /// The `rank`-th candidate after `context` (oldest token first), or `None` where no row
    /// after it is kept.
    pub fn candidate(&self, context: &[u32], rank: usize) -> Option<u32> {
        if rank >= self.k || !(2..=LONGEST_CONTEXT).contains(&context.len()) {
            return None;
        }
        let key = hash(context);
        let slot = slot_of(key);
        (self.keys[slot].load(Ordering::Relaxed) == key)
            .then(|| self.cells[slot * self.k + rank].load(Ordering::Relaxed))
    }
}

/// A context's hash: never zero (zero marks an empty slot), its length mixed in.
fn hash(context: &[u32]) -> u64 {
    const MULTIPLIER: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut h = context.len() as u64;
    for &token in context {
        h = (h.rotate_left(29) ^ u64::from(token)).wrapping_mul(MULTIPLIER);
    }
    // A final mix so that the high bits, which pick the slot, depend on every token.
    h ^= h >> 31;
    h = h.wrapping_mul(MULTIPLIER);
    h ^= h >> 29;
    h.max(1)
}

/// The slot a hash picks: its high bits.
fn slot_of(key: u64) -> usize {
    (key >> (64 - CONTEXT_SLOTS.trailing_zeros())) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_is_found_by_its_whole_context_only() {
        let rows = ContextRows::new(2);
        rows.store(&[5, 6, 7], &[8, 9]);
        rows.store(&[6, 7], &[3, 4]);
        assert_eq!(rows.candidate(&[5, 6, 7], 0), Some(8));
        assert_eq!(rows.candidate(&[5, 6, 7], 1), Some(9));
        assert_eq!(rows.candidate(&[6, 7], 0), Some(3));
        // Another token before, the tokens in another order, a rank past k, one token.
        assert_eq!(rows.candidate(&[4, 6, 7], 0), None);
        assert_eq!(rows.candidate(&[7, 6], 0), None);
        assert_eq!(rows.candidate(&[5, 6, 7], 2), None);
        assert_eq!(rows.candidate(&[7], 0), None);
        // The last write wins.
        rows.store(&[5, 6, 7], &[1, 2]);
        assert_eq!(rows.candidate(&[5, 6, 7], 0), Some(1));
        // Rows of the wrong width and contexts of the wrong length are not kept.
        rows.store(&[1, 2], &[1, 2, 3]);
        rows.store(&[1, 2, 3, 4], &[1, 2]);
        assert_eq!(rows.candidate(&[1, 2], 0), None);
        assert_eq!(rows.candidate(&[2, 3, 4], 0), None);
    }

    #[test]
    fn contexts_spread_over_the_slots() {
        // Consecutive token ids, as a vocabulary's neighbours: slots taken by 2,000 contexts
        // of each length stay close to what uniform hashing gives (about 1,970 of 2,000).
        for len in 2..=LONGEST_CONTEXT {
            let slots: std::collections::HashSet<usize> = (0..2_000u32)
                .map(|t| {
                    let context: Vec<u32> = (0..len as u32).map(|i| t + i).collect();
                    slot_of(hash(&context))
                })
                .collect();
            assert!(slots.len() > 1_900, "{len}: {}", slots.len());
        }
        assert_ne!(hash(&[1, 2]), hash(&[0, 1, 2]));
    }
}
