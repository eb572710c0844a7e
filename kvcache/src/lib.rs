//! Paged KV block management for thicket: which fixed-size block of the KV store each
//! sequence position lives in, which blocks are shared (copy-on-write, prefix cache) and
//! which are free. This crate knows positions, blocks and slots only; token ids pass through
//! it only to be hashed for the prefix cache, and it never sees a tensor, so the engine's
//! storage layout (`slot * row_width`) is the only contract between the two.
//!
//! ```text
//!  position p of a sequence          block table            KV store (slots)
//!  p = 0 1 2 3 | 4 5 6 7 | 8 9       [ 7, 2, 5 ]            block b holds slots
//!      block 0 | block 1 | block 2     |  |  |              b*B .. b*B + B - 1
//!      ---------------------------     v  v  v
//!  slot(p) = table[p / B] * B + p % B   (B = block size; slot(9) = 5*4 + 1 = 21)
//! ```
//!
//! Two sequences may hold the same block (a fork for `n > 1`, or a prefix-cache hit); such a
//! block is only ever read. Before a sequence writes into a shared block, the manager gives
//! it a private copy and returns the row copies ([`KvMove`]) for the backend to execute.
//!
//! A model whose layers attend through a sliding window keeps those layers' KV in a second
//! slot space with its own pool ([`WindowConfig`]): each sequence's table there holds only
//! the blocks its next queries can still see, and the blocks behind the window go back to
//! that pool (cached, for the prefix cache) as the sequence grows. A move names the slot
//! space it copies in ([`KvGroup`]).

#![deny(missing_docs)]

mod block_hash;
mod block_pool;
mod block_table;
mod compaction;
mod error;
mod lru;
mod manager;
mod window;

pub use block_hash::BlockHash;
pub use block_pool::{BlockPool, PoolStats};
pub use block_table::BlockTable;
pub use compaction::plan_compaction;
pub use error::KvError;
pub use manager::{BlockManager, CacheStats, ManagerConfig};
pub use window::WindowConfig;

/// Identity of one sequence for its whole life in the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub u64);

/// Index of one fixed-size block in the KV store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockId(pub u32);

/// Index of one token row in the KV store: `block * block_size + offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Slot(pub u32);

impl Slot {
    /// The slot as a row index into the KV store.
    #[inline]
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// Which slot space a row lives in: the full-attention layers' or the windowed layers'.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum KvGroup {
    /// Layers that attend to every earlier position (the only space without windows).
    #[default]
    Full,
    /// Layers that attend through a sliding window ([`WindowConfig`]).
    Window,
}

/// One KV row copy: the row at `from` is written to `to` (every layer of `group`, K and V).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvMove {
    /// Source row.
    pub from: Slot,
    /// Destination row.
    pub to: Slot,
    /// The slot space both rows are in.
    pub group: KvGroup,
}

impl KvMove {
    /// A copy in the full-attention layers' slot space.
    pub fn full(from: Slot, to: Slot) -> Self {
        Self {
            from,
            to,
            group: KvGroup::Full,
        }
    }
}
