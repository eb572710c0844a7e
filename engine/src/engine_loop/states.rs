//! The state slots of a model whose layers carry a recurrent state per sequence (Gated
//! DeltaNet), and the snapshots of those states that let a cached prefix resume. A table of
//! live entries (`slab`) hands out slots of one index space to both:
//!
//! - a running sequence holds one slot, named in every batch it is part of
//!   (`TreeBatch::set_state`), taken when it is first scheduled and given back when it
//!   leaves the engine or is preempted (it then resumes from a snapshot or recomputes);
//! - a snapshot is a copy of a sequence's state at a block boundary, kept under the hash of
//!   the block that ends there, so a prompt whose cached prefix ends there starts from it
//!   (the block manager lets a prefix end only at such a boundary: its resume points).
//!   A sequence keeps a snapshot at every `interval`-th boundary it passes, at the last one
//!   of its prompt (where a repeat of the prompt resumes) and at its latest few (where a
//!   conversation's next turn resumes, its answer re-sent); at most `capacity` are kept,
//!   the least recently used going first.
//!
//! Which boundaries a step passes is known before it runs: a chain the sequence keeps
//! moves its state to the chain's end, and a draft path accepted at the previous step is
//! folded in at the start of this one (`SeqState`), so the forward is told where to copy
//! (`TreeBatch::state_saves`) and the snapshots count once it has succeeded.

use std::collections::HashMap;

use kvcache::{BlockHash, SeqId};
use slab::Slab;

use crate::tree_batch::SeqState;
use crate::{Error, Result};

/// What holds a slot.
#[derive(Debug, Clone, Copy)]
enum Holder {
    Seq(SeqId),
    Snapshot,
}

/// A running sequence's slot.
#[derive(Debug, Default)]
struct SeqSlot {
    slot: usize,
    /// Positions its state has folded in (`None`: not run since it took the slot).
    folded: Option<usize>,
    /// The hashes of its blocks, as far as computed.
    chain: Vec<BlockHash>,
    /// Its latest snapshots, oldest first (at most `RECENT`).
    recent: Vec<BlockHash>,
    /// The last boundary a repeat of its prompt can resume from.
    prompt_end: usize,
}

/// A kept snapshot.
#[derive(Debug, Clone, Copy)]
struct Snapshot {
    slot: usize,
    /// When it was last saved or resumed from.
    used: u64,
}

/// One sequence's part of a step, planned before the forward.
#[derive(Debug, Clone)]
pub(super) struct Planned {
    /// What the batch names.
    pub(super) state: SeqState,
    /// Snapshots the forward takes: `(folded, slot, hash of the block ending there)`.
    pub(super) saves: Vec<(usize, usize, BlockHash)>,
    /// Positions the state has folded in once the step has run.
    end: usize,
}

/// Where a step's sequence stands.
pub(super) struct Step<'a> {
    /// Its tokens (at least as far as the step's rows).
    pub(super) tokens: &'a [u32],
    /// Its cache-salt scope.
    pub(super) scope: Option<BlockHash>,
    /// Positions already computed.
    pub(super) num_computed: usize,
    /// Rows the step feeds.
    pub(super) rows: usize,
    /// Whether the rows are a chain it keeps.
    pub(super) commits: bool,
    /// Tokens of its prompt.
    pub(super) prompt_len: usize,
}

/// Which sequence or snapshot holds which state slot.
#[derive(Debug, Default)]
pub(super) struct StateSlots {
    /// Whether the model has recurrent layers at all (otherwise no slot is ever handed out).
    recurrent: bool,
    holders: Slab<Holder>,
    seqs: HashMap<SeqId, SeqSlot>,
    snapshots: HashMap<BlockHash, Snapshot>,
    /// Snapshots kept at most.
    capacity: usize,
    /// Every this many blocks a snapshot stays when the sequence moves on.
    interval: usize,
    block_size: usize,
    clock: u64,
}

impl StateSlots {
    /// The slots of a model that has recurrent layers (`recurrent`) over blocks of
    /// `block_size`, keeping at most `capacity` snapshots, or of one that has none.
    pub(super) fn new(recurrent: bool, block_size: usize, capacity: usize) -> Self {
        Self {
            recurrent,
            capacity,
            interval: SNAPSHOT_INTERVAL,
            block_size: block_size.max(1),
            ..Self::default()
        }
    }

    /// `seq`'s state for a step (`None` for a model without recurrent layers): its slot,
    /// the snapshot it resumes from where its context is a cached prefix, and the
    /// snapshots the step takes. Nothing is recorded as run until [`StateSlots::ran`].
    pub(super) fn plan(&mut self, seq: SeqId, step: &Step<'_>) -> Result<Option<Planned>> {
        if !self.recurrent {
            return Ok(None);
        }
        self.clock += 1;
        let clock = self.clock;
        if !self.seqs.contains_key(&seq) {
            let slot = self.holders.insert(Holder::Seq(seq));
            self.seqs.insert(
                seq,
                SeqSlot {
                    slot,
                    ..SeqSlot::default()
                },
            );
        }
        let bs = self.block_size;
        let entry = self
            .seqs
            .get_mut(&seq)
            .ok_or_else(|| Error::InvalidBatch("a state slot vanished".into()))?;
        entry.prompt_end = step.prompt_len.saturating_sub(1) / bs * bs;
        let end = step.num_computed + if step.commits { step.rows } else { 0 };
        extend_chain(entry, step.tokens, step.scope, end / bs, bs);
        let (start, resume) = match entry.folded {
            Some(folded) => (folded, None),
            None if step.num_computed == 0 => (0, None),
            None => {
                // Admitted past a cached prefix: it ends at a kept snapshot.
                let hash = entry.chain[step.num_computed / bs - 1];
                let snap = self.snapshots.get_mut(&hash).ok_or_else(|| {
                    Error::InvalidBatch(format!(
                        "no state kept where the cached prefix of {} positions ends",
                        step.num_computed
                    ))
                })?;
                snap.used = clock;
                (step.num_computed, Some(snap.slot))
            }
        };
        let slot = entry.slot;
        let boundaries: Vec<(usize, BlockHash)> = (start / bs + 1..=end / bs)
            .map(|b| (b * bs, entry.chain[b - 1]))
            .collect();
        let mut saves = Vec::new();
        for (at, hash) in boundaries {
            if let Some(snap) = self.snapshots.get_mut(&hash) {
                snap.used = clock;
                continue;
            }
            saves.push((at, self.holders.insert(Holder::Snapshot), hash));
        }
        Ok(Some(Planned {
            state: SeqState {
                slot,
                commits: step.commits,
                resume,
            },
            saves,
            end,
        }))
    }

    /// `seq`'s planned step has run: its state has folded in `planned.end` positions and
    /// the snapshots it took are kept. Returns the boundaries that became resume points
    /// and those that stopped being (snapshots let go).
    pub(super) fn ran(&mut self, seq: SeqId, planned: Planned) -> Changes {
        let mut changes = Changes::default();
        self.clock += 1;
        let clock = self.clock;
        let Some(entry) = self.seqs.get_mut(&seq) else {
            self.abandon(planned);
            return changes;
        };
        entry.folded = Some(planned.end);
        let mut dropped = Vec::new();
        for (_, slot, hash) in planned.saves {
            if self.snapshots.contains_key(&hash) {
                // Another sequence of the step kept the same boundary.
                self.holders.remove(slot);
                continue;
            }
            self.snapshots.insert(hash, Snapshot { slot, used: clock });
            changes.added.push(hash);
            // One that is no longer among the latest few stays only on the interval or at
            // the prompt's end (where a repeat of the prompt resumes).
            entry.recent.push(hash);
            if entry.recent.len() > RECENT {
                let previous = entry.recent.remove(0);
                let kept = entry
                    .chain
                    .iter()
                    .position(|h| *h == previous)
                    .is_some_and(|i| {
                        (i + 1) % self.interval == 0
                            || (i + 1) * self.block_size == entry.prompt_end
                    });
                if !kept {
                    dropped.push(previous);
                }
            }
        }
        for hash in dropped {
            if let Some(snap) = self.snapshots.remove(&hash) {
                self.holders.remove(snap.slot);
                changes.removed.push(hash);
            }
        }
        while self.snapshots.len() > self.capacity {
            let Some((&oldest, _)) = self.snapshots.iter().min_by_key(|(_, s)| s.used) else {
                break;
            };
            if let Some(snap) = self.snapshots.remove(&oldest) {
                self.holders.remove(snap.slot);
                changes.removed.push(oldest);
            }
        }
        changes
    }

    /// A planned step did not run: the slots its snapshots took are given back.
    pub(super) fn abandon(&mut self, planned: Planned) {
        for (_, slot, _) in planned.saves {
            if self.holders.contains(slot) {
                self.holders.remove(slot);
            }
        }
    }

    /// Gives `seq`'s slot back, where it holds one (its snapshots stay).
    pub(super) fn release(&mut self, seq: SeqId) {
        if let Some(entry) = self.seqs.remove(&seq) {
            if matches!(self.holders.get(entry.slot), Some(Holder::Seq(s)) if *s == seq) {
                self.holders.remove(entry.slot);
            }
        }
    }

    /// Slots held now (sequences' and snapshots').
    #[cfg(test)]
    pub(super) fn held(&self) -> usize {
        self.holders.len()
    }
}

/// Every this many blocks a sequence's snapshot is kept when it moves past it.
pub(super) const SNAPSHOT_INTERVAL: usize = 8;

/// A sequence's latest snapshots kept whatever their boundary: a conversation's next turn
/// re-sends the answer, whose last tokens may come back tokenized otherwise.
pub(super) const RECENT: usize = 4;

/// Bytes the snapshots of recurrent states may take.
pub(super) const SNAPSHOT_BYTES: usize = 1 << 30;

/// Snapshots kept at most, for states of `state_bytes` (at least a few, whatever their size).
pub(super) fn snapshot_capacity(state_bytes: usize) -> usize {
    (SNAPSHOT_BYTES / state_bytes.max(1)).max(4)
}

/// Resume points a step added and removed.
#[derive(Debug, Default)]
pub(super) struct Changes {
    pub(super) added: Vec<BlockHash>,
    pub(super) removed: Vec<BlockHash>,
}

/// `entry`'s chain of block hashes extended to `blocks` blocks of `tokens`.
fn extend_chain(
    entry: &mut SeqSlot,
    tokens: &[u32],
    scope: Option<BlockHash>,
    blocks: usize,
    bs: usize,
) {
    let blocks = blocks.min(tokens.len() / bs);
    while entry.chain.len() < blocks {
        let i = entry.chain.len();
        let parent = entry.chain.last().copied().or(scope);
        entry
            .chain
            .push(BlockHash::new(parent, &tokens[i * bs..(i + 1) * bs]));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(tokens: &[u32], num_computed: usize, rows: usize, commits: bool) -> Step<'_> {
        Step {
            tokens,
            scope: None,
            num_computed,
            rows,
            commits,
            prompt_len: 10,
        }
    }

    #[test]
    fn slots_are_reused_once_given_back_and_never_shared() {
        let mut slots = StateSlots::new(true, 4, 8);
        let tokens: Vec<u32> = (0..32).collect();
        let a = slots.plan(SeqId(1), &step(&tokens, 0, 2, true)).unwrap();
        let b = slots.plan(SeqId(2), &step(&tokens, 0, 2, true)).unwrap();
        let (a, b) = (a.unwrap(), b.unwrap());
        assert_ne!(a.state.slot, b.state.slot);
        slots.ran(SeqId(1), a.clone());
        slots.release(SeqId(1));
        let c = slots.plan(SeqId(3), &step(&tokens, 0, 2, true)).unwrap();
        assert_eq!(
            c.unwrap().state.slot,
            a.state.slot,
            "a freed slot is taken again"
        );
        assert!(StateSlots::new(false, 4, 8)
            .plan(SeqId(4), &step(&tokens, 0, 1, true))
            .unwrap()
            .is_none());
    }

    #[test]
    fn a_step_saves_the_boundaries_it_passes_and_keeps_the_interval_and_the_latest() {
        let mut slots = StateSlots::new(true, 4, 64);
        let tokens: Vec<u32> = (0..100).collect();
        // A prefill of 10 positions passes boundaries 4 and 8.
        let p = slots
            .plan(SeqId(1), &step(&tokens, 0, 10, true))
            .unwrap()
            .unwrap();
        let at: Vec<usize> = p.saves.iter().map(|s| s.0).collect();
        assert_eq!(at, [4, 8]);
        let changes = slots.ran(SeqId(1), p);
        assert_eq!(changes.added.len(), 2);
        assert!(changes.removed.is_empty(), "both among the latest few");
        // A verified tree keeps nothing new; the next step folds the accepted path in.
        let p = slots
            .plan(SeqId(1), &step(&tokens, 10, 5, false))
            .unwrap()
            .unwrap();
        assert!(p.saves.is_empty() && !p.state.commits);
        slots.ran(SeqId(1), p);
        let p = slots
            .plan(SeqId(1), &step(&tokens, 13, 1, true))
            .unwrap()
            .unwrap();
        let at: Vec<usize> = p.saves.iter().map(|s| s.0).collect();
        assert_eq!(at, [12], "folded from 10 to 13, then one row kept");
        slots.ran(SeqId(1), p);
        // Another sequence admitted past 12 cached positions resumes from that snapshot.
        let p = slots
            .plan(SeqId(2), &step(&tokens, 12, 3, true))
            .unwrap()
            .unwrap();
        assert!(p.state.resume.is_some());
        assert!(p.saves.is_empty(), "12 is kept already; 15 is no boundary");
        // Far on: the latest four stay, and the interval's (32: the 8th block) and the
        // prompt's last (8), not the others.
        let p = slots
            .plan(SeqId(1), &step(&tokens, 14, 40, true))
            .unwrap()
            .unwrap();
        let changes = slots.ran(SeqId(1), p);
        assert_eq!(changes.added.len(), 10, "16 to 52");
        fn kept(slots: &mut StateSlots, tokens: &[u32], at: usize) -> bool {
            let ok = slots.plan(SeqId(9), &step(tokens, at, 1, true)).is_ok();
            slots.release(SeqId(9));
            ok
        }
        for (at, want) in [(4, false), (8, true), (12, false), (20, false), (32, true)] {
            assert_eq!(kept(&mut slots, &tokens, at), want, "boundary {at}");
        }
        for at in [40, 44, 48, 52] {
            assert!(
                kept(&mut slots, &tokens, at),
                "boundary {at}, among the latest"
            );
        }
        // Past an unkept boundary: a clear error.
        let err = slots
            .plan(SeqId(3), &step(&tokens, 4, 1, true))
            .unwrap_err();
        assert!(err.to_string().contains("no state kept"), "{err}");
    }

    #[test]
    fn snapshots_beyond_the_capacity_go_least_recently_used_first() {
        let mut slots = StateSlots::new(true, 4, 2);
        let tokens: Vec<u32> = (0..200).collect();
        let mut removed = 0;
        for (i, seq) in (0..4).map(SeqId).enumerate() {
            let tokens = &tokens[i * 40..];
            let p = slots.plan(seq, &step(tokens, 0, 4, true)).unwrap().unwrap();
            removed += slots.ran(seq, p).removed.len();
            slots.release(seq);
        }
        assert_eq!(removed, 2);
        assert_eq!(slots.held(), 2, "two snapshots, no sequence");
    }
}
