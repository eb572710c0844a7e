//! The draft-model drafter (SEED): a second, smaller model with the target's tokenizer
//! proposes a tree shaped by a `k_config` such as (4, 2, 1, 1): the 4 most likely tokens
//! after the pending one, the 2 most likely after each of those, then 1 after each.
//!
//! [`DraftModelRunner`] holds the draft model and its own paged KV cache and works for all
//! sequences that use it at once: one forward catches every sequence's draft KV up with its
//! known tokens, then one forward per tree depth expands every sequence's tree together.
//! Each depth re-feeds the partial tree under the pending token (scratch rows past the
//! sequence's tokens, dropped afterwards), so a node always sees exactly its ancestors.
//! [`DraftModelSpeculator`] is the method's speculator around the runner; the per-sequence
//! [`DraftModelDrafter`] only says how many nodes a tree can have.
//!
//! Drafted tokens are the draft model's top candidates, chosen deterministically, so
//! verification treats them as point masses: the sample-and-match rule in `verify` is
//! lossless for them (see there).

use std::collections::HashMap;

use kvcache::{BlockManager, ManagerConfig, SeqId};

use super::speculator::{Granted, Speculator};
use super::{Candidates, DraftContext, Drafter, SpecMethod};
use crate::backend::{self, Backend};
use crate::batch::{LogitRows, TreeBatch};
use crate::model::Model;
use crate::tree::TokenTree;
use crate::Result;

/// The draft model (through its backend, which holds its KV rows), its KV blocks, and the
/// trees it prepared this step.
pub struct DraftModelRunner {
    backend: Box<dyn Backend>,
    blocks: BlockManager,
    k_config: Vec<usize>,
    prepared: HashMap<SeqId, Candidates>,
}

impl std::fmt::Debug for DraftModelRunner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DraftModelRunner")
            .field("backend", &self.backend.describe())
            .field("k_config", &self.k_config)
            .field("kv", &self.blocks.stats())
            .finish()
    }
}

/// Indices of the `k` largest values of `row`, largest first.
fn top_k(row: &[f32], k: usize) -> Vec<u32> {
    let mut indexed: Vec<(u32, f32)> = row
        .iter()
        .enumerate()
        .map(|(i, &l)| (i as u32, l))
        .collect();
    let desc = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    let k = k.min(indexed.len());
    if k == 0 {
        return Vec::new();
    }
    indexed.select_nth_unstable_by(k - 1, desc);
    indexed.truncate(k);
    indexed.sort_unstable_by(desc);
    indexed.into_iter().map(|(t, _)| t).collect()
}

impl DraftModelRunner {
    /// A runner for `model` with a KV pool of `kv` and trees shaped by `k_config`.
    pub fn new(model: Model, kv: ManagerConfig, k_config: Vec<usize>) -> Result<Self> {
        let blocks = BlockManager::new(kv);
        let backend = backend::for_model(model, blocks.num_slots())?;
        Ok(Self {
            backend,
            blocks,
            k_config,
            prepared: HashMap::new(),
        })
    }

    /// Most nodes a tree of this `k_config` has.
    pub fn max_nodes(&self) -> usize {
        let mut width = 1;
        let mut total = 0;
        for &k in &self.k_config {
            width *= k;
            total += width;
        }
        total
    }

    /// The tree prepared for `seq` this step.
    pub fn prepared(&self, seq: SeqId) -> Option<&Candidates> {
        self.prepared.get(&seq)
    }

    /// Drops `seq`'s draft KV.
    pub fn release(&mut self, seq: SeqId) {
        if self.blocks.contains(seq) {
            let _ = self.blocks.release(seq);
        }
        self.prepared.remove(&seq);
    }

    /// Prepares a tree of at most `budget` nodes for every `(seq, known tokens, budget)`.
    /// A sequence whose draft KV does not fit gets no tree (it decodes plainly).
    pub fn prepare(&mut self, items: &[(SeqId, &[u32], usize)]) -> Result<()> {
        self.prepared.clear();
        let scratch = self.max_nodes() + 1;
        let bs = self.blocks.block_size();
        // Catch every sequence's draft KV up with its known tokens.
        let mut batch = TreeBatch::new(bs);
        let mut live: Vec<(SeqId, &[u32], usize)> = Vec::new();
        for &(seq, tokens, budget) in items {
            if budget == 0 || tokens.is_empty() {
                continue;
            }
            if !self.blocks.contains(seq)
                && self
                    .blocks
                    .admit(seq, tokens, tokens.len() + scratch)?
                    .is_none()
            {
                continue;
            }
            // Re-feed at least the pending token: its row gives the first candidates.
            let computed = self.blocks.seq_len(seq).unwrap_or(0).min(tokens.len() - 1);
            self.blocks.truncate(seq, computed)?;
            if self
                .blocks
                .ensure_capacity(seq, tokens.len() + scratch)?
                .is_none()
            {
                self.release(seq);
                continue;
            }
            let table = self
                .blocks
                .block_table(seq)
                .ok_or(kvcache::KvError::UnknownSeq(seq))?;
            batch.push(
                computed,
                table,
                &TokenTree::chain(&tokens[computed..]),
                LogitRows::Last,
            )?;
            live.push((seq, tokens, budget));
        }
        if live.is_empty() {
            return Ok(());
        }
        let rows = self.backend.forward(&batch)?;
        // Frontier per sequence: (candidate index or root, logits row).
        let mut frontiers: Vec<Vec<(Option<usize>, Vec<f32>)>> = Vec::with_capacity(live.len());
        for (&(seq, tokens, _), row) in live.iter().zip(rows) {
            self.blocks.commit(seq, tokens)?;
            self.prepared.insert(seq, Candidates::new());
            frontiers.push(vec![(None, row)]);
        }
        for (depth, &k) in self.k_config.iter().enumerate() {
            let mut grown: Vec<Vec<usize>> = Vec::with_capacity(live.len());
            for ((seq, _, budget), frontier) in live.iter().zip(&frontiers) {
                let candidates = self.prepared.get_mut(seq).expect("inserted above");
                let mut added = Vec::new();
                'nodes: for (parent, row) in frontier {
                    for token in top_k(row, k) {
                        if candidates.len() >= *budget {
                            break 'nodes;
                        }
                        added.push(candidates.push(*parent, token));
                    }
                }
                grown.push(added);
            }
            if depth + 1 == self.k_config.len() || grown.iter().all(Vec::is_empty) {
                break;
            }
            // One forward over every sequence's partial tree; the new nodes' rows seed the
            // next depth.
            let mut batch = TreeBatch::new(bs);
            let mut ranges = Vec::new();
            for (&(seq, tokens, _), added) in live.iter().zip(&grown) {
                if added.is_empty() {
                    ranges.push(None);
                    continue;
                }
                let candidates = &self.prepared[&seq];
                let pending = tokens[tokens.len() - 1];
                let tree = candidates.tree(pending, candidates.len());
                let table = self
                    .blocks
                    .block_table(seq)
                    .ok_or(kvcache::KvError::UnknownSeq(seq))?;
                let rows = batch.push(tokens.len() - 1, table, &tree, LogitRows::All)?;
                ranges.push(Some(rows.start));
            }
            let logits = self.backend.forward(&batch)?;
            for ((frontier, added), start) in frontiers.iter_mut().zip(&grown).zip(&ranges) {
                frontier.clear();
                if let Some(start) = start {
                    for &node in added {
                        // Row of candidate `node` is tree node `node + 1`.
                        frontier.push((Some(node), logits[start + node + 1].clone()));
                    }
                }
            }
        }
        // The scratch rows are dropped; only the known tokens' KV stays.
        for &(seq, tokens, _) in &live {
            self.blocks.truncate(seq, tokens.len())?;
        }
        Ok(())
    }
}

/// The draft model's speculator: the runner prepares every granted sequence's tree in
/// batched forwards, then hands each one out.
#[derive(Debug)]
pub struct DraftModelSpeculator {
    runner: DraftModelRunner,
}

impl DraftModelSpeculator {
    /// The speculator around `runner`.
    pub fn new(runner: DraftModelRunner) -> Self {
        Self { runner }
    }
}

impl Speculator for DraftModelSpeculator {
    fn method(&self) -> SpecMethod {
        SpecMethod::DraftModel
    }

    fn drafter(&self, _tokens: &[u32]) -> Option<Box<dyn Drafter>> {
        Some(Box::new(DraftModelDrafter::new(self.runner.max_nodes())))
    }

    fn prepares(&self) -> bool {
        true
    }

    fn prepare(&mut self, granted: &[Granted<'_>]) -> Result<()> {
        let items: Vec<(SeqId, &[u32], usize)> = granted
            .iter()
            .map(|g| (g.seq, g.tokens, g.budget))
            .collect();
        self.runner.prepare(&items)
    }

    fn draft(
        &mut self,
        seq: SeqId,
        ctx: &DraftContext<'_>,
        budget: usize,
        _drafter: &mut dyn Drafter,
    ) -> TokenTree {
        let pending = ctx.tokens.last().copied().unwrap_or(0);
        match self.runner.prepared(seq) {
            Some(candidates) => candidates.tree(pending, budget),
            None => TokenTree::chain(&[pending]),
        }
    }

    fn release(&mut self, seq: SeqId) {
        self.runner.release(seq);
    }
}

/// A sequence's draft-model drafter: its trees come from the speculator's runner.
#[derive(Debug, Clone, Default)]
pub struct DraftModelDrafter {
    max_nodes: usize,
}

impl DraftModelDrafter {
    /// A drafter whose trees have at most `max_nodes` nodes.
    pub fn new(max_nodes: usize) -> Self {
        Self { max_nodes }
    }
}

impl Drafter for DraftModelDrafter {
    fn method(&self) -> SpecMethod {
        SpecMethod::DraftModel
    }

    fn prepare(&mut self, _ctx: &DraftContext<'_>) -> usize {
        self.max_nodes
    }

    fn draft(&mut self, ctx: &DraftContext<'_>, _budget: usize) -> TokenTree {
        // Only the runner has trees; without it the pending token goes alone.
        TokenTree::chain(&[ctx.tokens.last().copied().unwrap_or(0)])
    }

    fn observe(&mut self, _tokens: &[u32], _appended: usize) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_is_sorted_and_bounded() {
        assert_eq!(top_k(&[0.1, 0.9, 0.5, 0.7], 2), vec![1, 3]);
        assert_eq!(top_k(&[0.1], 3), vec![0]);
        assert!(top_k(&[0.1], 0).is_empty());
    }
}
