//! A batch cut to the rows whose logits it returns, for the layers at the end of a model that
//! write no keys, values or state of their own (Gemma 4's layers reading earlier layers' keys
//! and values): past the last layer that writes, a row whose logits nobody asked for changes
//! nothing, so those layers run only for the rows that give logits. A prefill chunk that ends
//! its prompt keeps its last row, the rows before it becoming its context (their keys and
//! values are in the store by then, and the kernels give a row the same bits whether its keys
//! are context or rows of the batch); a chunk that ends none is dropped; a sequence whose
//! logits are wanted elsewhere (a draft tree) is kept whole.

use crate::tree::TreeMask;
use crate::tree_batch::{LogitRows, SeqEntry, TreeBatch, WindowContext};

impl TreeBatch {
    /// The batch cut to its logit rows, with the row of this batch each of its rows is; `None`
    /// where it would keep every row.
    pub fn cut_to_logit_rows(&self) -> Option<(TreeBatch, Vec<usize>)> {
        if self.logit_rows.len() == self.num_rows() {
            return None;
        }
        let mut cut = TreeBatch {
            block_size: self.block_size,
            ..TreeBatch::default()
        };
        let mut kept = Vec::new();
        let own_space = !self.window_slots.is_empty();
        for seq in &self.seqs {
            let wanted = seq
                .rows
                .clone()
                .filter(|r| self.logit_rows.contains(r))
                .count();
            let last = seq.rows.end - 1;
            let (from, keep) = match wanted {
                0 => continue,
                1 if seq.mask.is_chain() && self.logit_rows.contains(&last) => {
                    (last, LogitRows::Last)
                }
                _ => (seq.rows.start, LogitRows::All),
            };
            let before = from - seq.rows.start;
            let start = cut.token_ids.len();
            for r in from..seq.rows.end {
                cut.token_ids.push(self.token_ids[r]);
                cut.positions.push(self.positions[r]);
                cut.slots.push(self.slots[r]);
                if own_space {
                    cut.window_slots.push(self.window_slots[r]);
                }
                kept.push(r);
            }
            let rows = start..cut.token_ids.len();
            let mut context_slots = seq.context_slots.clone();
            context_slots.extend(self.slots[seq.rows.start..from].iter().map(|s| s.index()));
            let window_context = seq.window_context.as_ref().map(|held| {
                let mut slots = held.slots.clone();
                slots.extend(
                    self.window_slots[seq.rows.start..from]
                        .iter()
                        .map(|s| s.index()),
                );
                WindowContext {
                    first: held.first,
                    slots,
                }
            });
            cut.seqs.push(SeqEntry {
                context_len: seq.context_len + before,
                block_table: seq.block_table.clone(),
                rows: rows.clone(),
                mask: match keep {
                    LogitRows::All => seq.mask.clone(),
                    _ => TreeMask::causal(1),
                },
                context_slots,
                window_context,
                state: None,
            });
        }
        // The logits in the order the batch asks for them.
        cut.logit_rows = self
            .logit_rows
            .iter()
            .filter_map(|r| kept.binary_search(r).ok())
            .collect();
        // Every logit row is kept, in order: the same positions of it return states.
        cut.hidden_outputs = self.hidden_outputs.clone();
        Some((cut, kept))
    }
}

#[cfg(test)]
mod tests {
    use kvcache::{BlockPool, BlockTable};

    use super::*;
    use crate::tree::TokenTree;

    #[test]
    fn a_prompt_chunk_keeps_its_last_row_and_a_tree_stays_whole() {
        let bs = 4;
        let mut pool = BlockPool::new(8, bs);
        let tables: Vec<BlockTable> = (0..3)
            .map(|_| {
                let mut t = BlockTable::new();
                assert!(t.ensure_capacity(8, &mut pool));
                t
            })
            .collect();
        let mut batch = TreeBatch::new(bs);
        // A chunk ending its prompt, a chunk ending none, a tree of three.
        batch
            .push(
                2,
                &tables[0],
                &TokenTree::chain(&[1, 2, 3]),
                LogitRows::Last,
            )
            .unwrap();
        batch
            .push(0, &tables[1], &TokenTree::chain(&[4, 5]), LogitRows::None)
            .unwrap();
        let tree = TokenTree::chain(&[6, 7, 8]);
        batch.push(1, &tables[2], &tree, LogitRows::All).unwrap();
        let (cut, kept) = batch.cut_to_logit_rows().unwrap();
        assert_eq!(kept, [2, 5, 6, 7]);
        assert_eq!(cut.token_ids, [3, 6, 7, 8]);
        assert_eq!(cut.positions, [4, 1, 2, 3]);
        assert_eq!(cut.logit_rows, [0, 1, 2, 3]);
        assert_eq!(cut.seqs.len(), 2);
        let chunk = &cut.seqs[0];
        assert_eq!((chunk.context_len, chunk.rows.clone()), (4, 0..1));
        let slots: Vec<usize> = batch.slots[..2].iter().map(|s| s.index()).collect();
        assert_eq!(chunk.context_slots[2..], slots);
        assert_eq!(cut.seqs[1].context_len, 1);
        assert_eq!(cut.seqs[1].rows, 1..4);
        // Every row wanted: nothing to cut.
        let mut whole = TreeBatch::new(bs);
        whole
            .push(0, &tables[0], &TokenTree::chain(&[1, 2]), LogitRows::All)
            .unwrap();
        assert!(whole.cut_to_logit_rows().is_none());
    }
}
