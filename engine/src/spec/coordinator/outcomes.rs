//! What the engine thread's speculation learns after each forward: the forward's time
//! refines the cost curve, every computed row goes to every speculator, each step's phases
//! are timed, and each verified tree updates its method's acceptance statistics, the
//! sequence's acceptance ratio and its drafter, and waits for the emit stage to be counted
//! in the sequence's totals and the metrics.

use super::seq::Unsettled;
use super::{SeqDrafter, Speculation};
use crate::spec::speculator::ObservedRow;
use crate::spec::stats::{smooth, AcceptanceStats};
use crate::tree::TokenTree;

impl Speculation {
    /// After a forward of `rows` rows that took `seconds`: the cost curve learns its time,
    /// and every speculator sees each computed row.
    pub(crate) fn observe_forward<'a>(
        &mut self,
        rows: usize,
        seconds: f64,
        computed: impl Iterator<Item = ObservedRow<'a>>,
    ) {
        self.observe_cost(rows, seconds);
        self.this_step.forward = Some(seconds);
        if self.speculators.is_empty() {
            return;
        }
        let started = std::time::Instant::now();
        let mut observed = 0usize;
        for row in computed {
            observed += 1;
            for speculator in &mut self.speculators {
                speculator.observe_row(&row);
            }
        }
        // What reading each row costs is priced per row (a GPU's rows are cheap enough that
        // it is a large part of what a draft row costs), not in the step's fixed overhead.
        if observed > 0 {
            let spent = started.elapsed().as_secs_f64();
            self.this_step.observing += spent;
            smooth(&mut self.observing_per_row, spent / observed as f64);
        }
    }

    /// Sampling (and verifying) the `tokens` tokens a step yields took `seconds`.
    pub(crate) fn observe_sampling(&mut self, tokens: usize, seconds: f64) {
        self.this_step.sampling += seconds;
        if tokens > 0 {
            smooth(&mut self.sampling_per_token, seconds / tokens as f64);
        }
    }

    /// After a step that ran a forward and took `seconds` in all (`None`: it failed): what it
    /// spent beside the forward, the drafting, the sampling and the speculators' reading of
    /// its rows refines the step overhead, and each phase's time goes to the step-phase
    /// histogram (the reading of rows inside "other").
    pub(crate) fn observe_step(&mut self, seconds: Option<f64>) {
        let times = std::mem::take(&mut self.this_step);
        if let (Some(forward), Some(seconds)) = (times.forward, seconds) {
            // The lookup is paid every step whatever it yields: the planner counts it in
            // the step's overhead, while the histogram shows it apart.
            let rest = (seconds - forward - times.drafting - times.sampling).max(0.0);
            smooth(&mut self.step_overhead, (rest - times.observing).max(0.0));
            use crate::metrics::STEP_PHASE;
            for (phase, spent) in [
                ("forward", forward),
                ("drafting", times.drafting),
                ("lookup", times.lookup.min(rest)),
                ("sampling", times.sampling),
                ("other", (rest - times.lookup).max(0.0)),
            ] {
                metrics::histogram!(STEP_PHASE, "phase" => phase).record(spent);
            }
        }
    }

    /// Refines the cost curve with one measured forward of `rows` rows.
    fn observe_cost(&mut self, rows: usize, seconds: f64) {
        tracing::trace!(rows, seconds, "forward");
        let units = self.config.cost.cost(rows);
        if units > 0.0 {
            smooth(&mut self.seconds_per_unit, seconds / units);
        }
        self.config.cost.observe(rows, seconds);
    }

    /// Records a verification by `state`'s sequence: its tree and the accepted nodes
    /// (root first).
    pub(crate) fn verified(
        &mut self,
        state: &mut SeqDrafter,
        tree: &TokenTree,
        accepted: &[usize],
    ) {
        let drafted = tree.len().saturating_sub(1);
        if drafted == 0 {
            return;
        }
        let accepted_drafts = accepted.len().saturating_sub(1);
        let method = state.drafter.method();
        let evidence = state.drafter.evidence();
        let stats = (self.stats.entry((method, evidence)))
            .or_insert_with(|| AcceptanceStats::prior(method, evidence));
        // What the tree was expected to accept, by the pricing the planner used.
        let own = state
            .drafter
            .expected_accepted()
            .and_then(|own| own.get(drafted - 1).copied());
        let expected = own
            .unwrap_or_else(|| stats.curve(drafted).last().copied().unwrap_or(0.0))
            .max(0.05);
        tracing::trace!(
            method = method.as_str(),
            drafted,
            expected,
            accepted = accepted_drafts,
            "verified a draft tree"
        );
        let ratio = (accepted_drafts as f32 / expected).clamp(0.05, 3.0);
        // A tree expected to accept little says little about the sequence (with a weak
        // proposal, nothing accepted is what was expected): its outcome weighs in as much
        // as a token is expected.
        let own = state.ratio_mut(method);
        *own += 0.2 * expected.min(1.0) * (ratio - *own);
        // The tree's nodes are in its drafter's order, best first: a tree of its first n
        // drafted nodes would have accepted the path up to the first node beyond them.
        let path = accepted.get(1..).unwrap_or_default();
        stats.record_tree(drafted, |n| path.iter().take_while(|&&i| i <= n).count());
        self.best_per_node.retain(|(m, _)| *m != method);
        state.drafter.record(drafted, accepted_drafts);
        state.drafter.verified(tree, accepted);
        // Counted when its tokens are emitted (a tree left uncounted is counted whole).
        state.settle(usize::MAX);
        state.unsettled = Some(Unsettled {
            method,
            drafted,
            accepted: accepted_drafts,
            sources: state.drafter.source_outcomes().to_vec(),
        });
    }
}
