//! `TreeBatch`: everything one forward needs, flattened. Rows are the new tokens of every
//! sequence, concatenated; each row carries its RoPE position and the slot its K/V is written
//! to. Each sequence carries its cached context (`context_len` positions in its block table)
//! and the ancestor mask over its own rows. Sequences never see each other.
//!
//! ```text
//!  seq A: context 5, tree of 3     seq B: context 0, chain (prefill) of 4
//!  rows   [a0 a1 a2 | b0 b1 b2 b3]
//!  pos    [ 5  6  6 |  0  1  2  3]    position = context_len + depth
//!  slot   [sA(5) sA(6) sA(7) | sB(0) sB(1) sB(2) sB(3)]   node i -> slot(context_len + i)
//! ```
//! Node i of a tree is written at position index `context_len + i` of its block table (not at
//! its RoPE position): siblings need distinct rows. After verification the accepted path is
//! moved to consecutive slots.
//!
//! Where the windowed layers keep their own slot space (`kvcache::KvGroup::Window`), each row
//! also carries its slot there, and each sequence the slots there of the context positions
//! its windowed table still holds (`WindowContext`); the windowed layers read and write only
//! those (`crate::cpu::attention::windowed_batch`).

use std::ops::Range;

use kvcache::{BlockTable, Slot};

use crate::tree::{TokenTree, TreeMask};
use crate::{Error, Result};

/// Which rows of a sequence need logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitRows {
    /// None (a prefill chunk that does not end the prompt).
    None,
    /// Only the last node.
    Last,
    /// Every node (verification).
    All,
    /// Only the last node, and its final-normed state instead of logits (a pooling
    /// request's last prompt row: an embedding).
    Hidden,
}

/// One sequence's part of a batch.
#[derive(Debug, Clone)]
pub struct SeqEntry {
    /// Positions already in the KV store.
    pub context_len: usize,
    /// Blocks backing context and new rows.
    pub block_table: BlockTable,
    /// This sequence's rows in the batch.
    pub rows: Range<usize>,
    /// Ancestor mask over its rows.
    pub mask: TreeMask,
    /// The slot of each context position as a row index into the KV store, in position order
    /// (looked up once per batch, for every layer and KV head that reads the context).
    pub context_slots: Vec<usize>,
    /// The context in the windowed layers' own slot space, where they have one.
    pub window_context: Option<WindowContext>,
    /// The sequence's state slot in the layers that carry a recurrent state, where the model
    /// has such layers (`TreeBatch::set_state`).
    pub state: Option<SeqState>,
}

/// Where a sequence's recurrent state lives and what the forward does with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqState {
    /// The state slot: one per live sequence, its own until it ends.
    pub slot: usize,
    /// The rows are a chain that the sequence keeps whatever is sampled (a prefill chunk, a
    /// plain decode step): the forward leaves the state after its last row in the slot.
    /// Otherwise (a draft tree) the slot keeps the state at the context's end, and the next
    /// forward folds in the path that was accepted, from the inputs the store keeps per
    /// position.
    pub commits: bool,
    /// The state slot to start from instead (a snapshot at the end of a cached prefix,
    /// which the context's length must equal).
    pub resume: Option<usize>,
}

/// A snapshot to keep: the state of a batch's sequence once it has folded `folded`
/// positions, copied into state slot `slot` (a block boundary the forward passes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateSave {
    /// The sequence (its index in the batch's `seqs`).
    pub seq: usize,
    /// Positions folded in when the copy is taken.
    pub folded: usize,
    /// Where the copy goes.
    pub slot: usize,
}

/// A sequence's context as its windowed table holds it: positions `first..context_len`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowContext {
    /// The first position held (those before it no windowed query of the batch sees).
    pub first: usize,
    /// The slot of each held context position, in position order.
    pub slots: Vec<usize>,
}

/// One forward's input.
#[derive(Debug, Clone, Default)]
pub struct TreeBatch {
    /// Token of each row.
    pub token_ids: Vec<u32>,
    /// RoPE position of each row.
    pub positions: Vec<u32>,
    /// KV slot each row writes.
    pub slots: Vec<Slot>,
    /// KV slot each row writes in the windowed layers' own space (empty where they have
    /// none).
    pub window_slots: Vec<Slot>,
    /// The sequences, in row order.
    pub seqs: Vec<SeqEntry>,
    /// Rows whose logits are returned, in this order.
    pub logit_rows: Vec<usize>,
    /// Which of `logit_rows` (indices into it, ascending) return the row's final-normed state
    /// (`[hidden]`) instead of its logits.
    pub hidden_outputs: Vec<usize>,
    /// Slots per block of every block table.
    pub block_size: usize,
    /// Snapshots of recurrent states to keep as the forward passes them.
    pub state_saves: Vec<StateSave>,
}

impl TreeBatch {
    /// An empty batch over blocks of `block_size` slots.
    pub fn new(block_size: usize) -> Self {
        Self {
            block_size,
            ..Self::default()
        }
    }

    /// Appends one sequence's tree. `block_table` must already cover
    /// `context_len + tree.len()` positions. Returns the rows the tree occupies.
    pub fn push(
        &mut self,
        context_len: usize,
        block_table: &BlockTable,
        tree: &TokenTree,
        logits: LogitRows,
    ) -> Result<Range<usize>> {
        self.push_windowed(context_len, block_table, None, tree, logits)
    }

    /// [`TreeBatch::push`] with the sequence's table in the windowed layers' own slot space
    /// (`window_table`), where they have one: every sequence of a batch has one, or none.
    pub fn push_windowed(
        &mut self,
        context_len: usize,
        block_table: &BlockTable,
        window_table: Option<&BlockTable>,
        tree: &TokenTree,
        logits: LogitRows,
    ) -> Result<Range<usize>> {
        if !self.seqs.is_empty() && self.window_slots.is_empty() != window_table.is_none() {
            return Err(Error::InvalidBatch(
                "a batch mixes sequences with and without a windowed KV space".into(),
            ));
        }
        if tree.is_empty() {
            return Err(Error::InvalidBatch("a sequence with no new token".into()));
        }
        let needed = context_len + tree.len();
        if block_table.capacity(self.block_size) < needed {
            return Err(Error::InvalidBatch(format!(
                "block table holds {} positions, {needed} needed",
                block_table.capacity(self.block_size)
            )));
        }
        let context_slots = context_slots(block_table, context_len, self.block_size)
            .ok_or_else(|| Error::InvalidBatch("context outside block table".into()))?;
        let window_context = match window_table {
            Some(table) => Some(window_context(
                table,
                context_len,
                tree.len(),
                self.block_size,
            )?),
            None => None,
        };
        let start = self.token_ids.len();
        if let Some(table) = window_table {
            for i in 0..tree.len() {
                let slot = table
                    .slot(context_len + i, self.block_size)
                    .ok_or_else(|| Error::InvalidBatch("slot outside windowed table".into()))?;
                self.window_slots.push(slot);
            }
        }
        for (i, (&token, &depth)) in tree.tokens().iter().zip(tree.depths()).enumerate() {
            let position = u32::try_from(context_len + depth)
                .map_err(|_| Error::InvalidBatch("position overflows u32".into()))?;
            let slot = block_table
                .slot(context_len + i, self.block_size)
                .ok_or_else(|| Error::InvalidBatch("slot outside block table".into()))?;
            self.token_ids.push(token);
            self.positions.push(position);
            self.slots.push(slot);
        }
        let rows = start..self.token_ids.len();
        match logits {
            LogitRows::None => {}
            LogitRows::Last => self.logit_rows.push(rows.end - 1),
            LogitRows::All => self.logit_rows.extend(rows.clone()),
            LogitRows::Hidden => {
                self.hidden_outputs.push(self.logit_rows.len());
                self.logit_rows.push(rows.end - 1);
            }
        }
        self.seqs.push(SeqEntry {
            context_len,
            block_table: block_table.clone(),
            rows: rows.clone(),
            mask: tree.mask(),
            context_slots,
            window_context,
            state: None,
        });
        Ok(rows)
    }

    /// Names the recurrent state of the batch's sequence `seq` (its index in `seqs`).
    pub fn set_state(&mut self, seq: usize, state: SeqState) -> Result<()> {
        let entry = self
            .seqs
            .get_mut(seq)
            .ok_or_else(|| Error::InvalidBatch(format!("no sequence {seq} in the batch")))?;
        if state.commits && !entry.mask.is_chain() {
            return Err(Error::InvalidBatch(
                "a sequence whose rows branch cannot commit them all".into(),
            ));
        }
        entry.state = Some(state);
        Ok(())
    }

    /// Whether output `i` (the `i`-th of `logit_rows`) is the row's final-normed state.
    pub fn wants_hidden(&self, i: usize) -> bool {
        self.hidden_outputs.binary_search(&i).is_ok()
    }

    /// The outputs in `logit_rows` order, from the logits of the rows that give logits and
    /// the states of those that give states (each in order).
    pub fn interleave_outputs(
        &self,
        logits: Vec<Vec<f32>>,
        hidden: Vec<Vec<f32>>,
    ) -> Result<Vec<Vec<f32>>> {
        if logits.len() + hidden.len() != self.logit_rows.len()
            || hidden.len() != self.hidden_outputs.len()
        {
            return Err(Error::InvalidBatch(format!(
                "{} logit rows and {} states for {} outputs ({} states)",
                logits.len(),
                hidden.len(),
                self.logit_rows.len(),
                self.hidden_outputs.len()
            )));
        }
        let (mut logits, mut hidden) = (logits.into_iter(), hidden.into_iter());
        Ok((0..self.logit_rows.len())
            .filter_map(|i| match self.wants_hidden(i) {
                true => hidden.next(),
                false => logits.next(),
            })
            .collect())
    }

    /// Also returns the logits of `row` (after every row requested so far).
    pub fn request_logits(&mut self, row: usize) -> Result<()> {
        if row >= self.num_rows() {
            return Err(Error::InvalidBatch(format!(
                "logit row {row} outside batch of {} rows",
                self.num_rows()
            )));
        }
        self.logit_rows.push(row);
        Ok(())
    }

    /// Checks this batch against a model of `vocab_size` tokens and `max_positions`
    /// positions and a KV store of `num_slots` rows: every token, position, logit row, slot
    /// and context block in range, sequences contiguous.
    pub fn validate(
        &self,
        vocab_size: usize,
        max_positions: usize,
        num_slots: usize,
    ) -> Result<()> {
        let bad = |msg: String| Err(Error::InvalidBatch(msg));
        let rows = self.num_rows();
        if rows == 0 {
            return bad("empty batch".into());
        }
        if self.positions.len() != rows || self.slots.len() != rows {
            return bad("token, position and slot counts differ".into());
        }
        if let Some(t) = self.token_ids.iter().find(|&&t| t as usize >= vocab_size) {
            return bad(format!("token id {t} outside vocabulary of {vocab_size}"));
        }
        let max_pos = max_positions;
        if let Some(p) = self.positions.iter().find(|&&p| p as usize >= max_pos) {
            return bad(format!(
                "position {p} beyond the model's {max_pos} positions"
            ));
        }
        if let Some(&r) = self.logit_rows.iter().find(|&&r| r >= rows) {
            return bad(format!("logit row {r} outside batch of {rows} rows"));
        }
        if let Some(s) = self.slots.iter().find(|s| s.index() >= num_slots) {
            return bad(format!(
                "slot {} outside KV store of {num_slots} slots",
                s.0
            ));
        }
        let mut next_row = 0;
        for seq in &self.seqs {
            if seq.rows.start != next_row || seq.mask.len() != seq.rows.len() {
                return bad("sequence rows are not contiguous or mask size differs".into());
            }
            next_row = seq.rows.end;
            // The context lives in whole blocks: checking each block that backs it (rather
            // than every position) proves every context slot is inside the store.
            let context_blocks = seq.context_len.div_ceil(self.block_size);
            let blocks = seq.block_table.blocks();
            if blocks.len() < context_blocks {
                return bad("block table does not cover the cached context".into());
            }
            if let Some(b) = blocks[..context_blocks]
                .iter()
                .find(|b| (b.0 as usize + 1) * self.block_size > num_slots)
            {
                return bad(format!(
                    "block {} outside KV store of {num_slots} slots",
                    b.0
                ));
            }
        }
        if next_row != rows {
            return bad("rows not covered by any sequence".into());
        }
        Ok(())
    }

    /// Checks the batch's windowed slots against a store whose windowed layers have
    /// `window_slots` rows of their own (`None`: they live in the full space): a batch has
    /// windowed slots exactly when the store has that space, and every one is inside it.
    pub fn validate_window(&self, window_slots: Option<usize>) -> Result<()> {
        let bad = |msg: String| Err(Error::InvalidBatch(msg));
        let Some(num_slots) = window_slots else {
            if self.window_slots.is_empty() {
                return Ok(());
            }
            return bad("windowed slots for a KV store without a windowed space".into());
        };
        if self.window_slots.len() != self.num_rows() {
            return bad("a KV store with a windowed space needs every row's windowed slot".into());
        }
        let context = self.seqs.iter().map(|s| s.window_context.as_ref());
        let Some(context) = context.collect::<Option<Vec<_>>>() else {
            return bad("a sequence without its windowed context".into());
        };
        let rows = self.window_slots.iter().map(|s| s.index());
        let held = context.iter().flat_map(|c| c.slots.iter().copied());
        if let Some(s) = rows.chain(held).find(|&s| s >= num_slots) {
            return bad(format!(
                "slot {s} outside the windowed KV space of {num_slots} slots"
            ));
        }
        Ok(())
    }

    /// Rows in the batch.
    pub fn num_rows(&self) -> usize {
        self.token_ids.len()
    }

    /// The batch's sequence that row `at` belongs to (its index in `seqs`).
    pub fn seq_of(&self, at: usize) -> usize {
        self.seqs.partition_point(|e| e.rows.end <= at)
    }

    /// The tokens of row `at`'s nearest ancestors in its sequence's rows, its grandparent's
    /// and its parent's, where it has them (a chain's rows have the rows before them).
    pub fn ancestor_tokens(&self, at: usize) -> [Option<u32>; 2] {
        let Some(entry) = self.seqs.get(self.seq_of(at)) else {
            return [None, None];
        };
        let mut nearest = entry
            .mask
            .ancestors_nearest_first(at - entry.rows.start)
            .map(|a| self.token_ids[entry.rows.start + a]);
        let parent = nearest.next();
        [nearest.next(), parent]
    }

    /// Slot of context position `position` of sequence `seq`.
    pub fn context_slot(&self, seq: &SeqEntry, position: usize) -> Option<Slot> {
        seq.block_table.slot(position, self.block_size)
    }
}

/// `table`'s context from its first held position, checked to cover `new` rows after it.
fn window_context(
    table: &BlockTable,
    context_len: usize,
    new: usize,
    block_size: usize,
) -> Result<WindowContext> {
    let bs = block_size.max(1);
    if table.capacity(bs) < context_len + new {
        return Err(Error::InvalidBatch(format!(
            "windowed block table holds {} positions, {} needed",
            table.capacity(bs),
            context_len + new
        )));
    }
    let first = (table.skipped() * bs).min(context_len);
    let mut slots = Vec::with_capacity(context_len - first);
    for start in (first..context_len).step_by(bs) {
        let at = table
            .slot(start, bs)
            .ok_or_else(|| Error::InvalidBatch("context outside windowed table".into()))?
            .index();
        slots.extend(at..at + bs.min(context_len - start));
    }
    Ok(WindowContext { first, slots })
}

/// The slots (as row indices) of the first `context_len` positions of `table`, in position
/// order: a block's positions are consecutive slots, so this looks up each block once (no
/// division per position). `None` where the table does not cover them.
fn context_slots(table: &BlockTable, context_len: usize, block_size: usize) -> Option<Vec<usize>> {
    let bs = block_size.max(1);
    let mut slots = Vec::with_capacity(context_len);
    for start in (0..context_len).step_by(bs) {
        let first = table.slot(start, bs)?.index();
        let len = bs.min(context_len - start);
        slots.extend(first..first + len);
    }
    Some(slots)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvcache::BlockId;

    #[test]
    fn context_slots_are_each_positions_slot() {
        let mut batch = TreeBatch::new(4);
        let table = BlockTable::from_blocks(vec![BlockId(3), BlockId(1), BlockId(6)]);
        batch
            .push(10, &table, &TokenTree::chain(&[5]), LogitRows::All)
            .unwrap();
        let seq = &batch.seqs[0];
        let each: Vec<Slot> = (0..10)
            .map(|p| batch.context_slot(seq, p).unwrap())
            .collect();
        let indices: Vec<usize> = each.iter().map(|s| s.index()).collect();
        assert_eq!(seq.context_slots, indices);
        assert_eq!(each[4], Slot(4));
        assert_eq!(each[9], Slot(25));
    }

    #[test]
    fn rows_positions_and_slots_follow_the_diagram() {
        let mut batch = TreeBatch::new(4);
        let table_a = BlockTable::from_blocks(vec![BlockId(3), BlockId(1)]);
        let tree = TokenTree::new(vec![7, 8, 9], vec![None, Some(0), Some(0)]).unwrap();
        let rows_a = batch.push(5, &table_a, &tree, LogitRows::All).unwrap();
        let table_b = BlockTable::from_blocks(vec![BlockId(0)]);
        let rows_b = batch
            .push(
                0,
                &table_b,
                &TokenTree::chain(&[1, 2, 3, 4]),
                LogitRows::Last,
            )
            .unwrap();
        assert_eq!(rows_a, 0..3);
        assert_eq!(rows_b, 3..7);
        assert_eq!(batch.positions, vec![5, 6, 6, 0, 1, 2, 3]);
        // seq A: positions 5,6,7 -> block 1 (second entry) offsets 1,2,3 -> slots 5,6,7.
        let slots: Vec<u32> = batch.slots.iter().map(|s| s.0).collect();
        assert_eq!(slots, vec![5, 6, 7, 0, 1, 2, 3]);
        assert_eq!(batch.logit_rows, vec![0, 1, 2, 6]);
    }

    #[test]
    fn a_rows_ancestors_are_its_own_sequences() {
        let mut batch = TreeBatch::new(4);
        let table = BlockTable::from_blocks(vec![BlockId(3), BlockId(1), BlockId(2)]);
        let tree =
            TokenTree::new(vec![7, 8, 9, 10], vec![None, Some(0), Some(0), Some(2)]).unwrap();
        batch.push(5, &table, &tree, LogitRows::All).unwrap();
        let chain = TokenTree::chain(&[1, 2, 3]);
        batch
            .push(
                0,
                &BlockTable::from_blocks(vec![BlockId(0)]),
                &chain,
                LogitRows::All,
            )
            .unwrap();
        assert_eq!(batch.seq_of(3), 0);
        assert_eq!(batch.seq_of(4), 1);
        assert_eq!(batch.ancestor_tokens(0), [None, None]);
        assert_eq!(batch.ancestor_tokens(1), [None, Some(7)]);
        assert_eq!(batch.ancestor_tokens(2), [None, Some(7)]);
        assert_eq!(batch.ancestor_tokens(3), [Some(7), Some(9)]);
        // The chain's first row has none: the tree's rows are another sequence's.
        assert_eq!(batch.ancestor_tokens(4), [None, None]);
        assert_eq!(batch.ancestor_tokens(6), [Some(1), Some(2)]);
    }

    #[test]
    fn too_small_block_table_is_an_error() {
        let mut batch = TreeBatch::new(4);
        let table = BlockTable::from_blocks(vec![BlockId(0)]);
        let err = batch
            .push(3, &table, &TokenTree::chain(&[1, 2]), LogitRows::Last)
            .unwrap_err();
        assert!(err.to_string().contains("block table"), "{err}");
    }
}
