//! The slots an attention loop reads, checked once against the store they index: [`Slots`],
//! parameterised by how the store lays a slot out ([`RowMajor`] for values, [`KeyTiles`] for
//! keys). The check is the constructor's: a value of these types promises that every slot's
//! whole extent lies inside the store, which is what lets the loops read it unchecked.

use std::marker::PhantomData;

use crate::cpu::kv_store::KEY_TILE;

/// Where a store of `width` values per slot keeps a slot.
pub trait SlotLayout: Copy {
    /// One past the last value a loop may read for `slot`.
    fn end(slot: usize, width: usize) -> usize;
}

/// Slot `s`'s row at `s * width` (values).
#[derive(Clone, Copy)]
pub struct RowMajor;

impl SlotLayout for RowMajor {
    fn end(slot: usize, width: usize) -> usize {
        (slot + 1) * width
    }
}

/// Slots in tiles of [`KEY_TILE`], dimension-major (keys): a loop reads a slot's whole tile.
#[derive(Clone, Copy)]
pub struct KeyTiles;

impl SlotLayout for KeyTiles {
    fn end(slot: usize, width: usize) -> usize {
        (slot / KEY_TILE + 1) * KEY_TILE * width
    }
}

/// Slots of `width` values each, laid out as `L` says, each checked to lie inside a store
/// of `store` values.
#[derive(Clone, Copy)]
pub struct Slots<'a, L> {
    pub(super) slots: &'a [usize],
    pub(super) width: usize,
    /// The store length the slots were checked against.
    pub(super) store: usize,
    layout: PhantomData<L>,
}

/// Value rows.
pub type Rows<'a> = Slots<'a, RowMajor>;

/// Keys in a KV head's key plane.
pub type KeySlots<'a> = Slots<'a, KeyTiles>;

#[allow(clippy::len_without_is_empty)]
impl<'a, L: SlotLayout> Slots<'a, L> {
    /// `None` unless every slot's extent lies inside `store` values. A slot's extent ends no
    /// earlier than a smaller slot's, so the largest slot decides (a maximum without early
    /// exit, which the compiler vectorises: this runs for every layer and KV head).
    pub fn new(slots: &'a [usize], width: usize, store: usize) -> Option<Self> {
        let largest = slots.iter().fold(0, |m, &s| m.max(s));
        (slots.is_empty() || L::end(largest, width) <= store).then_some(Self {
            slots,
            width,
            store,
            layout: PhantomData,
        })
    }

    /// How many slots.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// The slots in `range` (checked already, with the rest).
    pub fn part(&self, range: std::ops::Range<usize>) -> Self {
        Self {
            slots: &self.slots[range],
            ..*self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_whose_extent_leaves_the_store_is_refused() {
        // Rows: slot 2 of width 4 ends at 12.
        assert!(Rows::new(&[0, 2], 4, 12).is_some());
        assert!(Rows::new(&[0, 3], 4, 12).is_none());
        // Whatever the order: the largest slot decides.
        assert!(Rows::new(&[3, 0, 1], 4, 12).is_none());
        assert!(Rows::new(&[2, 0, 1], 4, 12).is_some());
        assert!(Rows::new(&[], 4, 0).is_some());
        // Keys: slot 2 is read as its whole tile, which ends at KEY_TILE * width.
        assert!(KeySlots::new(&[2], 4, KEY_TILE * 4).is_some());
        assert!(KeySlots::new(&[2], 4, KEY_TILE * 4 - 1).is_none());
        assert!(KeySlots::new(&[KEY_TILE], 4, KEY_TILE * 4).is_none());
        let keys = KeySlots::new(&[0, 1, 2, 3], 4, KEY_TILE * 4).unwrap();
        assert_eq!(keys.part(1..3).len(), 2);
        assert_eq!(keys.part(1..3).slots, &[1, 2]);
    }
}
