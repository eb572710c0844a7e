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
            // Without drafts there is no evidence, so a ratio that failures pushed below
            // what drafting needs would never rise again: it drifts back towards the
            // method's average, and the sequence tries a small tree now and then.
            for (_, ratio) in &mut state.ratios {
                *ratio += RATIO_RECOVERY * (1.0 - *ratio);
            }
            state.available = 0;
            let speculator = &self.speculators[state.speculator];
            let costly = speculator.draft_seconds(1).is_some() && state.drafter.needs_speculator();
            let forced = forced.min(state.max_draft);
            if forced == 0 && !costly {
                // The best any of its sources could do (a prediction is one of them).
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
                if f64::from(best.min(1.0)) <= break_even {
                    continue;
                }
            }
            let ctx = DraftContext { tokens };
            state.available = state.drafter.prepare(&ctx).min(state.max_draft);
            if state.available == 0 && forced == 0 {
                continue;
            }
            // Whether this step's tree is the speculator's costly work (a prediction drafts
            // for free whatever the method).
            let costly = speculator.draft_seconds(1).is_some() && state.drafter.needs_speculator();
            let method = state.drafter.method();
            let ratio = state.ratio(method);
            let key = (method, state.drafter.evidence());
            let stats =
                (self.stats.entry(key)).or_insert_with(|| AcceptanceStats::prior(key.0, key.1));
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
            // The same test as before `prepare`, on this step's own curve: an offer none of
            // whose trees could pay for its rows would only cost the planner's time.
            let per_node = crate::spec::stats::best_per_node(&expected_accepted);
            if forced == 0 && !costly && f64::from(per_node.min(1.0)) <= break_even {
                continue;
            }
            let draft_cost = match self.seconds_per_unit {
                Some(per_unit) if costly && per_unit > 0.0 => (1..=expected_accepted.len())
                    .map(|n| speculator.draft_seconds(n).unwrap_or(0.0) / per_unit)
                    .collect(),
                _ => Vec::new(),
            };
            offers.insert(
                seq,
                DraftOffer {
                    expected_accepted,
                    draft_cost,
                },
            );
        }
        (!offers.is_empty()).then_some(DraftInputs { cost, offers })
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
