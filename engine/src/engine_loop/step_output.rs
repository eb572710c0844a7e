//! The step after the forward, as data. `decide` reads the logits and writes a
//! [`StepOutput`]: for every scheduled sequence what its rows decided (nothing for prompt
//! rows, the sampled tokens for a plain row and its owed forks, the accepted path of a
//! verified draft tree), changing no state. `update` then applies it: scheduler commits and
//! the KV moves of accepted paths, forks for `n > 1`, what the drafters learn. What comes
//! out is the tokens each sequence emits, in order, for the emit stage.

use kvcache::SeqId;
use scheduler::{Progress, ScheduledSeq};

use super::constrain::Masks;
use super::record::SeqRecord;
use super::{missing, Engine};
use crate::constraint::TokenMask;
use crate::request::{Failure, Pooling};
use crate::sampler::Sampled;
use crate::spec::verify::{verify, Verified};
use crate::tree::TokenTree;
use crate::Result;

/// What one scheduled sequence's rows decided.
pub(super) enum SeqOutcome {
    /// Prompt rows only: nothing sampled.
    Prefilled,
    /// One row sampled: the sequence's token, then one for each fork it is owed.
    Sampled(Vec<Sampled>),
    /// A draft tree verified against its rows.
    Verified {
        /// The tree fed.
        tree: TokenTree,
        /// Its accepted path and the tokens it gives.
        verified: Verified,
        /// Whether the tree was the format's forced tokens (not its drafter's).
        forced: bool,
    },
    /// A pooling request's last prompt row: what it asked for.
    Pooled(Vec<f32>),
    /// The sequence left the engine before its rows came back.
    Gone,
}

/// One step's outcomes, in the order the sequences were scheduled.
pub(super) struct StepOutput {
    pub(super) outcomes: Vec<SeqOutcome>,
}

/// Tokens each sequence emits, in order.
pub(super) type Emissions = Vec<(SeqId, Vec<Sampled>)>;

impl Engine {
    /// Reads every scheduled sequence's logits (`trees[i]` is sequence i's draft tree,
    /// `None` for a chain; `masks` the allowed tokens of constrained sequences); changes no
    /// state.
    pub(super) fn decide(
        &self,
        scheduled: &[ScheduledSeq],
        trees: Vec<Option<TokenTree>>,
        logits: Vec<Vec<f32>>,
        masks: &Masks,
    ) -> Result<StepOutput> {
        let mut rows = logits.into_iter();
        let mut outcomes = Vec::with_capacity(scheduled.len());
        for (s, tree) in scheduled.iter().zip(trees) {
            if !s.samples {
                outcomes.push(SeqOutcome::Prefilled);
                continue;
            }
            let outcome = match tree {
                Some(tree) => {
                    let tree_rows: Vec<Vec<f32>> = rows.by_ref().take(tree.len()).collect();
                    if tree_rows.len() != tree.len() {
                        return Err(missing(s.seq));
                    }
                    // Its request failed during the forward (its format's masks did).
                    if !self.records.contains_key(&s.seq) {
                        outcomes.push(SeqOutcome::Gone);
                        continue;
                    }
                    let seq_masks = masks.get(&s.seq);
                    let verified =
                        self.verify_tree(s.seq, &tree, &tree_rows, seq_masks.map(|m| &m.rows))?;
                    SeqOutcome::Verified {
                        tree,
                        verified,
                        forced: seq_masks.is_some_and(|m| m.forced),
                    }
                }
                None => match self.pooling_of(s.seq) {
                    Some(Pooling::Logits(ids)) => {
                        let row = rows.next().ok_or_else(|| missing(s.seq))?;
                        SeqOutcome::Pooled(
                            ids.iter()
                                .map(|&t| row.get(t as usize).copied().unwrap_or(f32::NAN))
                                .collect(),
                        )
                    }
                    Some(Pooling::State) => {
                        SeqOutcome::Pooled(rows.next().ok_or_else(|| missing(s.seq))?)
                    }
                    None => {
                        let row = rows.next().ok_or_else(|| missing(s.seq))?;
                        let mask = masks.get(&s.seq).and_then(|m| m.rows.first());
                        match self.sample_row(s.seq, &row, mask)? {
                            Some(drawn) => SeqOutcome::Sampled(drawn),
                            None => SeqOutcome::Gone,
                        }
                    }
                },
            };
            outcomes.push(outcome);
        }
        Ok(StepOutput { outcomes })
    }

    /// The model's own choices along `seq_id`'s draft tree.
    fn verify_tree(
        &self,
        seq_id: SeqId,
        tree: &TokenTree,
        rows: &[Vec<f32>],
        masks: Option<&Vec<TokenMask>>,
    ) -> Result<Verified> {
        let output = self.seq(seq_id)?.output().to_vec();
        let mut failed = false;
        let verified = verify(tree, |node, produced| {
            let mut so_far = output.clone();
            so_far.extend_from_slice(produced);
            let mask = masks.and_then(|m| m.get(node));
            self.choose(seq_id, 0, &rows[node], &so_far, mask)
                .unwrap_or_else(|| {
                    failed = true;
                    Sampled {
                        token_id: 0,
                        logprob: None,
                    }
                })
        });
        if failed {
            return Err(missing(seq_id));
        }
        Ok(verified)
    }

    /// The sequence's token from `row`, then one for each fork it is owed; `None` when the
    /// sequence has no record any more.
    fn sample_row(
        &self,
        seq_id: SeqId,
        row: &[f32],
        mask: Option<&TokenMask>,
    ) -> Result<Option<Vec<Sampled>>> {
        if !self.records.contains_key(&seq_id) {
            return Ok(None);
        }
        let seq = self.seq(seq_id)?;
        let output = seq.output().to_vec();
        let samples = 1 + seq.pending_forks();
        (0..samples)
            .map(|i| self.choose(seq_id, i, row, &output, mask))
            .collect::<Option<Vec<Sampled>>>()
            .map(Some)
            .ok_or_else(|| missing(seq_id))
    }

    /// Applies `output`: commits, KV moves, forks, drafters; returns what to emit.
    pub(super) fn update(
        &mut self,
        scheduled: &[ScheduledSeq],
        output: StepOutput,
    ) -> Result<Emissions> {
        let mut emissions = Vec::new();
        for (s, outcome) in scheduled.iter().zip(output.outcomes) {
            if s.first_since_admission {
                let cached = s.num_computed;
                if let Some(request) = self.request_of_mut(s.seq) {
                    request.cached_tokens = request.cached_tokens.max(cached);
                }
            }
            match outcome {
                SeqOutcome::Prefilled => {
                    self.scheduler.commit(s.seq, Progress::Chain, &[])?;
                }
                SeqOutcome::Gone => {}
                SeqOutcome::Pooled(values) => {
                    self.scheduler.commit_prompt_end(s.seq)?;
                    self.finish_pooled(s.seq, values);
                }
                SeqOutcome::Verified {
                    tree,
                    verified,
                    forced,
                } => {
                    self.commit_verified(s.seq, &tree, &verified, forced)?;
                    // A sequence whose constraint failed has left.
                    if self.records.contains_key(&s.seq) {
                        emissions.push((s.seq, verified.tokens));
                    }
                }
                SeqOutcome::Sampled(drawn) => {
                    self.commit_sampled(s.seq, drawn, &mut emissions)?;
                }
            }
        }
        Ok(emissions)
    }

    /// Commits the accepted path of `seq_id`'s tree (moving its KV into place) and tells its
    /// drafter.
    /// A forced tree (the format's, not the drafter's) does not count in the drafter's
    /// statistics.
    fn commit_verified(
        &mut self,
        seq_id: SeqId,
        tree: &TokenTree,
        v: &Verified,
        forced: bool,
    ) -> Result<()> {
        let new: Vec<u32> = v.tokens.iter().map(|s| s.token_id).collect();
        for &token in &new {
            if let Err(e) = self.advance_constraint(seq_id, token) {
                if let Some(id) = self.records.get(&seq_id).map(|r| r.request) {
                    self.fail_request_with(id, Failure::from_error(&e));
                }
                return Ok(());
            }
        }
        let progress = Progress::Tree {
            accepted: &v.accepted,
        };
        let moves = self.scheduler.commit(seq_id, progress, &new)?;
        self.backend.move_kv(&moves)?;
        let verified = (!forced).then_some((tree, v.accepted.as_slice()));
        self.tell_drafter(seq_id, new.len(), verified)
    }

    /// `seq_id`'s drafter (if it has one) learns that its tokens grew by `appended`, after
    /// the verification of `verified` (its tree and accepted nodes) when there was one.
    fn tell_drafter(
        &mut self,
        seq_id: SeqId,
        appended: usize,
        verified: Option<(&TokenTree, &[usize])>,
    ) -> Result<()> {
        let tokens = self
            .scheduler
            .seq(seq_id)
            .ok_or_else(|| missing(seq_id))?
            .tokens();
        if let Some(drafter) = self
            .records
            .get_mut(&seq_id)
            .and_then(|r| r.drafter.as_mut())
        {
            if let Some((tree, accepted)) = verified {
                self.spec.verified(drafter, tree, accepted);
            }
            drafter.observe(tokens, appended);
        }
        Ok(())
    }

    /// `seq_id`'s constraint (if any) follows its new output token; an end token finishes
    /// the sequence instead.
    fn advance_constraint(&mut self, seq_id: SeqId, token: u32) -> Result<()> {
        match self.records.get_mut(&seq_id) {
            Some(record) => record.advance(token, &self.eos_ids),
            None => Ok(()),
        }
    }

    /// Commits `seq_id`'s sampled token and forks the siblings it is owed, each with its
    /// own first token; all of them go to `emissions`.
    fn commit_sampled(
        &mut self,
        seq_id: SeqId,
        drawn: Vec<Sampled>,
        emissions: &mut Emissions,
    ) -> Result<()> {
        let Some(request_id) = self.records.get(&seq_id).map(|r| r.request) else {
            return Ok(());
        };
        let first = drawn.first().ok_or_else(|| missing(seq_id))?.token_id;
        // Forks start from the constraint's state before this sequence's own token.
        let fork_base = match self
            .records
            .get(&seq_id)
            .and_then(|r| r.constraint.as_ref())
        {
            Some(c) if drawn.len() > 1 => Some(c.fork()),
            _ => None,
        };
        if let Err(e) = self.advance_constraint(seq_id, first) {
            self.fail_request_with(request_id, Failure::from_error(&e));
            return Ok(());
        }
        self.scheduler.commit(seq_id, Progress::Chain, &[first])?;
        self.tell_drafter(seq_id, 1, None)?;
        let mut drawn = drawn.into_iter().enumerate();
        if let Some((_, sampled)) = drawn.next() {
            emissions.push((seq_id, vec![sampled]));
        }
        for (i, sampled) in drawn {
            let child = SeqId(self.next_seq);
            self.next_seq += 1;
            self.scheduler.fork(seq_id, child, sampled.token_id)?;
            let child_tokens = self.seq(child)?.tokens();
            let drafter = self
                .records
                .get(&seq_id)
                .and_then(|r| r.drafter.as_ref())
                .and_then(|parent| self.spec.fork(parent, child_tokens));
            let request = self
                .requests
                .get_mut(&request_id)
                .ok_or_else(|| missing(seq_id))?;
            request.seqs.push(child);
            let constraint = fork_base.as_ref().map(|c| c.fork());
            let mut record = SeqRecord::new(
                request_id,
                i,
                &request.request,
                drafter,
                constraint,
                &self.eos_ids,
            );
            if let Err(e) = record.advance(sampled.token_id, &self.eos_ids) {
                // The sibling's token was allowed by the same mask; should its constraint
                // fail anyway, its request fails, not the step.
                self.fail_request_with(request_id, Failure::from_error(&e));
                return Ok(());
            }
            self.records.insert(child, record);
            emissions.push((child, vec![sampled]));
        }
        Ok(())
    }
}
