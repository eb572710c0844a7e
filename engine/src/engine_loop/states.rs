//! The state slots of a model whose layers carry a recurrent state per sequence (Gated
//! DeltaNet): a table of live entries (`slab`) giving each running sequence a slot of its
//! own, named in every batch it is part of (`TreeBatch::set_state`). A slot is taken when
//! its sequence is first scheduled and given back when the sequence leaves the engine or is
//! preempted (it recomputes from its first token, which resets the state), so the slots in
//! use never exceed the sequences that run at once and the store's states stay that many.

use std::collections::HashMap;

use kvcache::SeqId;
use slab::Slab;

/// Which sequence holds which state slot.
#[derive(Debug, Default)]
pub(super) struct StateSlots {
    /// Whether the model has recurrent layers at all (otherwise no slot is ever handed out).
    recurrent: bool,
    holders: Slab<SeqId>,
    of: HashMap<SeqId, usize>,
}

impl StateSlots {
    /// The slots of a model that has recurrent layers (`recurrent`), or of one that has none.
    pub(super) fn new(recurrent: bool) -> Self {
        Self {
            recurrent,
            ..Self::default()
        }
    }

    /// `seq`'s slot, taken now if it holds none (`None` for a model without recurrent
    /// layers).
    pub(super) fn take(&mut self, seq: SeqId) -> Option<usize> {
        if !self.recurrent {
            return None;
        }
        if let Some(&slot) = self.of.get(&seq) {
            return Some(slot);
        }
        let slot = self.holders.insert(seq);
        self.of.insert(seq, slot);
        Some(slot)
    }

    /// `seq`'s slot, where it holds one.
    pub(super) fn of(&self, seq: SeqId) -> Option<usize> {
        self.of.get(&seq).copied()
    }

    /// Gives `seq`'s slot back, where it holds one.
    pub(super) fn release(&mut self, seq: SeqId) {
        if let Some(slot) = self.of.remove(&seq) {
            self.holders.remove(slot);
        }
    }

    /// Slots held now.
    #[cfg(test)]
    pub(super) fn held(&self) -> usize {
        self.holders.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_reused_once_given_back_and_never_shared() {
        let mut slots = StateSlots::new(true);
        let a = slots.take(SeqId(1)).unwrap();
        let b = slots.take(SeqId(2)).unwrap();
        assert_ne!(a, b);
        assert_eq!(slots.take(SeqId(1)), Some(a));
        slots.release(SeqId(1));
        slots.release(SeqId(1));
        assert_eq!(slots.of(SeqId(1)), None);
        let c = slots.take(SeqId(3)).unwrap();
        assert_eq!(c, a, "a freed slot is taken again first");
        assert_eq!(slots.held(), 2);
        assert_eq!(StateSlots::new(false).take(SeqId(4)), None);
    }
}
