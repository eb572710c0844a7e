//! What the planner is offered each step: for every decoding sequence whose best case could
//! pay for its rows, its drafter's candidates priced by the expected accepted tokens of each
//! tree size (the drafter's own pricing, the method's statistics, a costly method's probe,
//! an exploring tree's sure first nodes, the output format's forced tokens), and the cost
//! curve the planner weighs them against.

use std::collections::HashMap;

use kvcache::SeqId;
use scheduler::{CostCurve, DraftInputs, DraftOffer};

use super::{SeqDrafter, Speculation};
use crate::spec::stats::AcceptanceStats;
use crate::spec::{DraftContext, SpecMethod};

/// A method whose drafting costs time of its own (a draft model) is first offered as if
/// every node of a tree of at most [`PROBE_NODES`] nodes would be accepted, until this
/// many of its trees were verified. From the pessimistic prior alone such a method never
/// drafts: a draft model's forwards cost about as much as a target step, which the
/// prior's fraction of a token never repays, so it would never show what it accepts. The
/// probe costs a few steps once per engine; the evidence then keeps or stops it.
pub(super) const PROBE_VERIFICATIONS: u64 = 8;

/// Most nodes a probing tree has.
const PROBE_NODES: usize = 4;

/// Where a drafter prices its nodes by the engine's statistics, its method's first trees at
/// each evidence level are offered as if their first [`EXPLORE_NODES`] nodes would be
/// accepted (and the rest as the statistics say), until this many were verified; and a
/// method with fewer than
/// [`PROBE_VERIFICATIONS`] verified trees in all prepares whatever its prior says. Where a
/// second row costs 0.4 of a step (two cores without AVX-512), the pessimistic prior and
/// its exploration bonus never pass the break-even, so a method that would pay never
/// drafts and never shows that it does. Exploring costs a few small trees per evidence
/// level once per engine; the evidence then keeps or stops them.
const EXPLORE_VERIFICATIONS: u64 = 2;

/// Nodes of an exploring tree offered as sure.
const EXPLORE_NODES: usize = 2;

/// How far a sequence's acceptance ratio drifts back towards 1 per step it decodes and
/// could draft.
const RATIO_RECOVERY: f32 = 0.02;

/// An exploring tree's curve: its first [`EXPLORE_NODES`] nodes sure, each later node adding
/// what it added before.
fn explore(expected: &mut [f32]) {
    let sure = EXPLORE_NODES.min(expected.len());
    let Some(&before) = sure.checked_sub(1).and_then(|i| expected.get(i)) else {
        return;
    };
    let lift = (sure as f32 - before).max(0.0);
    for (i, e) in expected.iter_mut().enumerate() {
        let nodes = (i + 1) as f32;
        *e = if i < sure {
            nodes
        } else {
            (*e + lift).min(nodes)
        };
    }
}

impl Speculation {
    /// Prepares the drafter of every candidate whose best case could pay on a step of
    /// `base` rows with room for `room` more, and returns the scheduler's draft inputs. A
    /// candidate's `forced` tokens (what its output format forces next) are offered as
    /// certain: each of the first `forced` nodes is expected to be accepted.
    ///
    /// A candidate's best case is its method's best acceptance per node (any evidence
    /// level), scaled by the sequence's ratio, at most one token a node. Where that is no
    /// more than the cost curve's break-even gain at this step's size
    /// (`CostCurve::break_even_gain`), no tree of the sequence's could raise the step's
    /// rate on its own, so its drafter does not prepare and it makes no offer: at a load
    /// where rows cost more than drafts return, speculation costs no work per step.
    pub(crate) fn offers<'a>(
        &mut self,
        candidates: impl Iterator<Item = (SeqId, &'a [u32], &'a mut SeqDrafter, usize)>,
        base: usize,
        room: usize,
    ) -> Option<DraftInputs> {
        let started = std::time::Instant::now();
        let offers = self.make_offers(candidates, base, room);
        self.this_step.lookup += started.elapsed().as_secs_f64();
        offers
    }

    /// [`Self::offers`], untimed.
    fn make_offers<'a>(
        &mut self,
        candidates: impl Iterator<Item = (SeqId, &'a [u32], &'a mut SeqDrafter, usize)>,
        base: usize,
        room: usize,
    ) -> Option<DraftInputs> {
        let cost = self.planning_cost();
        let break_even = cost.break_even_gain(base, room);
        let mut offers = HashMap::new();
        for (seq, tokens, state, forced) in candidates {
            if let Some(offer) = self.offer(tokens, state, forced, break_even) {
                offers.insert(seq, offer);
            }
        }
        (!offers.is_empty()).then_some(DraftInputs { cost, offers })
    }

    /// One candidate's offer (its known `tokens`, its drafter, the `forced` tokens its
    /// format forces next), or `None` where no tree of its could gain more than
    /// `break_even` per node: its drafter prepares only where its best case could.
    fn offer(
        &mut self,
        tokens: &[u32],
        state: &mut SeqDrafter,
        forced: usize,
        break_even: f64,
    ) -> Option<DraftOffer> {
        // Without drafts there is no evidence, so a ratio that failures pushed below
        // what drafting needs would never rise again: it drifts back towards the
        // method's average, and the sequence tries a small tree now and then.
        for (_, ratio) in &mut state.ratios {
            *ratio += RATIO_RECOVERY * (1.0 - *ratio);
        }
        state.available = 0;
        let forced = forced.min(state.max_draft);
        if forced == 0
            && !self.is_costly(state)
            && f64::from(self.best_case(state).min(1.0)) <= break_even
        {
            return None;
        }
        let ctx = DraftContext { tokens };
        state.available = state.drafter.prepare(&ctx).min(state.max_draft);
        if state.available == 0 && forced == 0 {
            return None;
        }
        // Whether this step's tree is the speculator's costly work (a prediction drafts
        // for free whatever the method).
        let costly = self.is_costly(state);
        let expected_accepted = self.expected_accepted(state, forced, costly);
        // The same test as before `prepare`, on this step's own curve: an offer none of
        // whose trees could pay for its rows would only cost the planner's time.
        let per_node = crate::spec::stats::best_per_node(&expected_accepted);
        if forced == 0 && !costly && f64::from(per_node.min(1.0)) <= break_even {
            return None;
        }
        let draft_cost = self.draft_cost(state, costly, expected_accepted.len());
        Some(DraftOffer {
            expected_accepted,
            draft_cost,
        })
    }

    /// Whether `state`'s tree would be its speculator's costly work (a draft model's
    /// forwards), as its drafter stands now.
    fn is_costly(&self, state: &SeqDrafter) -> bool {
        self.speculators[state.speculator]
            .draft_seconds(1)
            .is_some()
            && state.drafter.needs_speculator()
    }

    /// The best any of `state`'s sources could do per node (a prediction is one of them):
    /// its method's best per node ([`Self::best_per_node`], kept until its statistics
    /// change) scaled by the sequence's ratio.
    fn best_case(&mut self, state: &SeqDrafter) -> f32 {
        let mut best = 0.0f32;
        for method in [
            Some(state.drafter.method()),
            state.prediction.as_ref().map(|_| SpecMethod::Prediction),
        ]
        .into_iter()
        .flatten()
        {
            let per_node = match self.best_per_node.iter().find(|(m, _)| *m == method) {
                Some(&(_, known)) => known,
                None => {
                    let computed = self.best_per_node(method);
                    self.best_per_node.push((method, computed));
                    computed
                }
            };
            best = best.max(per_node * state.ratio(method));
        }
        best
    }

    /// The expected accepted tokens of each tree size of `state`'s prepared candidates: a
    /// probing costly method's first nodes all sure (its tree cut to [`PROBE_NODES`]), else
    /// the drafter's own pricing where it keeps one or its method's statistics, scaled by
    /// the sequence's ratio; an exploring method's first nodes sure; and the first `forced`
    /// nodes certain.
    fn expected_accepted(
        &mut self,
        state: &mut SeqDrafter,
        forced: usize,
        costly: bool,
    ) -> Vec<f32> {
        let method = state.drafter.method();
        let ratio = state.ratio(method);
        let key = (method, state.drafter.evidence());
        let stats = (self.stats.entry(key)).or_insert_with(|| AcceptanceStats::prior(key.0, key.1));
        let own = state.drafter.expected_accepted();
        let mut expected_accepted: Vec<f32> =
            if costly && stats.observations() < PROBE_VERIFICATIONS {
                state.available = state.available.min(PROBE_NODES);
                (1..=state.available).map(|n| n as f32).collect()
            } else {
                // The drafter's own pricing where it keeps one, else the method's record.
                let curve = match own {
                    Some(own) => own[..state.available.min(own.len())].to_vec(),
                    None => stats.curve(state.available),
                };
                curve
                    .into_iter()
                    .enumerate()
                    .map(|(i, e)| (e * ratio).min((i + 1) as f32))
                    .collect()
            };
        let drafted_best = expected_accepted.last().copied().unwrap_or(0.0);
        expected_accepted.resize(state.available.max(forced), drafted_best);
        if !costly && own.is_none() && stats.observations() < EXPLORE_VERIFICATIONS {
            explore(&mut expected_accepted);
        }
        for (i, e) in expected_accepted.iter_mut().enumerate() {
            *e = e.max((i + 1).min(forced) as f32);
        }
        expected_accepted
    }

    /// What drafting a tree of each size up to `sizes` nodes costs `state`'s speculator
    /// where it is `costly`, in the cost curve's units; empty for a method that only looks
    /// things up (or before the curve's unit is known).
    fn draft_cost(&self, state: &SeqDrafter, costly: bool, sizes: usize) -> Vec<f64> {
        let speculator = &self.speculators[state.speculator];
        match self.seconds_per_unit {
            Some(per_unit) if costly && per_unit > 0.0 => (1..=sizes)
                .map(|n| speculator.draft_seconds(n).unwrap_or(0.0) / per_unit)
                .collect(),
            _ => Vec::new(),
        }
    }

    /// The most `method`'s statistics at any evidence level (the prior for a level not
    /// seen yet) expect a node of a tree to accept; a whole token while the method is still
    /// exploring (fewer than [`PROBE_VERIFICATIONS`] trees verified).
    fn best_per_node(&self, method: SpecMethod) -> f32 {
        let max_nodes = self.config.max_draft_tokens;
        let of_method = || self.stats.iter().filter(|((m, _), _)| *m == method);
        let verified: u64 = of_method().map(|(_, stats)| stats.observations()).sum();
        if verified < PROBE_VERIFICATIONS {
            return 1.0;
        }
        of_method()
            .map(|(_, stats)| stats.best_per_node(max_nodes))
            .fold(
                AcceptanceStats::best_prior(method).best_per_node(max_nodes),
                f32::max,
            )
    }

    /// The cost curve the planner prices a step with: the configured one, refined by the
    /// forwards measured, with what a step costs beside its forward.
    fn planning_cost(&self) -> CostCurve {
        let mut cost = self.config.cost.clone();
        if let (Some(fixed), Some(per_unit)) = (self.step_overhead, self.seconds_per_unit) {
            if per_unit > 0.0 {
                let per_token = self.sampling_per_token.unwrap_or(0.0);
                cost.set_step_overhead(fixed / per_unit, per_token / per_unit);
                cost.set_row_overhead(self.observing_per_row.unwrap_or(0.0) / per_unit);
            }
        }
        cost
    }
}
