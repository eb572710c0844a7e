//! `SchedulerError`: requests the scheduler refuses (an empty or over-long prompt) and
//! calls that do not match its state (an unknown sequence, a commit that was not scheduled).
//! Nothing is changed when an error is returned.

use kvcache::{KvError, SeqId};

/// Why the scheduler refused a call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchedulerError {
    /// A prompt with no tokens.
    #[error("prompt is empty")]
    EmptyPrompt,
    /// A prompt that leaves no room to generate within the model length.
    #[error("prompt of {len} tokens does not fit: the limit is {limit} tokens including at least one generated")]
    PromptTooLong {
        /// Prompt tokens.
        len: usize,
        /// The model length.
        limit: usize,
    },
    /// No sequence with this id.
    #[error("unknown sequence {0:?}")]
    UnknownSeq(SeqId),
    /// A sequence with this id already exists.
    #[error("sequence {0:?} already exists")]
    DuplicateSeq(SeqId),
    /// A commit or fork that does not match what was scheduled.
    #[error("sequence {seq:?}: {reason}")]
    InvalidUpdate {
        /// The sequence.
        seq: SeqId,
        /// What was wrong.
        reason: String,
    },
    /// A configuration that cannot work.
    #[error("invalid scheduler configuration: {0}")]
    InvalidConfig(String),
    /// The block manager refused a call.
    #[error(transparent)]
    Kv(#[from] KvError),
}
