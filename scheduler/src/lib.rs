//! The scheduler's vocabulary: sequence identity (shared with the block manager).
//! Sequences, queues and per-step plans (token budget, chunked prefill, preemption) build on
//! it and, like everything in this crate, deal in token ids only, never tensors.

#![deny(missing_docs)]

pub use kvcache::SeqId;
