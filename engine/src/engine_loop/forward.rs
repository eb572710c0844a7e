//! The forward stage: the backend runs the step's batch while another thread computes the
//! token masks of the constrained rows (the forward does not need them, sampling does), and
//! then every speculator sees every computed row, with its sequence's cache-salt scope and
//! the tokens fed before it on its path.

use std::time::Instant;

use super::batch::StepBatch;
use super::constrain::{self, Deferred, Masks};
use super::Engine;
use crate::spec::speculator::ObservedRow;
use crate::Result;

impl Engine {
    /// Runs `batch` on the backend, the `deferred` masks computed beside it and merged into
    /// `masks`; returns the logits of the rows asked for and the forward's seconds.
    pub(super) fn forward_beside_masks(
        &mut self,
        batch: &StepBatch,
        deferred: Deferred,
        masks: &mut Masks,
    ) -> Result<(Vec<Vec<f32>>, f64)> {
        let jobs = constrain::deferred_jobs(&mut self.records, deferred);
        let backend = &mut self.backend;
        let (logits, forward_seconds, computed) = std::thread::scope(|scope| {
            let masks = (!jobs.is_empty()).then(|| scope.spawn(|| constrain::deferred_masks(jobs)));
            let forward_started = Instant::now();
            let logits = backend.forward(&batch.batch);
            let seconds = forward_started.elapsed().as_secs_f64();
            let computed = match masks {
                Some(thread) => thread.join().map_err(|_| {
                    crate::Error::InvalidBatch("the constraint stage panicked".into())
                }),
                None => Ok(Vec::new()),
            };
            (logits, seconds, computed)
        });
        let logits = logits?;
        self.merge_masks(masks, computed?);
        Ok((logits, forward_seconds))
    }

    /// Every speculator sees every row the forward computed (`logits`, in the batch's order
    /// of logit rows), and the cost curve the forward's `seconds`.
    pub(super) fn observe_rows(&mut self, batch: &StepBatch, logits: &[Vec<f32>], seconds: f64) {
        let StepBatch {
            batch,
            scopes,
            tails,
        } = batch;
        let computed = logits.iter().zip(&batch.logit_rows).map(|(row, &at)| {
            let seq = batch.seq_of(at);
            // The sequence's tokens before the batch's rows, then the row's ancestors.
            let mut before = tails.get(seq).copied().unwrap_or_default();
            for token in batch.ancestor_tokens(at).into_iter().flatten() {
                before.push(token);
            }
            ObservedRow {
                token: batch.token_ids[at],
                logits: row.as_slice(),
                cache_scope: scopes.get(seq).copied().flatten(),
                before,
            }
        });
        self.spec
            .observe_forward(batch.num_rows(), seconds, computed);
    }
}
