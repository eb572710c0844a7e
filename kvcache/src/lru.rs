//! `LruList`: an intrusive doubly linked list over block indices, used for the prefix
//! cache's evictable blocks (reference count zero, hash kept). Links live in two flat
//! arrays indexed by block, so pushing, popping the oldest and unlinking a block from the
//! middle (a cache hit revives it) are all O(1) with no allocation after construction.

const NIL: u32 = u32::MAX;

/// Least-recently-released order over a fixed range of block indices.
#[derive(Debug, Clone)]
pub(crate) struct LruList {
    prev: Vec<u32>,
    next: Vec<u32>,
    linked: Vec<bool>,
    head: u32,
    tail: u32,
    len: usize,
}

impl LruList {
    /// An empty list over indices `0..capacity`.
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            prev: vec![NIL; capacity],
            next: vec![NIL; capacity],
            linked: vec![false; capacity],
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }

    /// Entries in the list.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether `index` is in the list.
    pub(crate) fn contains(&self, index: u32) -> bool {
        self.linked[index as usize]
    }

    /// Appends `index` as the most recent entry.
    ///
    /// # Panics
    /// If `index` is already linked (the caller's state machine is broken).
    pub(crate) fn push_back(&mut self, index: u32) {
        let i = index as usize;
        assert!(!self.linked[i], "block {index} is already evictable");
        self.linked[i] = true;
        self.prev[i] = self.tail;
        self.next[i] = NIL;
        if self.tail == NIL {
            self.head = index;
        } else {
            self.next[self.tail as usize] = index;
        }
        self.tail = index;
        self.len += 1;
    }

    /// Removes and returns the oldest entry.
    pub(crate) fn pop_front(&mut self) -> Option<u32> {
        let head = self.head;
        if head == NIL {
            return None;
        }
        self.unlink(head);
        Some(head)
    }

    /// Removes `index` from wherever it is. Returns false when it was not linked.
    pub(crate) fn unlink(&mut self, index: u32) -> bool {
        let i = index as usize;
        if !self.linked[i] {
            return false;
        }
        let (prev, next) = (self.prev[i], self.next[i]);
        if prev == NIL {
            self.head = next;
        } else {
            self.next[prev as usize] = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.prev[next as usize] = prev;
        }
        self.prev[i] = NIL;
        self.next[i] = NIL;
        self.linked[i] = false;
        self.len -= 1;
        true
    }

    /// Entries from oldest to newest (tests and invariant checks).
    pub(crate) fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        let mut at = self.head;
        std::iter::from_fn(move || {
            if at == NIL {
                return None;
            }
            let here = at;
            at = self.next[at as usize];
            Some(here)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_release_order_and_unlinks_from_the_middle() {
        let mut lru = LruList::new(8);
        for i in [3, 1, 4, 5] {
            lru.push_back(i);
        }
        assert!(lru.unlink(4));
        assert!(!lru.unlink(4));
        assert_eq!(lru.iter().collect::<Vec<_>>(), vec![3, 1, 5]);
        assert_eq!(lru.pop_front(), Some(3));
        lru.push_back(3);
        assert_eq!(lru.iter().collect::<Vec<_>>(), vec![1, 5, 3]);
        assert!(lru.unlink(3));
        assert!(lru.unlink(1));
        assert_eq!(lru.pop_front(), Some(5));
        assert_eq!(lru.pop_front(), None);
        assert_eq!(lru.len(), 0);
    }
}
