//! Recurrent states: what a layer whose token mixer carries a state (Gated DeltaNet) keeps
//! per sequence rather than per position, one f32 state of fixed size per state slot, with
//! the number of the sequence's positions folded into it. A state slot belongs to one live
//! sequence (the engine hands them out and takes them back); slots are allocated the first
//! time they are asked for, so the memory grows with the sequences that run at once and not
//! with the pool. The per-position inputs such a layer also keeps (its convolution's, and
//! what a state is advanced over once a draft path is accepted) are rows of the paged store
//! like any other (`LayerStorage::Recurrent`).

use crate::{Error, Result};

/// One recurrent layer's states.
#[derive(Debug, Clone, Default)]
struct LayerStates {
    /// Floats per state.
    size: usize,
    /// `[slot][size]`.
    values: Vec<f32>,
    /// Positions folded into each slot's state.
    folded: Vec<usize>,
}

/// Every recurrent layer's states (an empty entry for a layer that keeps none).
#[derive(Debug, Clone, Default)]
pub(super) struct RecurrentStates {
    layers: Vec<LayerStates>,
}

/// One sequence's state in one layer, to read and advance.
pub struct StateMut<'a> {
    /// The state (`LayerStorage::Recurrent`'s `state` floats).
    pub values: &'a mut [f32],
    /// How many of the sequence's positions it has folded in.
    pub folded: &'a mut usize,
}

impl RecurrentStates {
    /// States of `sizes[layer]` floats (0: the layer keeps none).
    pub(super) fn new(sizes: impl Iterator<Item = usize>) -> Self {
        Self {
            layers: sizes
                .map(|size| LayerStates {
                    size,
                    ..LayerStates::default()
                })
                .collect(),
        }
    }

    /// Layer `layer`'s state in `slot`, allocated (zero, nothing folded) on first use.
    pub(super) fn slot(&mut self, layer: usize, slot: usize) -> Result<StateMut<'_>> {
        let states = self
            .layers
            .get_mut(layer)
            .filter(|s| s.size > 0)
            .ok_or_else(|| {
                Error::InvalidBatch(format!("layer {layer} keeps no recurrent state"))
            })?;
        if slot >= states.folded.len() {
            states.folded.resize(slot + 1, 0);
            states.values.resize((slot + 1) * states.size, 0.0);
        }
        let size = states.size;
        Ok(StateMut {
            values: &mut states.values[slot * size..(slot + 1) * size],
            folded: &mut states.folded[slot],
        })
    }

    /// Layer `layer`'s state in `from` copied into `to`, with its folded count.
    pub(super) fn copy(&mut self, layer: usize, from: usize, to: usize) -> Result<()> {
        let size = self.slot(layer, from.max(to))?.values.len();
        let states = &mut self.layers[layer];
        states
            .values
            .copy_within(from * size..(from + 1) * size, to * size);
        states.folded[to] = states.folded[from];
        Ok(())
    }

    /// Layer `layer`'s state in `slot` set to `values`, having folded `folded` positions.
    pub(super) fn set(
        &mut self,
        layer: usize,
        slot: usize,
        values: &[f32],
        folded: usize,
    ) -> Result<()> {
        let state = self.slot(layer, slot)?;
        if values.len() != state.values.len() {
            return Err(Error::InvalidBatch(format!(
                "a state of {} values for slots of {}",
                values.len(),
                state.values.len()
            )));
        }
        state.values.copy_from_slice(values);
        *state.folded = folded;
        Ok(())
    }

    /// Bytes one sequence's states take, over every layer.
    pub(super) fn bytes_per_sequence(&self) -> usize {
        self.layers.iter().map(|s| s.size * 4).sum()
    }

    /// Bytes held now.
    pub(super) fn bytes(&self) -> usize {
        self.layers.iter().map(|s| s.values.len() * 4).sum()
    }
}
