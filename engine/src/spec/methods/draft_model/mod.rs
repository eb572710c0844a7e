//! The draft-model drafter (SEED): a second, smaller model with the target's tokenizer
//! proposes a tree bounded by a `k_config` such as (4, 2, 1, 1): up to the 4 most likely
//! tokens after the pending one, the 2 most likely after each of those, then 1 after each.
//! Of that tree a sequence keeps only the nodes its budget buys, the paths the draft model
//! finds most likely ([`LikelyTree`]): a chain where it is sure, siblings where it is not.
//!
//! [`DraftModelRunner`] holds the draft model and its own paged KV cache and works for all
//! sequences that use it at once: one forward catches every sequence's draft KV up with its
//! known tokens, then one forward per tree depth expands every sequence's kept nodes
//! together, until no new node is worth expanding. Each depth re-feeds the partial tree
//! under the pending token (scratch rows past the sequence's tokens, dropped afterwards), so
//! a node always sees exactly its ancestors. The runner times its forwards, catch-ups of a
//! prompt or of tokens decoded without drafting left out, and the planner charges a tree
//! one forward per depth it may reach.
//! [`DraftModelSpeculator`] is the method's speculator around the runner; the per-sequence
//! [`DraftModelDrafter`] only says how many nodes a tree can have.
//!
//! Drafted tokens are the draft model's top candidates, chosen deterministically, so
//! verification treats them as point masses: the sample-and-match rule in `verify` is
//! lossless for them (see there).

use std::collections::HashMap;
use std::time::Instant;

use kvcache::{BlockManager, ManagerConfig, SeqId};

pub mod likely_tree;

use likely_tree::LikelyTree;

use crate::backend::{self, Backend};
use crate::model::Model;
use crate::spec::speculator::{Granted, Speculator};
use crate::spec::stats::smooth;
use crate::spec::{Candidates, DraftContext, Drafter, NewSequence, SpecMethod};
use crate::tree::TokenTree;
use crate::tree_batch::{LogitRows, TreeBatch};
use crate::Result;

/// The draft model (through its backend, which holds its KV rows), its KV blocks, and the
/// trees it prepared this step.
pub struct DraftModelRunner {
    backend: Box<dyn Backend>,
    blocks: BlockManager,
    k_config: Vec<usize>,
    prepared: HashMap<SeqId, Candidates>,
    /// Seconds per drafting sequence of one of its forwards, one-off catch-ups left out
    /// (moving average).
    seconds_per_forward: Option<f64>,
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

/// Indices of the `k` largest values of `row`, largest first (ties to the lower index).
fn top_k(row: &[f32], k: usize) -> Vec<u32> {
    let mut best = vec![0; k.min(row.len())];
    crate::spec::top_k_into(row, &mut best);
    best
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
            seconds_per_forward: None,
        })
    }

    /// Has the OS map the draft model's KV pool now ([`Backend::prefault_kv`]).
    pub fn prefault_kv(&mut self) {
        self.backend.prefault_kv();
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

    /// Seconds of draft forwards a tree of `nodes` nodes costs a drafting sequence per
    /// step, once caught up: one forward per depth, counted as if the tree were a chain
    /// (as deep as it can be), since its shape is only known once drafted.
    pub fn draft_seconds(&self, nodes: usize) -> Option<f64> {
        let depth = nodes.min(self.k_config.len());
        self.seconds_per_forward.map(|s| s * depth as f64)
    }

    /// Records a step's forwards: a catch-up of `caught_up_rows` rows that took `catch_up`
    /// seconds and `expansions` forwards that took `expanding`, for `live` sequences. A
    /// catch-up of more rows than a step can leave behind (the pending token and a whole
    /// accepted path, per sequence) is a one-off; a recurring one is counted at what an
    /// expansion forward took, and without one the step is not recorded.
    fn time_step(
        &mut self,
        live: usize,
        caught_up_rows: usize,
        catch_up: f64,
        expanding: f64,
        expansions: usize,
    ) {
        let recurring = live * (self.k_config.len() + 2);
        let catch_up = if caught_up_rows <= recurring {
            catch_up
        } else if expansions > 0 {
            expanding / expansions as f64
        } else {
            return;
        };
        let forwards = (1 + expansions) * live.max(1);
        smooth(
            &mut self.seconds_per_forward,
            (catch_up + expanding) / forwards as f64,
        );
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
    pub fn prepare(&mut self, items: &[Granted<'_>]) -> Result<()> {
        self.prepared.clear();
        let scratch = self.max_nodes() + 1;
        let bs = self.blocks.block_size();
        // Catch every sequence's draft KV up with its known tokens.
        let mut batch = TreeBatch::new(bs);
        let mut live: Vec<(SeqId, &[u32], usize)> = Vec::new();
        let mut caught_up_rows = 0;
        for &Granted {
            seq,
            tokens,
            budget,
            cache_scope,
        } in items
        {
            if budget == 0 || tokens.is_empty() {
                continue;
            }
            if !self.blocks.contains(seq)
                && self
                    .blocks
                    .admit(seq, tokens, tokens.len() + scratch, cache_scope)?
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
            caught_up_rows += tokens.len() - computed;
            live.push((seq, tokens, budget));
        }
        if live.is_empty() {
            return Ok(());
        }
        let started = Instant::now();
        let rows = self.backend.forward(&batch)?;
        let catch_up = started.elapsed().as_secs_f64();
        // Per sequence: its tree and its frontier (new nodes with their logits rows).
        let mut trees = vec![LikelyTree::new(); live.len()];
        let mut frontiers: Vec<Vec<(Option<usize>, Vec<f32>)>> = Vec::with_capacity(live.len());
        for (&(seq, tokens, _), row) in live.iter().zip(rows) {
            self.blocks.commit(seq, tokens)?;
            frontiers.push(vec![(None, row)]);
        }
        let (mut expanding, mut expansions) = (0.0, 0);
        for (depth, &k) in self.k_config.iter().enumerate() {
            let mut grown: Vec<Vec<usize>> = Vec::with_capacity(live.len());
            for ((tree, frontier), &(_, _, budget)) in
                trees.iter_mut().zip(&mut frontiers).zip(&live)
            {
                let first_new = tree.len();
                for (parent, row) in frontier.drain(..) {
                    tree.grow(parent, &row, &top_k(&row, k));
                }
                grown.push(tree.keep_most_likely(budget, first_new));
            }
            if depth + 1 == self.k_config.len() || grown.iter().all(Vec::is_empty) {
                break;
            }
            // One forward over every sequence's kept tree; the rows of its new nodes seed
            // the next depth.
            let mut batch = TreeBatch::new(bs);
            let mut starts = Vec::with_capacity(live.len());
            for ((&(seq, tokens, _), tree), added) in live.iter().zip(&trees).zip(&grown) {
                if added.is_empty() {
                    starts.push(None);
                    continue;
                }
                let table = self
                    .blocks
                    .block_table(seq)
                    .ok_or(kvcache::KvError::UnknownSeq(seq))?;
                let pending = tokens[tokens.len() - 1];
                let rows =
                    batch.push(tokens.len() - 1, table, &tree.tree(pending), LogitRows::All)?;
                starts.push(Some(rows.start));
            }
            let started = Instant::now();
            let mut logits = self.backend.forward(&batch)?;
            expanding += started.elapsed().as_secs_f64();
            expansions += 1;
            for ((frontier, added), start) in frontiers.iter_mut().zip(&grown).zip(&starts) {
                if let Some(start) = start {
                    // Node `i` is tree row `i + 1`.
                    frontier.extend(
                        added
                            .iter()
                            .map(|&i| (Some(i), std::mem::take(&mut logits[start + i + 1]))),
                    );
                }
            }
        }
        for (&(seq, _, _), tree) in live.iter().zip(&trees) {
            self.prepared.insert(seq, tree.candidates());
        }
        self.time_step(live.len(), caught_up_rows, catch_up, expanding, expansions);
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

    fn drafter(&self, _seq: &NewSequence<'_>) -> Option<Box<dyn Drafter>> {
        Some(Box::new(DraftModelDrafter::new(self.runner.max_nodes())))
    }

    fn draft_seconds(&self, nodes: usize) -> Option<f64> {
        self.runner.draft_seconds(nodes)
    }

    fn prefault_kv(&mut self) {
        self.runner.prefault_kv();
    }

    fn prepare(&mut self, granted: &[Granted<'_>]) -> Result<()> {
        self.runner.prepare(granted)
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_is_sorted_and_bounded() {
        assert_eq!(top_k(&[0.1, 0.9, 0.5, 0.7], 2), vec![1, 3]);
        assert_eq!(top_k(&[0.1], 3), vec![0]);
        assert!(top_k(&[0.1], 0).is_empty());
        // Ties go to the lower index; a NaN ranks above every number (`total_cmp`).
        assert_eq!(top_k(&[0.5, 0.7, 0.5, 0.7, 0.1], 3), vec![1, 3, 0]);
        assert_eq!(top_k(&[0.5, f32::NAN, 0.9], 2), vec![1, 2]);
        // Against a sort, on a long row.
        let row: Vec<f32> = (0..5000u32).map(|i| ((i * 7919) % 4099) as f32).collect();
        let mut sorted: Vec<u32> = (0..5000).collect();
        sorted.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b)));
        assert_eq!(top_k(&row, 4), sorted[..4].to_vec());
    }
}
