//! The batch stage's last part: every scheduled sequence's rows in ONE `TreeBatch` (a prefill
//! chunk or a plain decode as a chain, a draft tree whole), the prompt rows whose logits the
//! speculators may learn from, and, per sequence of the batch, what the speculators read
//! beside each computed row (its cache-salt scope, its last tokens before its rows).

use kvcache::BlockHash;
use scheduler::ScheduledSeq;

use super::states::{Planned, Step};
use super::{missing, Engine};
use crate::metrics as names;
use crate::request::Pooling;
use crate::spec::speculator::Before;
use crate::tree::TokenTree;
use crate::tree_batch::{LogitRows, StateSave, TreeBatch};
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
        plans: &[Option<Planned>],
    ) -> Result<StepBatch> {
        let mut batch = TreeBatch::new(self.scheduler.blocks().block_size());
        let mut prompt_rows = Vec::new();
        let mut scopes = Vec::with_capacity(scheduled.len());
        let mut tails = Vec::with_capacity(scheduled.len());
        for ((s, tree), plan) in scheduled.iter().zip(trees).zip(plans) {
            let seq = self.scheduler.seq(s.seq).ok_or_else(|| missing(s.seq))?;
            scopes.push(seq.cache_scope());
            tails.push(Before::new(&seq.tokens()[..s.num_computed]));
            let table = self
                .scheduler
                .block_table(s.seq)
                .ok_or_else(|| missing(s.seq))?;
            let window = self.scheduler.window_table(s.seq);
            if let Some(tree) = tree {
                batch.push_windowed(s.num_computed, table, window, tree, LogitRows::All)?;
            } else {
                let fed = &seq.tokens()[s.num_computed..s.num_computed + s.num_new_tokens];
                let pooled = self
                    .request_of(s.seq)
                    .and_then(|r| r.request.pooling.as_ref());
                let rows = match (s.samples, pooled) {
                    (false, _) => LogitRows::None,
                    (true, Some(Pooling::State)) => LogitRows::Hidden,
                    (true, _) => LogitRows::Last,
                };
                let chain = TokenTree::chain(fed);
                let pushed = batch.push_windowed(s.num_computed, table, window, &chain, rows)?;
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
            if let Some(plan) = plan {
                let at = batch.seqs.len() - 1;
                batch.set_state(at, plan.state)?;
                batch
                    .state_saves
                    .extend(plan.saves.iter().map(|&(folded, slot, _)| StateSave {
                        seq: at,
                        folded,
                        slot,
                    }));
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

    /// Each scheduled sequence's recurrent state for the step (none for a model without
    /// recurrent layers): its slot, the snapshot it resumes from, the snapshots it takes.
    pub(super) fn plan_states(
        &mut self,
        scheduled: &[ScheduledSeq],
        trees: &[Option<TokenTree>],
    ) -> Result<Vec<Option<Planned>>> {
        let mut plans: Vec<Option<Planned>> = Vec::with_capacity(scheduled.len());
        for (s, tree) in scheduled.iter().zip(trees) {
            let seq = self.scheduler.seq(s.seq).ok_or_else(|| missing(s.seq))?;
            let step = Step {
                tokens: seq.tokens(),
                scope: seq.cache_scope(),
                num_computed: s.num_computed,
                rows: tree.as_ref().map_or(s.num_new_tokens, TokenTree::len),
                commits: tree.is_none(),
                prompt_len: seq.num_prompt_tokens(),
            };
            match self.states.plan(s.seq, &step) {
                Ok(plan) => plans.push(plan),
                Err(e) => {
                    for plan in plans.into_iter().flatten() {
                        self.states.abandon(plan);
                    }
                    return Err(e);
                }
            }
        }
        Ok(plans)
    }

    /// The step planned in `plans` for `scheduled` ran (`ran`) or did not: the states it
    /// moved and the snapshots it took are recorded, and the block manager told where
    /// cached prefixes may now end.
    pub(super) fn record_states(
        &mut self,
        scheduled: &[ScheduledSeq],
        plans: Vec<Option<Planned>>,
        ran: bool,
    ) {
        for (s, plan) in scheduled.iter().zip(plans) {
            let Some(plan) = plan else { continue };
            if !ran {
                self.states.abandon(plan);
                continue;
            }
            let changes = self.states.ran(s.seq, plan);
            let mut points = self.scheduler.resume_points();
            for hash in changes.added {
                points.add(hash);
            }
            for hash in changes.removed {
                points.remove(hash);
            }
        }
    }
}
