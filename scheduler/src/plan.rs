//! `StepPlan`: one step's decisions as plain data. For every scheduled sequence, the engine
//! feeds `tokens[num_computed .. num_computed + num_new_tokens]` as a chain on top of its
//! cached context, runs the KV copies first, and samples a token wherever the sequence
//! catches up with its known tokens. A decoding sequence with a draft budget feeds a tree
//! instead: its pending token and up to `draft_budget` drafted nodes under it. Afterwards
//! the engine reports back with [`Progress`].

use kvcache::{KvMove, SeqId};

/// One sequence's share of a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduledSeq {
    /// The sequence.
    pub seq: SeqId,
    /// Positions already in the KV cache (the context of this step's rows).
    pub num_computed: usize,
    /// Tokens fed this step, from position `num_computed`.
    pub num_new_tokens: usize,
    /// Whether this step reaches the pending token, so its logits give the next token.
    pub samples: bool,
    /// Whether this is the first time the sequence is fed since admission (new or resumed).
    pub first_since_admission: bool,
    /// Draft tree nodes this sequence may add under its pending token (its blocks already
    /// hold `num_computed + 1 + draft_budget` positions). Zero when not speculating.
    pub draft_budget: usize,
}

impl ScheduledSeq {
    /// Whether it decodes one token this step (it may then feed a draft tree instead).
    pub fn decodes(&self) -> bool {
        self.samples && self.num_new_tokens == 1
    }
}

/// Everything the engine needs to run one step.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepPlan {
    /// Sequences to feed, in running order.
    pub scheduled: Vec<ScheduledSeq>,
    /// Sequences preempted this step (KV dropped; they will recompute).
    pub preempted: Vec<SeqId>,
    /// Row copies (copy-on-write of shared blocks) to run before the forward.
    pub kv_copies: Vec<KvMove>,
    /// Tokens fed in all.
    pub num_batched_tokens: usize,
}

impl StepPlan {
    /// Whether there is nothing to run.
    pub fn is_empty(&self) -> bool {
        self.scheduled.is_empty()
    }
}

/// What became of a scheduled sequence's fed tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress<'a> {
    /// Every fed token was a chain and its KV is final (a prefill chunk, a plain decode).
    Chain,
    /// The fed tokens were a draft tree; these node indices (0 first, increasing) were
    /// accepted and their KV moves into consecutive positions.
    Tree {
        /// Accepted node indices.
        accepted: &'a [usize],
    },
}
