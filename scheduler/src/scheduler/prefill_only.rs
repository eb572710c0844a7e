//! Prefill-only sequences: requests that end with their prompt (an embedding's, a reranked
//! pair's). They share steps with generation, and yield to it: while a generating sequence is
//! in the scheduler (running or waiting), the prefill-only ones take at most
//! [`Scheduler::prefill_only_share`] tokens of a step between them, so that a bulk of
//! embedding inputs lengthens each decoding step by a bounded amount instead of filling it.
//! Alone they take whole steps. A prompt that ends is committed without a new token.

use kvcache::SeqId;

use super::Scheduler;
use crate::SchedulerError;

impl Scheduler {
    /// Marks `id` (added, not yet admitted) as ending with its prompt.
    pub fn set_prefill_only(&mut self, id: SeqId) -> Result<(), SchedulerError> {
        let seq = self
            .seqs
            .get_mut(&id)
            .ok_or(SchedulerError::UnknownSeq(id))?;
        seq.prefill_only = true;
        Ok(())
    }

    /// Tokens of a step the prefill-only sequences may take between them while generation
    /// runs: an eighth of the step budget, at least 16.
    pub fn prefill_only_share(&self) -> usize {
        (self.config.max_num_batched_tokens / 8).max(16)
    }

    /// Tokens the prefill-only sequences may take this step: the share while a generating
    /// sequence is in the scheduler, the whole budget otherwise.
    pub(super) fn prefill_only_room(&self) -> usize {
        match self.seqs.values().any(|s| !s.prefill_only) {
            true => self.prefill_only_share(),
            false => self.config.max_num_batched_tokens,
        }
    }

    /// Commits `seq`'s last prompt chunk, fed this step, without a new token: a request that
    /// ends with its prompt (a pooling request's). Its computed blocks enter the prefix
    /// cache as a generating sequence's do.
    pub fn commit_prompt_end(&mut self, id: SeqId) -> Result<(), SchedulerError> {
        let seq = self
            .seqs
            .get_mut(&id)
            .ok_or(SchedulerError::UnknownSeq(id))?;
        let computed = seq.num_computed + seq.scheduled;
        if seq.scheduled == 0 || seq.scheduled_draft != 0 || computed != seq.tokens.len() {
            return Err(SchedulerError::InvalidUpdate {
                seq: id,
                reason: format!(
                    "{} fed after {} computed do not end its {} tokens without a draft",
                    seq.scheduled,
                    seq.num_computed,
                    seq.tokens.len()
                ),
            });
        }
        seq.num_computed = computed;
        seq.scheduled = 0;
        self.blocks.commit(id, &seq.tokens[..computed])?;
        Ok(())
    }
}
