//! `SeqRecord`: everything the engine keeps about one live sequence, in one place: the
//! request and sample it belongs to, its output state (detokenizer, stop-string filter,
//! tokens emitted, timing) and its drafter with its speculation totals. The scheduler keeps
//! only what scheduling needs (tokens, KV progress, status); the engine removes a record,
//! the scheduler's entry and speculation's per-sequence state together, through one path
//! (`Engine::remove_seq`).

use std::time::Instant;

use crate::detokenizer::{IncrementalDetokenizer, StopStringFilter};
use crate::request::Request;
use crate::speculation::SeqDrafter;

/// One live sequence (one sample of a request).
pub(super) struct SeqRecord {
    /// The request it belongs to.
    pub(super) request: u64,
    /// Its sample index within the request.
    pub(super) index: usize,
    pub(super) detokenizer: IncrementalDetokenizer,
    pub(super) filter: StopStringFilter,
    /// Output tokens emitted so far.
    pub(super) num_output: usize,
    pub(super) last_token_at: Option<Instant>,
    /// Its drafter (`None` when it does not speculate).
    pub(super) drafter: Option<SeqDrafter>,
}

impl SeqRecord {
    /// Sample `index` of `request` (`r`), drafting with `drafter`.
    pub(super) fn new(
        request: u64,
        index: usize,
        r: &Request,
        drafter: Option<SeqDrafter>,
    ) -> Self {
        Self {
            request,
            index,
            detokenizer: IncrementalDetokenizer::new(),
            filter: StopStringFilter::new(&r.stop.stop),
            num_output: 0,
            last_token_at: None,
            drafter,
        }
    }
}
