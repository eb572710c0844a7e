//! `SeqRecord`: everything the engine keeps about one live sequence, in one place: the
//! request and sample it belongs to, its output state (detokenizer, stop-string filter,
//! tokens emitted, timing), its output constraint and its drafter with its speculation
//! totals. The scheduler keeps
//! only what scheduling needs (tokens, KV progress, status); the engine removes a record,
//! the scheduler's entry and speculation's per-sequence state together, through one path
//! (`Engine::remove_seq`).

use std::time::Instant;

use crate::constraint::Constraint;
use crate::model::detokenizer::{IncrementalDetokenizer, StopStringFilter};
use crate::request::Request;
use crate::spec::coordinator::SeqDrafter;

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
    /// The format its output must follow (`None` when free).
    pub(super) constraint: Option<Box<dyn Constraint>>,
}

impl SeqRecord {
    /// Sample `index` of `request` (`r`), drafting with `drafter`, its output following
    /// `constraint`.
    pub(super) fn new(
        request: u64,
        index: usize,
        r: &Request,
        drafter: Option<SeqDrafter>,
        constraint: Option<Box<dyn Constraint>>,
    ) -> Self {
        Self {
            request,
            index,
            detokenizer: if r.stop.skip_special_tokens {
                IncrementalDetokenizer::new()
            } else {
                IncrementalDetokenizer::keeping_special_tokens()
            },
            filter: StopStringFilter::new(&r.stop.stop),
            num_output: 0,
            last_token_at: None,
            drafter,
            constraint,
        }
    }
}
