//! `SchedulerConfig`: the limits of one step (token budget, sequence cap), the model length,
//! and the KV pool. [`SchedulerConfig::validate`] rejects combinations that could starve or
//! deadlock, so the scheduler itself never has to.

use kvcache::ManagerConfig;

use crate::SchedulerError;

/// Limits of the scheduler.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SchedulerConfig {
    /// Tokens fed to the model in one step, over all sequences.
    pub max_num_batched_tokens: usize,
    /// Sequences running at once.
    pub max_num_seqs: usize,
    /// Longest sequence (prompt plus output) in tokens.
    pub max_model_len: usize,
    /// The KV pool.
    pub kv: ManagerConfig,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            max_num_batched_tokens: 512,
            max_num_seqs: 64,
            max_model_len: 2048,
            kv: ManagerConfig::default(),
        }
    }
}

impl SchedulerConfig {
    /// Errors when the limits cannot work together: every running sequence must be able to
    /// get one token per step, and one sequence of `max_model_len` must fit in the pool
    /// alone (otherwise it could preempt itself forever).
    pub fn validate(&self) -> Result<(), SchedulerError> {
        let fail = |m: String| Err(SchedulerError::InvalidConfig(m));
        if self.max_num_seqs == 0 || self.max_model_len < 2 || self.kv.block_size == 0 {
            return fail("max_num_seqs, block_size must be positive and max_model_len >= 2".into());
        }
        if self.max_num_batched_tokens < self.max_num_seqs {
            return fail(format!(
                "max_num_batched_tokens ({}) must be at least max_num_seqs ({}) so every running sequence gets a turn each step",
                self.max_num_batched_tokens, self.max_num_seqs
            ));
        }
        let pool_tokens = self.kv.num_blocks * self.kv.block_size;
        if pool_tokens < self.max_model_len + self.kv.block_size {
            return fail(format!(
                "the KV pool holds {pool_tokens} tokens, fewer than one sequence of max_model_len ({}) needs",
                self.max_model_len
            ));
        }
        if let Some(w) = self.kv.window {
            // One sequence alone: its window, a partly filled block either side, one step.
            let bs = self.kv.block_size;
            let need = w.window.div_ceil(bs) + self.max_num_batched_tokens.div_ceil(bs) + 2;
            if w.window == 0 || w.num_blocks < need {
                return fail(format!(
                    "the windowed KV pool holds {} blocks, fewer than one sequence with a window of {} and steps of {} tokens needs ({need})",
                    w.num_blocks, w.window, self.max_num_batched_tokens
                ));
            }
        }
        Ok(())
    }
}
