//! `SeqRecord`: everything the engine keeps about one live sequence, in one place: the
//! request and sample it belongs to, its output state (detokenizer, stop-string filter,
//! tokens emitted, timing), its output constraint and its drafter with its speculation
//! totals. The scheduler keeps
//! only what scheduling needs (tokens, KV progress, status); the engine removes a record,
//! the scheduler's entry and speculation's per-sequence state together, through one path
//! (`Engine::remove_seq`).

use std::collections::VecDeque;
use std::time::Instant;

use crate::constraint::Constraint;
use crate::model::detokenizer::{IncrementalDetokenizer, StopStringFilter};
use crate::request::Request;
use crate::spec::coordinator::SeqDrafter;
use crate::Result;

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
    /// Whether stop strings or stop tokens wait for a complete output (under a format):
    /// then `complete_after` says, for each committed token not yet emitted, whether the
    /// output was complete after it, and `complete` whether it is after those emitted.
    tracks_completion: bool,
    complete_after: VecDeque<bool>,
    complete: bool,
}

impl SeqRecord {
    /// Sample `index` of `request` (`r`), drafting with `drafter`, its output following
    /// `constraint` (in the state its output starts from) and ending with any of `ends`.
    pub(super) fn new(
        request: u64,
        index: usize,
        r: &Request,
        drafter: Option<SeqDrafter>,
        mut constraint: Option<Box<dyn Constraint>>,
        ends: &[u32],
    ) -> Self {
        let tracks_completion =
            constraint.is_some() && !(r.stop.stop.is_empty() && r.stop.stop_token_ids.is_empty());
        // Whether the empty output is already complete (a format that accepts it): its mask
        // is the one compiled with the format, so this costs nothing.
        let complete = tracks_completion
            && constraint.as_mut().is_some_and(|c| {
                c.mask()
                    .is_ok_and(|mask| ends.iter().any(|&e| mask.allows(e)))
            });
        let mut record = Self {
            request,
            index,
            detokenizer: if r.stop.skip_special_tokens {
                IncrementalDetokenizer::new()
            } else {
                IncrementalDetokenizer::keeping_special_tokens()
            },
            filter: match constraint {
                Some(_) => StopStringFilter::under_format(&r.stop.stop),
                None => StopStringFilter::new(&r.stop.stop),
            },
            num_output: 0,
            last_token_at: None,
            drafter,
            constraint,
            tracks_completion,
            complete_after: VecDeque::new(),
            complete,
        };
        if complete {
            record.filter.mark_complete();
        }
        record
    }

    /// Whether a stop token or stop string may end the output here: always, unless a format
    /// holds it and the output so far is not a complete one of it.
    pub(super) fn may_stop(&self) -> bool {
        self.constraint.is_none() || self.complete
    }

    /// The output grew by `token`: the constraint (if any) follows it, unless it is one of
    /// the end tokens `ends` (which finish the output instead); where stops wait for a
    /// complete output, notes whether the output is complete after it (an end token allowed
    /// next).
    pub(super) fn advance(&mut self, token: u32, ends: &[u32]) -> Result<()> {
        let Some(constraint) = self.constraint.as_mut() else {
            return Ok(());
        };
        let end = ends.contains(&token);
        if !end {
            constraint.advance(token)?;
        }
        if self.tracks_completion {
            let complete = !end && {
                let mask = constraint.mask()?;
                ends.iter().any(|&e| mask.allows(e))
            };
            self.complete_after.push_back(complete);
        }
        Ok(())
    }

    /// A token's text went out: the output is complete there if the format said so (and a
    /// stop string may start there, unless a character waits for its last bytes).
    pub(super) fn emitted(&mut self) {
        if !self.tracks_completion {
            return;
        }
        self.complete = self.complete_after.pop_front() == Some(true);
        if self.complete && self.detokenizer.settled() {
            self.filter.mark_complete();
        }
    }
}
