//! One layer's keys and values in one value type (`KvRows`) and where a head's rows lie in
//! them (`Geometry`): values `[kv_head][slot][dim]`, keys in tiles of `KEY_TILE` slots per KV
//! head, so attention scores sixteen keys at once with no transpose (see the store's module
//! doc); writes at slots, compaction's row copies and the f32 view tests read.

use kvcache::{KvMove, Slot};

use super::{key_at, KvValue, KEY_TILE, PAGE_BYTES};

/// Where a store's head rows lie: values `[kv_head][slot][dim]`, keys in tiles (see the
/// module doc).
#[derive(Debug, Clone, Copy)]
pub(super) struct Geometry {
    pub(super) num_slots: usize,
    pub(super) num_kv_heads: usize,
    pub(super) head_dim: usize,
}

impl Geometry {
    /// Offset of `slot`'s value row of KV head `head`.
    pub(super) fn value_at(&self, head: usize, slot: Slot) -> usize {
        (head * self.num_slots + slot.index()) * self.head_dim
    }

    /// Slots in one KV head's key plane: whole tiles.
    pub(super) fn key_slots(&self) -> usize {
        self.num_slots.div_ceil(KEY_TILE) * KEY_TILE
    }

    /// Offset of `slot`'s key (dimension 0) of KV head `head`.
    pub(super) fn key_at(&self, head: usize, slot: Slot) -> usize {
        head * self.key_slots() * self.head_dim + key_at(slot.index(), self.head_dim)
    }
}

/// One layer's K and V of one value type: values `[num_kv_heads][num_slots][head_dim]`, keys
/// in tiles of [`KEY_TILE`] slots per KV head (see the module doc).
#[derive(Debug, Clone)]
pub struct KvRows<T> {
    /// Keys.
    pub k: Vec<T>,
    /// Values.
    pub v: Vec<T>,
}

impl<T: KvValue> KvRows<T> {
    /// Zeroed rows, allocated as zeroed memory: the OS maps the pages when they are first
    /// written, so a multi-GiB pool costs nothing until it is used (`vec![zero; n]` would
    /// write every value up front for a type the standard library cannot tell is zero).
    pub(super) fn zeroed(g: Geometry) -> Self {
        Self {
            k: bytemuck::zeroed_vec(g.num_kv_heads * g.key_slots() * g.head_dim),
            v: bytemuck::zeroed_vec(g.num_kv_heads * g.num_slots * g.head_dim),
        }
    }

    /// Writes one value in every page back (see [`PagedKvStore::prefault`]).
    pub(super) fn prefault(&mut self) {
        let step = (PAGE_BYTES / std::mem::size_of::<T>()).max(1);
        for values in [&mut self.k, &mut self.v] {
            for i in (0..values.len()).step_by(step) {
                // `black_box` hides that the value is unchanged, so the write is kept.
                values[i] = std::hint::black_box(values[i]);
            }
        }
    }

    /// `k` and `v` (`[row][kv_head][dim]`) at `slots`.
    pub(super) fn write(&mut self, g: Geometry, slots: &[Slot], k: &[f32], v: &[f32]) {
        let (d, w) = (g.head_dim, g.num_kv_heads * g.head_dim);
        // A key is converted a few dimensions at a time, then spread over its tile.
        let mut key = [T::zeroed(); KEY_TILE];
        for (row, &slot) in slots.iter().enumerate() {
            for h in 0..g.num_kv_heads {
                let (at, src) = (g.value_at(h, slot), row * w + h * d);
                T::store(&v[src..src + d], &mut self.v[at..at + d]);
                let at = g.key_at(h, slot);
                for (c, part) in k[src..src + d].chunks(KEY_TILE).enumerate() {
                    let key = &mut key[..part.len()];
                    T::store(part, key);
                    for (i, &x) in key.iter().enumerate() {
                        self.k[at + (c * KEY_TILE + i) * KEY_TILE] = x;
                    }
                }
            }
        }
    }

    pub(super) fn apply_moves(&mut self, g: Geometry, moves: &[KvMove]) {
        let d = g.head_dim;
        for m in moves {
            for h in 0..g.num_kv_heads {
                let (from, to) = (g.value_at(h, m.from), g.value_at(h, m.to));
                self.v.copy_within(from..from + d, to);
                let (from, to) = (g.key_at(h, m.from), g.key_at(h, m.to));
                for i in 0..d {
                    self.k[to + i * KEY_TILE] = self.k[from + i * KEY_TILE];
                }
            }
        }
    }

    /// Keys and values as f32, both `[num_kv_heads][num_slots][head_dim]` (none for rows that
    /// hold none: a layer that keeps rows of its own instead).
    pub(super) fn to_f32(&self, g: Geometry) -> (Vec<f32>, Vec<f32>) {
        if self.k.is_empty() {
            return (Vec::new(), Vec::new());
        }
        let mut k = Vec::with_capacity(self.v.len());
        for h in 0..g.num_kv_heads {
            for slot in 0..g.num_slots {
                let at = g.key_at(h, Slot(slot as u32));
                k.extend((0..g.head_dim).map(|i| self.k[at + i * KEY_TILE].to_f32()));
            }
        }
        (k, self.v.iter().map(|x| x.to_f32()).collect())
    }
}
