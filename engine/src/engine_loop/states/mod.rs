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
//!   the least recently used going first. Both come from [`StateSnapshotConfig`]
//!   (`--state-snapshot-interval`, `--state-snapshot-mib`).
//!
//! [`StateStats`] counts what the slots hold, for `EngineStats` and `/metrics`.
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

/// How the snapshots of recurrent states are kept (a model with recurrent layers; ignored
/// otherwise).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateSnapshotConfig {
    /// A sequence's snapshot stays, once it is no longer among the sequence's latest few, at
    /// every this many block boundaries (0: only at its prompt's last boundary).
    pub interval: usize,
    /// Bytes the kept snapshots may take (at least four are kept, whatever their size).
    pub max_bytes: usize,
}

impl Default for StateSnapshotConfig {
    /// Every 8th boundary, within 1 GiB.
    fn default() -> Self {
        Self {
            interval: SNAPSHOT_INTERVAL,
            max_bytes: SNAPSHOT_BYTES,
        }
    }
}

impl StateSnapshotConfig {
    /// Snapshots kept at most for states of `state_bytes`: as many as the memory bound
    /// buys, and at least four.
    pub fn capacity(&self, state_bytes: usize) -> usize {
        (self.max_bytes / state_bytes.max(1)).max(4)
    }

    /// Errors on settings the engine cannot run with: a bound of no bytes.
    pub fn validate(&self) -> Result<()> {
        if self.max_bytes == 0 {
            return Err(Error::Config(
                "the snapshots of recurrent states need a memory bound above 0 \
                 (--state-snapshot-mib: 1 or more)"
                    .into(),
            ));
        }
        Ok(())
    }
}

/// What the state slots of a model with recurrent layers hold.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StateStats {
    /// Sequences that may hold a slot at once (`max_num_seqs`: the states the KV memory
    /// was sized for).
    pub slots_total: usize,
    /// Sequences holding a slot now.
    pub slots_in_use: usize,
    /// Snapshots kept.
    pub snapshots: usize,
    /// Bytes those snapshots take.
    pub snapshot_bytes: usize,
    /// Sequences that started from a kept snapshot (past a cached prefix: a repeated
    /// prompt, a conversation's next turn, a preempted sequence coming back) since start.
    pub resumes: u64,
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
    /// Every this many blocks a snapshot stays when the sequence moves on (0: none).
    interval: usize,
    block_size: usize,
    /// Bytes of one state (one sequence's, or one snapshot's).
    state_bytes: usize,
    /// Steps run that started from a snapshot.
    resumes: u64,
    /// Whether snapshots are taken at all (not without a prefix cache to resume them).
    taking: bool,
    clock: u64,
}

impl StateSlots {
    /// The slots of a model that has recurrent layers (`recurrent`), with states of
    /// `state_bytes`, over blocks of `block_size`, keeping snapshots as `config` says, or of
    /// one that has none.
    pub(super) fn new(
        recurrent: bool,
        block_size: usize,
        state_bytes: usize,
        config: StateSnapshotConfig,
    ) -> Self {
        Self {
            recurrent,
            capacity: snapshot_capacity(config.max_bytes, state_bytes),
            interval: config.interval,
            block_size: block_size.max(1),
            state_bytes,
            taking: true,
            ..Self::default()
        }
    }

    /// The same slots, taking snapshots only where `taking` (a prefix cache can resume
    /// from them).
    pub(super) fn with_snapshots(self, taking: bool) -> Self {
        Self { taking, ..self }
    }

    /// What the slots hold now (`None` for a model without recurrent layers), of
    /// `slots_total` for sequences.
    pub(super) fn stats(&self, slots_total: usize) -> Option<StateStats> {
        self.recurrent.then(|| StateStats {
            slots_total,
            slots_in_use: self.seqs.len(),
            snapshots: self.snapshots.len(),
            snapshot_bytes: self.snapshots.len() * self.state_bytes,
            resumes: self.resumes,
        })
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
        for (at, hash) in boundaries.into_iter().filter(|_| self.taking) {
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
        if planned.state.resume.is_some() {
            self.resumes += 1;
        }
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
                        (i + 1).checked_rem(self.interval) == Some(0)
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

/// Every this many blocks a sequence's snapshot is kept when it moves past it (by default).
pub(super) const SNAPSHOT_INTERVAL: usize = 8;

/// A sequence's latest snapshots kept whatever their boundary: a conversation's next turn
/// re-sends the answer, whose last tokens may come back tokenized otherwise.
pub(super) const RECENT: usize = 4;

/// Bytes the snapshots of recurrent states may take (by default).
pub(super) const SNAPSHOT_BYTES: usize = 1 << 30;

/// Snapshots kept at most within `max_bytes`, for states of `state_bytes` (at least a few,
/// whatever their size).
pub(super) fn snapshot_capacity(max_bytes: usize, state_bytes: usize) -> usize {
    StateSnapshotConfig {
        interval: 0,
        max_bytes,
    }
    .capacity(state_bytes)
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
mod tests;
