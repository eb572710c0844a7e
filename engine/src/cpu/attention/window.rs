//! Sliding-window attention as a view of the batch: a layer whose rows see only the last
//! `window` positions (their own included) runs the same attention kernels over a batch in
//! which each row that the window cuts is a sequence of its own, whose context is exactly the
//! keys it sees, in position order: the context positions from its window's start, then its
//! visible tree ancestors from there on. A row keeps its keys' order, so a draft node computes
//! what the same token computes decoded as a chain (the kernels' batch invariance), and the
//! window counts from the node's own position. Sequences whose rows all lie inside the window
//! are kept whole. Where the windowed layers keep their own slot space, the view reads and
//! writes that space's slots (a sequence's context there starts where its windowed table
//! does). `WindowViews` makes each window length's view once per forward.

use crate::tree::TreeMask;
use crate::tree_batch::{SeqEntry, TreeBatch};
use crate::{Error, Result};

/// The first position a row at `position` sees through a window of `window` keys.
pub fn window_start(position: usize, window: usize) -> usize {
    (position + 1).saturating_sub(window)
}

/// `batch` as layers with a window of `window` keys see it, or `None` where the window
/// cuts no row's keys and the windowed layers share the full slot space (then the batch
/// itself is that view). Where they have their own space (`TreeBatch::window_slots`), the
/// view always reads and writes there. Errors when a row would see a position the windowed
/// space no longer holds.
pub fn windowed_batch(batch: &TreeBatch, window: usize) -> Result<Option<TreeBatch>> {
    let own_space = !batch.window_slots.is_empty();
    let cut = |seq: &SeqEntry| {
        seq.rows
            .clone()
            .any(|r| window_start(batch.positions[r] as usize, window) > 0)
    };
    if !own_space && !batch.seqs.iter().any(cut) {
        return Ok(None);
    }
    let row_slots = if own_space {
        &batch.window_slots
    } else {
        &batch.slots
    };
    let mut seqs = Vec::with_capacity(batch.num_rows());
    for seq in &batch.seqs {
        let (first, context): (usize, &[usize]) = match (&seq.window_context, own_space) {
            (Some(held), true) => (held.first, &held.slots),
            (None, true) => {
                return Err(Error::InvalidBatch(
                    "a sequence without its windowed context".into(),
                ))
            }
            (_, false) => (0, &seq.context_slots),
        };
        if !cut(seq) && first == 0 {
            seqs.push(SeqEntry {
                context_slots: context.to_vec(),
                window_context: None,
                ..seq.clone()
            });
            continue;
        }
        for (local, row) in seq.rows.clone().enumerate() {
            let start = window_start(batch.positions[row] as usize, window);
            if start < first {
                return Err(Error::InvalidBatch(format!(
                    "a row at position {} sees position {start}, which the windowed KV space no longer holds (it starts at {first})",
                    batch.positions[row]
                )));
            }
            let from = (start - first).min(context.len());
            let mut keys: Vec<usize> = context[from..].to_vec();
            keys.extend(
                seq.mask
                    .visible(local)
                    .filter(|&j| j != local)
                    .map(|j| seq.rows.start + j)
                    .filter(|&r| batch.positions[r] as usize >= start)
                    .map(|r| row_slots[r].index()),
            );
            seqs.push(SeqEntry {
                context_len: keys.len(),
                block_table: seq.block_table.clone(),
                rows: row..row + 1,
                mask: TreeMask::causal(1),
                context_slots: keys,
                window_context: None,
                state: seq.state,
            });
        }
    }
    Ok(Some(TreeBatch {
        token_ids: batch.token_ids.clone(),
        positions: batch.positions.clone(),
        slots: row_slots.clone(),
        window_slots: Vec::new(),
        seqs,
        logit_rows: batch.logit_rows.clone(),
        hidden_outputs: batch.hidden_outputs.clone(),
        block_size: batch.block_size,
        state_saves: Vec::new(),
    }))
}

/// A batch's windowed views, one per window length its layers use, made once per forward.
pub struct WindowViews {
    views: Vec<(usize, Option<TreeBatch>)>,
}

impl WindowViews {
    /// The views of `batch` for each of `windows` (repeats are made once).
    pub fn new(batch: &TreeBatch, windows: impl Iterator<Item = usize>) -> Result<Self> {
        let mut views: Vec<(usize, Option<TreeBatch>)> = Vec::new();
        for w in windows {
            if !views.iter().any(|(seen, _)| *seen == w) {
                views.push((w, windowed_batch(batch, w)?));
            }
        }
        Ok(Self { views })
    }

    /// The batch as a layer with `window` sees it (`None`: the batch itself).
    pub fn batch(&self, window: Option<usize>) -> Option<&TreeBatch> {
        let w = window?;
        self.views
            .iter()
            .find(|(seen, _)| *seen == w)
            .and_then(|(_, view)| view.as_ref())
    }
}
