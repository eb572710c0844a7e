//! The scheduler's vocabulary: sequence identity. Sequences, queues and per-step plans
//! (token budget, chunked prefill, preemption) build on it and, like everything in this
//! crate, deal in token ids only, never tensors.

#![deny(missing_docs)]

/// Identity of one sequence for its whole life in the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub u64);
