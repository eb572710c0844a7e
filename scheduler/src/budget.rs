//! Draft budgets that adapt to load. Speculation pays only while verifying more rows costs
//! less than the extra tokens it is expected to accept, so each step the scheduler splits
//! extra tree nodes between the decoding sequences to maximise
//!
//! ```text
//!            work done this step       base rows + sum_i E_i(b_i)
//!   rate  =  -------------------  =  ---------------------------------
//!            cost of the forward      cost(base rows + sum_i b_i)
//! ```
//!
//! where every planned row counts as one token of useful work (a decode row yields a token, a
//! prompt row computes one), `E_i(b)` is sequence i's expected accepted draft tokens with a
//! tree of b nodes (its
//! drafter's online statistics, supplied by the engine) and `cost` the measured forward-cost
//! curve plus what a step costs beside its forward (measured by the engine,
//! `CostCurve::set_step_overhead`, `set_row_overhead`): a part every step pays however many
//! tokens it yields (scheduling, lookups, bookkeeping), a part per token it yields
//! (sampling) and a part per row it computes (the speculators reading each row's logits).
//! The rows a tree adds are priced at no less than the curve as first measured says, in
//! proportion to
//! what the step costs now (`CostCurve::step_with`). Marginal gains are taken best first;
//! the number of extra nodes kept is the one
//! that maximises the rate, so when extra rows are expensive (a compute-bound batch, or a
//! CPU matmul that re-reads weights per row) every budget is zero. A drafter that costs time
//! of its own (a draft model's forwards) adds what its tree of the granted size costs to
//! draft to the denominator; the plan with such drafters is compared against the plan
//! without them.
//! A step that gives a prompt its first token keeps its drafts within 2% of its cost
//! (`CostCurve::rows_within`): that request waits on the step and gains nothing from it.

use std::collections::HashMap;

use kvcache::SeqId;

pub use crate::cost_curve::CostCurve;

/// What one decoding sequence could gain from a draft tree this step.
#[derive(Debug, Clone, PartialEq)]
pub struct DraftOffer {
    /// `expected_accepted[n - 1]`: expected accepted draft tokens with a tree of n nodes,
    /// for n = 1 ..= the most nodes its drafter can use now.
    pub expected_accepted: Vec<f32>,
    /// `draft_cost[n - 1]`: what drafting a tree of n nodes costs, in the units of the cost
    /// curve, beside the forward's own rows (a draft model's forwards: more of them for a
    /// deeper tree). Empty for drafters that only look things up; sizes past its end cost
    /// what its last entry costs.
    pub draft_cost: Vec<f64>,
}

impl DraftOffer {
    /// An offer from a drafter whose drafting costs nothing measurable.
    pub fn free(expected_accepted: Vec<f32>) -> Self {
        Self {
            expected_accepted,
            draft_cost: Vec::new(),
        }
    }

    /// Whether drafting costs nothing beside the forward's rows.
    pub fn is_free(&self) -> bool {
        self.draft_cost.iter().all(|&c| c <= 0.0)
    }

    /// What drafting `nodes` nodes costs (0 for none).
    pub fn cost_of(&self, nodes: usize) -> f64 {
        match (nodes, self.draft_cost.last()) {
            (0, _) | (_, None) => 0.0,
            (n, Some(&last)) => self.draft_cost.get(n - 1).copied().unwrap_or(last).max(0.0),
        }
    }
}

/// Inputs of the draft-budget decision for one step.
#[derive(Debug, Clone, PartialEq)]
pub struct DraftInputs {
    /// The forward-cost curve.
    pub cost: CostCurve,
    /// Offers of the sequences that may draft (caught up and speculating).
    pub offers: HashMap<SeqId, DraftOffer>,
}

/// Splits at most `max_extra` extra rows between `offers` (sequence, offer) on top of a
/// forward of `base_rows` rows that yields `base_tokens` tokens. Returns one budget per
/// offer, in order.
pub fn allocate(
    offers: &[(SeqId, &DraftOffer)],
    base_rows: usize,
    base_tokens: usize,
    max_extra: usize,
    cost: &CostCurve,
) -> Vec<usize> {
    let all = best_plan(offers, |_| true, base_rows, base_tokens, max_extra, cost);
    if offers.iter().all(|(_, o)| o.is_free()) {
        return all.budgets;
    }
    let free_only = best_plan(
        offers,
        DraftOffer::is_free,
        base_rows,
        base_tokens,
        max_extra,
        cost,
    );
    if free_only.rate >= all.rate {
        free_only.budgets
    } else {
        all.budgets
    }
}

/// Budgets and the rate they reach.
struct Plan {
    budgets: Vec<usize>,
    rate: f64,
}

/// The best prefix of the marginal gains of the offers `include` admits.
fn best_plan(
    offers: &[(SeqId, &DraftOffer)],
    include: impl Fn(&DraftOffer) -> bool,
    base_rows: usize,
    base_tokens: usize,
    max_extra: usize,
    cost: &CostCurve,
) -> Plan {
    // Every (sequence, n-th node) marginal gain, best first. Each sequence's gains are the
    // slopes of the concave envelope of its curve, so they never increase and taking the
    // best ones in order always gives each sequence a prefix of its nodes.
    let mut marginal: Vec<(f32, usize)> = Vec::new();
    for (i, (_, offer)) in offers.iter().enumerate() {
        if !include(offer) {
            continue;
        }
        for gain in concave_gains(&offer.expected_accepted) {
            marginal.push((gain, i));
        }
    }
    marginal.sort_by(|a, b| b.0.total_cmp(&a.0));
    marginal.truncate(max_extra);
    let base_rate = base_tokens as f64 / cost.step(base_rows.max(1), base_tokens as f64);
    let (mut best_rate, mut best_count) = (base_rate, 0);
    let mut tokens = base_tokens as f64;
    let mut drafting = 0.0;
    let mut nodes = vec![0; offers.len()];
    for (m, &(gain, i)) in marginal.iter().enumerate() {
        tokens += f64::from(gain);
        let offer = offers[i].1;
        nodes[i] += 1;
        drafting += offer.cost_of(nodes[i]) - offer.cost_of(nodes[i] - 1);
        let rate = tokens / (cost.step_with(base_rows, m + 1, tokens) + drafting);
        if rate > best_rate * (1.0 + 1e-9) {
            best_rate = rate;
            best_count = m + 1;
        }
    }
    let mut budgets = vec![0; offers.len()];
    for &(_, i) in &marginal[..best_count] {
        budgets[i] += 1;
    }
    Plan {
        budgets,
        rate: best_rate,
    }
}

/// Marginal gains of the smallest concave curve over `(0, 0), (1, e[0]), (2, e[1]), ...`:
/// non-increasing, and summing to the best value reachable with each number of nodes.
pub fn concave_gains(expected: &[f32]) -> Vec<f32> {
    let points: Vec<(f32, f32)> = std::iter::once((0.0, 0.0))
        .chain(
            expected
                .iter()
                .enumerate()
                .map(|(i, &e)| ((i + 1) as f32, e.max(0.0))),
        )
        .collect();
    // Upper hull, left to right.
    let mut hull: Vec<(f32, f32)> = Vec::with_capacity(points.len());
    for &p in &points {
        while hull.len() >= 2 {
            let (a, b) = (hull[hull.len() - 2], hull[hull.len() - 1]);
            let cross = (b.0 - a.0) * (p.1 - a.1) - (b.1 - a.1) * (p.0 - a.0);
            if cross >= 0.0 {
                hull.pop();
            } else {
                break;
            }
        }
        hull.push(p);
    }
    let mut gains = Vec::with_capacity(expected.len());
    for segment in hull.windows(2) {
        let (a, b) = (segment[0], segment[1]);
        let slope = ((b.1 - a.1) / (b.0 - a.0)).max(0.0);
        for _ in 0..(b.0 - a.0).round() as usize {
            gains.push(slope);
        }
    }
    gains
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// An offer that costs nothing to draft (shared with the cost curve's tests).
    pub(crate) fn offer(expected: &[f32]) -> DraftOffer {
        DraftOffer::free(expected.to_vec())
    }

    #[test]
    fn a_step_overhead_makes_rows_relatively_cheaper() {
        // Two rows cost 1.5 one row: 0.4 expected tokens for one node do not pay (1.4 / 1.5
        // tokens per unit against 1), until every step also costs one unit beside its
        // forward (1.4 / 2.5 against 1 / 2). A cost per token yielded weighs on both alike
        // and changes nothing here (1.4 / 3.2 against 1 / 2.5).
        let mut cost = CostCurve::new(vec![(1, 1.0), (2, 1.5), (8, 4.5)]).unwrap();
        let o = offer(&[0.4]);
        let offers = [(SeqId(1), &o)];
        assert_eq!(allocate(&offers, 1, 1, 8, &cost), vec![0]);
        cost.set_step_overhead(1.0, 0.0);
        assert_eq!(cost.step(2, 1.0), 2.5);
        assert_eq!(allocate(&offers, 1, 1, 8, &cost), vec![1]);
        cost.set_step_overhead(1.0, 0.5);
        assert!((cost.step(2, 1.4) - 3.2).abs() < 1e-9);
        assert_eq!(allocate(&offers, 1, 1, 8, &cost), vec![1]);
        cost.set_step_overhead(0.0, 0.5);
        assert_eq!(allocate(&offers, 1, 1, 8, &cost), vec![0]);
        cost.set_step_overhead(f64::NAN, 0.0);
        assert_eq!(cost.step(1, 1.0), 1.5);
    }

    #[test]
    fn a_row_overhead_makes_rows_dearer() {
        // Rows nearly free on the curve (a GPU's): 16 nodes of 0.3 expected tokens each pay
        // on top of one row. Once the host spends 0.5 units reading every row, a node's 0.3
        // tokens cost more than the step's own token does (0.3 / 0.508 against 1 / 1.5).
        let mut cost = CostCurve::new(vec![(1, 1.0), (64, 1.5)]).unwrap();
        let expected: Vec<f32> = (1..=16).map(|n| 0.3 * n as f32).collect();
        let o = offer(&expected);
        let offers = [(SeqId(1), &o)];
        assert_eq!(allocate(&offers, 1, 1, 16, &cost), vec![16]);
        assert!(cost.break_even_gain(1, 16) < 0.3);
        cost.set_row_overhead(0.5);
        assert!((cost.step(2, 1.0) - (cost.cost(2) + 1.0)).abs() < 1e-12);
        let three_more = cost.step_with(1, 3, 1.0) - cost.step(1, 1.0);
        assert!((three_more - (cost.cost(4) - cost.cost(1) + 1.5)).abs() < 1e-9);
        assert_eq!(allocate(&offers, 1, 1, 16, &cost), vec![0]);
        assert!(cost.break_even_gain(1, 16) > 0.3);
        // Not a number, or below zero: ignored.
        cost.set_row_overhead(f64::NAN);
        cost.set_row_overhead(-1.0);
        assert!((cost.step(1, 1.0) - 1.5).abs() < 1e-12);
        // A flat curve declares rows free and keeps them so.
        let mut flat = CostCurve::flat();
        flat.set_row_overhead(0.5);
        assert_eq!(flat.step(8, 1.0), flat.step(1, 1.0));
        assert_eq!(allocate(&offers, 1, 1, 16, &flat), vec![16]);
    }

    #[test]
    fn concave_gains_never_increase_and_reach_every_plateau() {
        let gains = concave_gains(&[0.5, 0.8, 1.1, 1.1, 1.4, 1.4, 1.4, 1.4]);
        assert_eq!(gains.len(), 8);
        assert!(gains.windows(2).all(|w| w[0] >= w[1] - 1e-6), "{gains:?}");
        assert!((gains.iter().sum::<f32>() - 1.4).abs() < 1e-5);
        assert!(
            gains[4] > 0.0,
            "a flat step must not end the curve: {gains:?}"
        );
    }

    #[test]
    fn expensive_rows_give_zero_budgets() {
        let a = offer(&[0.8, 1.5, 2.0, 2.3]);
        let b = offer(&[0.5, 0.9]);
        let offers = [(SeqId(1), &a), (SeqId(2), &b)];
        assert_eq!(
            allocate(&offers, 2, 2, 64, &CostCurve::linear()),
            vec![0, 0]
        );
    }

    #[test]
    fn free_rows_give_every_useful_node() {
        let a = offer(&[0.8, 1.5, 2.0, 2.0]);
        let b = offer(&[0.5, 0.9]);
        let offers = [(SeqId(1), &a), (SeqId(2), &b)];
        // The 4th node of `a` adds nothing, so it is not taken.
        assert_eq!(allocate(&offers, 2, 2, 64, &CostCurve::flat()), vec![3, 2]);
        // The token budget caps the extra rows; best gains go first.
        assert_eq!(allocate(&offers, 2, 2, 2, &CostCurve::flat()), vec![2, 0]);
    }

    #[test]
    fn a_cheap_start_then_expensive_rows_stop_at_the_knee() {
        // Up to 8 rows cost the same, then each row costs as much as a forward.
        let cost = CostCurve::new(vec![(1, 1.0), (8, 1.0), (9, 2.0), (10, 3.0)]).unwrap();
        let a = offer(&[0.9, 1.7, 2.4, 3.0, 3.5, 3.9, 4.2, 4.4, 4.5, 4.6, 4.7]);
        let offers = [(SeqId(1), &a)];
        assert_eq!(allocate(&offers, 1, 1, 64, &cost), vec![7]);
    }

    #[test]
    fn a_costly_drafter_drafts_only_when_it_pays_for_itself() {
        let cheap = offer(&[0.6, 1.0]);
        let mut model = offer(&[0.9, 1.7, 2.4, 3.0]);
        let offers = |m: &DraftOffer| [(SeqId(1), cheap.clone()), (SeqId(2), m.clone())];
        let run = |m: &DraftOffer| {
            let o = offers(m);
            let refs: Vec<(SeqId, &DraftOffer)> = o.iter().map(|(s, o)| (*s, o)).collect();
            allocate(&refs, 2, 2, 64, &CostCurve::flat())
        };
        // Free rows, drafting costs a tenth of a forward: everyone drafts.
        model.draft_cost = vec![0.1];
        assert_eq!(run(&model), vec![2, 4]);
        // Drafting costs three forwards: 3 expected tokens do not pay for it, the cheap
        // drafter still drafts.
        model.draft_cost = vec![3.0];
        assert_eq!(run(&model), vec![2, 0]);
    }

    #[test]
    fn a_drafter_whose_cost_grows_with_depth_gets_the_size_that_pays_best() {
        // One forward of the draft model per node (a chain), each half a target forward,
        // while verifying rows is free: accepting 0.9, 1.7, 2.4, 3.0 tokens.
        let mut model = offer(&[0.9, 1.7, 2.4, 3.0]);
        model.draft_cost = vec![0.5, 1.0, 1.5, 2.0];
        let offers = [(SeqId(1), &model)];
        // Rates (1 + E) / (1 + cost): 1.27, 1.35, 1.36, 1.33.
        assert_eq!(allocate(&offers, 1, 1, 64, &CostCurve::flat()), vec![3]);
        // At 0.8 a forward only one node pays (rates 1.06, 1.04, 1.0, 0.95)...
        model.draft_cost = vec![0.8, 1.6, 2.4, 3.2];
        let offers = [(SeqId(1), &model)];
        assert_eq!(allocate(&offers, 1, 1, 64, &CostCurve::flat()), vec![1]);
        // ... and charged as one fixed cost, the deepest tree's, none would.
        model.draft_cost = vec![3.2];
        let offers = [(SeqId(1), &model)];
        assert_eq!(allocate(&offers, 1, 1, 64, &CostCurve::flat()), vec![0]);
        assert_eq!(model.cost_of(0), 0.0);
        assert_eq!(model.cost_of(9), 3.2);
    }
}
