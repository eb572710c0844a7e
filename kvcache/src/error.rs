//! `KvError`: misuse of the block manager by its caller (an unknown or duplicate sequence,
//! a path or length that does not fit the table). Running out of blocks is *not* an error:
//! it is `None` from the allocating calls, handled by the scheduler.

use crate::SeqId;

/// A call the block manager refused; nothing was changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvError {
    /// No sequence with this id is registered.
    #[error("unknown sequence {0:?}")]
    UnknownSeq(SeqId),
    /// A sequence with this id is already registered.
    #[error("sequence {0:?} is already registered")]
    DuplicateSeq(SeqId),
    /// An accepted path that is not strictly increasing or runs past the table.
    #[error("invalid accepted path: {0}")]
    InvalidPath(String),
    /// A length past what the sequence's table holds, or a commit that shrinks.
    #[error("sequence {seq:?}: length {len} invalid ({reason})")]
    InvalidLength {
        /// The sequence.
        seq: SeqId,
        /// The offending length.
        len: usize,
        /// Why it is invalid.
        reason: &'static str,
    },
}
