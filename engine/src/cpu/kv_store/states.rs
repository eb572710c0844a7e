//! Recurrent states: what a layer whose token mixer carries a state (Gated DeltaNet) keeps
//! per sequence rather than per position, one f32 state of fixed size per state slot, with
//! the number of the sequence's positions folded into it. A state slot belongs to one live
//! sequence (the engine hands them out and takes them back); each slot is its own
//! allocation, made (zeroed by the OS) the first time it is asked for, so the memory grows
//! with the sequences that run at once and not with the pool, and a new slot never moves
//! the ones before it. The per-position inputs such a layer also keeps (its convolution's, and
//! what a state is advanced over once a draft path is accepted) are rows of the paged store
//! like any other (`LayerStorage::Recurrent`). The store's own methods on the states (a
//! step's state beside the rows, the snapshots it copies into, mapping them at start) are
//! here too.

use super::{LayerData, PagedKvStore};
use crate::{Error, Result};

/// One recurrent layer's states.
#[derive(Debug, Clone, Default)]
struct LayerStates {
    /// Floats per state.
    size: usize,
    /// Per slot, `size` floats (empty: not asked for yet).
    values: Vec<Vec<f32>>,
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
            states.values.resize_with(slot + 1, Vec::new);
        }
        let values = &mut states.values[slot];
        if values.is_empty() {
            // A zeroed allocation: the OS hands over zero pages, nothing is written here.
            *values = vec![0.0; states.size];
        }
        Ok(StateMut {
            values,
            folded: &mut states.folded[slot],
        })
    }

    /// Slots `0..slots` of every layer that keeps states allocated, and one value in each of
    /// their memory pages written, so that the OS maps them now rather than during the steps
    /// that first reach them (slots are handed out lowest first).
    pub(super) fn prefault(&mut self, slots: usize) {
        for layer in 0..self.layers.len() {
            if self.layers[layer].size == 0 {
                continue;
            }
            for slot in 0..slots {
                if let Ok(state) = self.slot(layer, slot) {
                    for i in (0..state.values.len()).step_by(super::PAGE_BYTES / 4) {
                        // `black_box` hides that the value is unchanged, so the write is kept.
                        state.values[i] = std::hint::black_box(state.values[i]);
                    }
                }
            }
        }
    }

    /// Layer `layer`'s state in `slot`, and those in `others` beside it (each allocated on
    /// first use; `others` distinct, none of them `slot`), in that order.
    pub(super) fn slots(
        &mut self,
        layer: usize,
        slot: usize,
        others: &[usize],
    ) -> Result<(StateMut<'_>, Vec<StateMut<'_>>)> {
        for &s in std::iter::once(&slot).chain(others) {
            self.slot(layer, s)?;
        }
        let mut distinct: Vec<usize> = std::iter::once(slot)
            .chain(others.iter().copied())
            .collect();
        distinct.sort_unstable();
        distinct.dedup();
        if distinct.len() != others.len() + 1 {
            return Err(Error::InvalidBatch(format!(
                "state slots asked for twice at once: {slot} and {others:?}"
            )));
        }
        let states = &mut self.layers[layer];
        let mut main = None;
        let mut rest: Vec<Option<StateMut<'_>>> = others.iter().map(|_| None).collect();
        for (i, (values, folded)) in states.values.iter_mut().zip(&mut states.folded).enumerate() {
            let state = StateMut { values, folded };
            if i == slot {
                main = Some(state);
            } else if let Some(k) = others.iter().position(|&o| o == i) {
                rest[k] = Some(state);
            }
        }
        let missing = || Error::InvalidBatch("a state slot vanished".into());
        let main = main.ok_or_else(missing)?;
        let rest = rest
            .into_iter()
            .map(|s| s.ok_or_else(missing))
            .collect::<Result<_>>()?;
        Ok((main, rest))
    }

    /// Layer `layer`'s state in `from` copied into `to`, with its folded count.
    pub(super) fn copy(&mut self, layer: usize, from: usize, to: usize) -> Result<()> {
        if from == to {
            return self.slot(layer, from).map(|_| ());
        }
        self.slot(layer, from)?;
        self.slot(layer, to)?;
        let states = &mut self.layers[layer];
        let (source, target) = if from < to {
            let (low, high) = states.values.split_at_mut(to);
            (&low[from], &mut high[0])
        } else {
            let (low, high) = states.values.split_at_mut(from);
            (&high[0], &mut low[to])
        };
        target.copy_from_slice(source);
        states.folded[to] = states.folded[from];
        Ok(())
    }

    /// Layer `layer`'s state in `slot` set to `values`, having folded `folded` positions.
    #[cfg(test)]
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
        self.layers
            .iter()
            .flat_map(|s| &s.values)
            .map(|v| v.len() * 4)
            .sum()
    }
}

/// A store's recurrent states, beside its rows.
impl PagedKvStore {
    /// Maps the first `slots` recurrent state slots of every layer that keeps states (see
    /// [`PagedKvStore::prefault`]).
    pub fn prefault_states(&mut self, slots: usize) {
        self.states.prefault(slots);
    }

    /// Bytes one sequence's recurrent states take (0 for a model with none).
    pub fn state_bytes_per_sequence(&self) -> usize {
        self.states.bytes_per_sequence()
    }

    /// Layer `layer`'s recurrent state in `from` copied into `to` (a snapshot kept, or
    /// resumed from).
    pub fn copy_state(&mut self, layer: usize, from: usize, to: usize) -> Result<()> {
        self.states.copy(layer, from, to)
    }

    /// Layer `layer`'s rows (as `rows` gives them) and its recurrent state in `slot` (zero,
    /// with nothing folded, the first time the slot is asked for).
    pub fn rows_and_state(
        &mut self,
        layer: usize,
        slot: usize,
    ) -> Result<((&[f32], usize), StateMut<'_>)> {
        let (rows, state, _) = self.rows_and_states(layer, slot, &[])?;
        Ok((rows, state))
    }

    /// [`PagedKvStore::rows_and_state`], with the states in `saves` beside it (each slot
    /// once, none of them `slot`): where a forward copies the snapshots it takes.
    #[allow(clippy::type_complexity)]
    pub fn rows_and_states(
        &mut self,
        layer: usize,
        slot: usize,
        saves: &[usize],
    ) -> Result<((&[f32], usize), StateMut<'_>, Vec<StateMut<'_>>)> {
        let rows = match self.layers.get(layer).map(|(_, d)| d) {
            Some(LayerData::Rows { width, values }) => (values.as_slice(), *width),
            _ => {
                return Err(Error::InvalidBatch(format!(
                    "layer {layer} keeps no rows of its own"
                )))
            }
        };
        let (state, saved) = self.states.slots(layer, slot, saves)?;
        Ok((rows, state, saved))
    }
}
