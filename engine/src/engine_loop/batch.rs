//! The batch stage's last part: every scheduled sequence's rows in ONE `TreeBatch` (a prefill
//! chunk or a plain decode as a chain, a draft tree whole), the prompt rows whose logits the
//! speculators may learn from, and, per sequence of the batch, what the speculators read
//! beside each computed row (its cache-salt scope, its last tokens before its rows).

use kvcache::BlockHash;
use scheduler::ScheduledSeq;

use super::{missing, Engine};
use crate::metrics as names;
use crate::spec::speculator::Before;
use crate::tree::TokenTree;
use crate::tree_batch::{LogitRows, SeqState, TreeBatch};
use crate::Result;

/// A step's batch, with what the speculators read beside its computed rows.
pub(super) struct StepBatch {
    /// The rows the forward runs.
    pub(super) batch: TreeBatch,
    /// Each of the batch's sequences' cache-salt scope, in the batch's order.
    pub(super) scopes: Vec<Option<BlockHash>>,
    /// Each of the batch's sequences' last tokens before its rows, in the batch's order.
    pub(super) tails: Vec<Before>,
}

impl Engine {
    /// The batch of `scheduled` (`trees[i]`, where granted, is `scheduled[i]`'s draft tree):
    /// a tree's rows all get logits, a chain's only its sampled last row, and the prompt rows
    /// speculators may learn from, where the cost curve says their rows of the output
    /// projection are cheap, after every sampled row. Records each sequence's queue time on
    /// its first step since admission.
    pub(super) fn assemble_batch(
        &self,
        scheduled: &[ScheduledSeq],
        trees: &[Option<TokenTree>],
    ) -> Result<StepBatch> {
        let mut batch = TreeBatch::new(self.scheduler.blocks().block_size());
        let mut prompt_rows = Vec::new();
        let mut scopes = Vec::with_capacity(scheduled.len());
        let mut tails = Vec::with_capacity(scheduled.len());
        for (s, tree) in scheduled.iter().zip(trees) {
            let seq = self.scheduler.seq(s.seq).ok_or_else(|| missing(s.seq))?;
            scopes.push(seq.cache_scope());
            tails.push(Before::new(&seq.tokens()[..s.num_computed]));
            let table = self
                .scheduler
                .block_table(s.seq)
                .ok_or_else(|| missing(s.seq))?;
            let window = self.scheduler.window_table(s.seq);
            let state = self.states.of(s.seq);
            if let Some(tree) = tree {
                batch.push_windowed(s.num_computed, table, window, tree, LogitRows::All)?;
                if let Some(slot) = state {
                    let last = batch.seqs.len() - 1;
                    batch.set_state(
                        last,
                        SeqState {
                            slot,
                            commits: false,
                        },
                    )?;
                }
            } else {
                let fed = &seq.tokens()[s.num_computed..s.num_computed + s.num_new_tokens];
                let rows = if s.samples {
                    LogitRows::Last
                } else {
                    LogitRows::None
                };
                let chain = TokenTree::chain(fed);
                let pushed = batch.push_windowed(s.num_computed, table, window, &chain, rows)?;
                if let Some(slot) = state {
                    // A chain's tokens are the sequence's own: kept whatever is sampled.
                    let last = batch.seqs.len() - 1;
                    batch.set_state(
                        last,
                        SeqState {
                            slot,
                            commits: true,
                        },
                    )?;
                }
                if let Some(drafter) = self.records.get(&s.seq).and_then(|r| r.drafter.as_ref()) {
                    // A sampled row's logits are computed (and observed) anyway.
                    let unsampled = fed.len() - usize::from(s.samples);
                    prompt_rows.extend(
                        pushed
                            .zip(fed)
                            .take(unsampled)
                            .map(|(row, &token)| (row, token, drafter)),
                    );
                }
            }
            if s.first_since_admission && seq.num_preemptions() == 0 {
                if let Some(request) = self.request_of(s.seq) {
                    metrics::histogram!(names::QUEUE_TIME)
                        .record(request.submitted.elapsed().as_secs_f64());
                }
            }
        }
        for row in self.spec.learning_rows(&prompt_rows, batch.num_rows()) {
            batch.request_logits(row)?;
        }
        Ok(StepBatch {
            batch,
            scopes,
            tails,
        })
    }
}
