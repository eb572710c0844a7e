//! `PagedKvStore`: the K and V rows of every layer, addressed by `kvcache::Slot`. One row is
//! `num_kv_heads * head_dim` f32 values, laid out `[slot][kv_head][dim]`, so a block of B
//! slots is B consecutive rows and the attention kernel reads a sequence's context straight
//! from its blocks with no gather copy. Which slots belong to whom is `kvcache`'s business;
//! this type only stores rows and copies them for compaction.

use kvcache::{KvMove, Slot};

use crate::{Error, Result};

/// K and V rows of one layer.
#[derive(Debug, Clone)]
pub struct LayerKv {
    /// `[num_slots][row_width]`.
    pub k: Vec<f32>,
    /// `[num_slots][row_width]`.
    pub v: Vec<f32>,
}

/// K/V storage for all layers of one model.
#[derive(Debug, Clone)]
pub struct PagedKvStore {
    num_slots: usize,
    row_width: usize,
    layers: Vec<LayerKv>,
}

impl PagedKvStore {
    /// Zeroed storage for `num_slots` rows of `row_width` values in each of `num_layers`.
    pub fn new(num_layers: usize, num_slots: usize, row_width: usize) -> Self {
        // Each layer allocated zeroed on its own (not cloned from one), so the pages are
        // mapped lazily by the OS instead of copied up front: start-up stays instant for a
        // multi-GiB pool.
        let layers = (0..num_layers)
            .map(|_| LayerKv {
                k: vec![0.0; num_slots * row_width],
                v: vec![0.0; num_slots * row_width],
            })
            .collect();
        Self {
            num_slots,
            row_width,
            layers,
        }
    }

    /// Rows per layer.
    pub fn num_slots(&self) -> usize {
        self.num_slots
    }

    /// Values per row.
    pub fn row_width(&self) -> usize {
        self.row_width
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.layers.len() * 2 * self.num_slots * self.row_width * std::mem::size_of::<f32>()
    }

    /// One layer's rows.
    pub fn layer(&self, layer: usize) -> &LayerKv {
        &self.layers[layer]
    }

    /// Writes `k` and `v` (`slots.len()` rows each, row-major) into `layer` at `slots`.
    pub fn write(&mut self, layer: usize, slots: &[Slot], k: &[f32], v: &[f32]) -> Result<()> {
        let w = self.row_width;
        if k.len() != slots.len() * w || v.len() != slots.len() * w {
            return Err(Error::InvalidBatch(format!(
                "kv write of {} rows with {} / {} values (row width {w})",
                slots.len(),
                k.len(),
                v.len()
            )));
        }
        self.check_slots(slots.iter().copied())?;
        let dst = &mut self.layers[layer];
        for (row, slot) in slots.iter().enumerate() {
            let at = slot.index() * w;
            dst.k[at..at + w].copy_from_slice(&k[row * w..(row + 1) * w]);
            dst.v[at..at + w].copy_from_slice(&v[row * w..(row + 1) * w]);
        }
        Ok(())
    }

    /// Copies rows in order, in every layer (compaction of an accepted draft path; the
    /// caller orders moves so that no source is overwritten before it is read).
    pub fn apply_moves(&mut self, moves: &[KvMove]) -> Result<()> {
        self.check_slots(moves.iter().flat_map(|m| [m.from, m.to]))?;
        let w = self.row_width;
        for layer in &mut self.layers {
            for m in moves {
                let (from, to) = (m.from.index() * w, m.to.index() * w);
                layer.k.copy_within(from..from + w, to);
                layer.v.copy_within(from..from + w, to);
            }
        }
        Ok(())
    }

    /// Errors when any slot is outside the store.
    pub fn check_slots(&self, mut slots: impl Iterator<Item = Slot>) -> Result<()> {
        match slots.find(|s| s.index() >= self.num_slots) {
            Some(bad) => Err(Error::InvalidBatch(format!(
                "slot {} outside KV store of {} slots",
                bad.0, self.num_slots
            ))),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_then_move_keeps_rows_intact() {
        let mut store = PagedKvStore::new(2, 8, 3);
        store
            .write(
                1,
                &[Slot(5), Slot(2)],
                &[1., 2., 3., 4., 5., 6.],
                &[7., 8., 9., 10., 11., 12.],
            )
            .unwrap();
        assert_eq!(&store.layer(1).k[15..18], &[1., 2., 3.]);
        assert_eq!(&store.layer(1).v[6..9], &[10., 11., 12.]);
        store
            .apply_moves(&[KvMove {
                from: Slot(5),
                to: Slot(0),
            }])
            .unwrap();
        assert_eq!(&store.layer(1).k[0..3], &[1., 2., 3.]);
        assert!(store.write(0, &[Slot(8)], &[0.; 3], &[0.; 3]).is_err());
    }
}
