//! `Sequence`: what the scheduler knows of one sequence: its tokens (prompt, then output,
//! the last one pending until it is fed), how many have KV in the cache, its status and its
//! place in first-come-first-served order.

use kvcache::{BlockHash, SeqId};

/// Where a sequence is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeqStatus {
    /// Queued for admission (new, or preempted and waiting to recompute).
    Waiting,
    /// Holding blocks and scheduled every step.
    Running,
}

/// One sequence.
#[derive(Debug, Clone)]
pub struct Sequence {
    pub(crate) id: SeqId,
    pub(crate) tokens: Vec<u32>,
    pub(crate) num_prompt_tokens: usize,
    pub(crate) num_computed: usize,
    pub(crate) status: SeqStatus,
    /// Order of arrival; preempted sequences keep theirs.
    pub(crate) arrival: u64,
    /// Sequences still to be forked from this one when its prompt is done (`n - 1`).
    pub(crate) pending_forks: usize,
    pub(crate) num_preemptions: u32,
    /// Tokens scheduled in the current step (0 when not scheduled).
    pub(crate) scheduled: usize,
    /// Draft nodes granted in the current step.
    pub(crate) scheduled_draft: usize,
    /// The prefix-cache scope of the request's cache salt (`None`: no salt).
    pub(crate) cache_scope: Option<BlockHash>,
    /// It ends with its prompt (a pooling request): it yields to generating sequences
    /// (`Scheduler::set_prefill_only`).
    pub(crate) prefill_only: bool,
}

impl Sequence {
    /// Its id.
    pub fn id(&self) -> SeqId {
        self.id
    }

    /// Every known token: prompt, then output (the last one pending).
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Prompt length.
    pub fn num_prompt_tokens(&self) -> usize {
        self.num_prompt_tokens
    }

    /// Output tokens so far (including the pending one).
    pub fn output(&self) -> &[u32] {
        &self.tokens[self.num_prompt_tokens..]
    }

    /// Tokens whose KV is in the cache.
    pub fn num_computed(&self) -> usize {
        self.num_computed
    }

    /// Waiting or running.
    pub fn status(&self) -> SeqStatus {
        self.status
    }

    /// Times this sequence was preempted.
    pub fn num_preemptions(&self) -> u32 {
        self.num_preemptions
    }

    /// The prefix-cache scope of its request's cache salt (`None`: no salt).
    pub fn cache_scope(&self) -> Option<BlockHash> {
        self.cache_scope
    }

    /// Forks still owed to this sequence (its `n - 1` siblings).
    pub fn pending_forks(&self) -> usize {
        self.pending_forks
    }

    /// Sequence slots this sequence will occupy once its forks exist.
    pub(crate) fn slots(&self) -> usize {
        1 + self.pending_forks
    }
}
