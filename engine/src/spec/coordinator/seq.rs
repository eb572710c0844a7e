//! One speculating sequence's side of speculation: its drafter and the speculator it belongs
//! to, what it needs to fork (its request's prompt length and prediction), how it accepts
//! relative to each source's engine-wide statistics, and its totals per source, reported with
//! the finished sample.

use std::sync::Arc;

use crate::spec::methods::prediction::Prediction;
use crate::spec::{Drafter, SourceOutcome, SpecMethod, SpecRequest};

/// One speculating sequence's drafting state; it lives in the engine's record of the
/// sequence and goes with it.
pub(crate) struct SeqDrafter {
    pub(super) drafter: Box<dyn Drafter>,
    /// Index of its method's speculator.
    pub(super) speculator: usize,
    pub(super) request: SpecRequest,
    /// Where its output starts, and its request's prediction (forks take both).
    pub(super) prompt_len: usize,
    pub(super) prediction: Option<Arc<Prediction>>,
    /// Its request's cache-salt scope (forks take it).
    pub(super) cache_scope: Option<kvcache::BlockHash>,
    pub(super) max_draft: usize,
    /// How this sequence accepts relative to each source's statistics (a source missing
    /// here: as they say), so that one source failing for it (a wrong prediction) does not
    /// lower its trust in the others.
    pub(super) ratios: Vec<(SpecMethod, f32)>,
    /// Nodes the drafter prepared this step.
    pub(super) available: usize,
    /// What it drafted and had accepted so far, of the tokens emitted.
    pub(super) totals: SpecTotals,
    /// The last verified tree, counted once the emit stage knows how many of its tokens
    /// the client received.
    pub(super) unsettled: Option<Unsettled>,
}

/// A verified tree not yet in a sequence's totals and the metrics: a sample that ends on
/// one of its tokens (its length, a stop string, its end of sequence) drops the rest, and
/// accepted tokens past that point were never output.
pub(super) struct Unsettled {
    pub(super) method: SpecMethod,
    pub(super) drafted: usize,
    /// Draft tokens on its accepted path.
    pub(super) accepted: usize,
    /// Per source (empty: the whole tree is `method`'s).
    pub(super) sources: Vec<SourceOutcome>,
}

impl SeqDrafter {
    /// Its totals so far.
    pub(crate) fn totals(&self) -> SpecTotals {
        self.totals.clone()
    }

    /// Its acceptance ratio for `method`.
    pub(super) fn ratio(&self, method: SpecMethod) -> f32 {
        self.ratios
            .iter()
            .find(|(m, _)| *m == method)
            .map_or(1.0, |r| r.1)
    }

    pub(super) fn ratio_mut(&mut self, method: SpecMethod) -> &mut f32 {
        let at = match self.ratios.iter().position(|(m, _)| *m == method) {
            Some(at) => at,
            None => {
                self.ratios.push((method, 1.0));
                self.ratios.len() - 1
            }
        };
        &mut self.ratios[at].1
    }

    /// The emit stage output the first `emitted` tokens of the last verified tree's path
    /// (its accepted drafts, then the model's next token): its counts go to the totals and
    /// the metrics, with the accepted drafts past them dropped. Nothing when there is no
    /// tree left to count.
    pub(crate) fn settle(&mut self, emitted: usize) {
        let Some(tree) = self.unsettled.take() else {
            return;
        };
        let kept = tree.accepted.min(emitted);
        use crate::metrics::spec::*;
        let name = tree.method.as_str();
        if tree.sources.is_empty() {
            self.totals.add(tree.method, tree.drafted, kept);
            metrics::counter!(DRAFT_TOKENS, "method" => name).increment(tree.drafted as u64);
            metrics::counter!(ACCEPTED_TOKENS, "method" => name).increment(kept as u64);
        } else {
            let sources: Vec<(SpecMethod, usize, usize)> = (tree.sources.iter())
                .map(|o| (o.method, o.drafted, o.accepted_within(kept)))
                .collect();
            self.totals.add_sources(tree.drafted, kept, &sources);
            for (source, drafted, accepted) in sources {
                let name = source.as_str();
                metrics::counter!(DRAFT_TOKENS, "method" => name).increment(drafted as u64);
                metrics::counter!(ACCEPTED_TOKENS, "method" => name).increment(accepted as u64);
            }
        }
        metrics::counter!(VERIFY_STEPS, "method" => name).increment(1);
        for depth in 1..=kept {
            metrics::counter!(ACCEPTED_PER_POSITION, "method" => name, "position" => depth.to_string())
                .increment(1);
        }
    }

    /// The sequence's known tokens grew by their last `appended`.
    pub(crate) fn observe(&mut self, tokens: &[u32], appended: usize) {
        self.drafter.observe(tokens, appended);
    }
}

/// Per-sequence totals of speculation, reported with the finished sample.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SpecTotals {
    /// Verification steps.
    pub steps: usize,
    /// Draft nodes verified.
    pub drafted: usize,
    /// Draft nodes accepted.
    pub accepted: usize,
    /// The same per draft source (`auto`'s sources and the prediction apart), in the order
    /// they first drafted.
    pub sources: Vec<SourceTotals>,
}

/// One draft source's part of a sequence's [`SpecTotals`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceTotals {
    /// The source.
    pub method: SpecMethod,
    /// Verification steps of its trees.
    pub steps: usize,
    /// Its draft nodes verified.
    pub drafted: usize,
    /// Its draft nodes accepted.
    pub accepted: usize,
}

impl SourceTotals {
    /// `method`'s totals before it drafted.
    pub fn none(method: SpecMethod) -> Self {
        Self {
            method,
            steps: 0,
            drafted: 0,
            accepted: 0,
        }
    }
}

impl SpecTotals {
    pub(super) fn add(&mut self, method: SpecMethod, drafted: usize, accepted: usize) {
        self.add_sources(drafted, accepted, &[(method, drafted, accepted)]);
    }

    /// A verified tree of `drafted` nodes with `accepted` accepted, which `sources` proposed
    /// (`(source, its nodes, its accepted nodes)`; a node several proposed counts for each).
    pub(super) fn add_sources(
        &mut self,
        drafted: usize,
        accepted: usize,
        sources: &[(SpecMethod, usize, usize)],
    ) {
        self.steps += 1;
        self.drafted += drafted;
        self.accepted += accepted;
        for &(method, drafted, accepted) in sources {
            let at = match self.sources.iter().position(|s| s.method == method) {
                Some(at) => at,
                None => {
                    self.sources.push(SourceTotals::none(method));
                    self.sources.len() - 1
                }
            };
            let source = &mut self.sources[at];
            source.steps += 1;
            source.drafted += drafted;
            source.accepted += accepted;
        }
    }
}
