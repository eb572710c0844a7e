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
//! `CostCurve::set_step_overhead`): a part every step pays however many tokens it yields
//! (scheduling, lookups, bookkeeping) and a part per token it yields (sampling). The rows a
//! tree adds are priced at no less than the curve as first measured says, in proportion to
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

/// Cost of one forward as a function of the rows it feeds: piecewise linear between
/// measured points, extended along the last segment.
#[derive(Debug, Clone, PartialEq)]
pub struct CostCurve {
    points: Vec<(usize, f64)>,
    /// The points as first given (measured on a quiet engine, one tree per forward, every
    /// row computing logits): `observe` never moves them. See [`CostCurve::step_with`].
    first: Vec<(usize, f64)>,
    /// What a step costs beside its forward, in the curve's units: a fixed part, and a part
    /// per token the step yields.
    overhead: (f64, f64),
}

impl CostCurve {
    /// A curve through `(rows, seconds)` points; `None` without a point at positive rows or
    /// with a non-finite or negative cost.
    pub fn new(mut points: Vec<(usize, f64)>) -> Option<Self> {
        points.retain(|&(rows, _)| rows > 0);
        if points.is_empty() || points.iter().any(|&(_, c)| !c.is_finite() || c < 0.0) {
            return None;
        }
        points.sort_by_key(|&(rows, _)| rows);
        points.dedup_by_key(|p| p.0);
        Some(Self {
            first: points.clone(),
            points,
            overhead: (0.0, 0.0),
        })
    }

    /// Every forward costs the same, whatever its size (an idealised accelerator).
    pub fn flat() -> Self {
        Self {
            points: vec![(1, 1.0)],
            first: vec![(1, 1.0)],
            overhead: (0.0, 0.0),
        }
    }

    /// Cost grows in proportion to rows (verification is never cheaper than decoding).
    pub fn linear() -> Self {
        Self {
            points: vec![(1, 1.0), (2, 2.0)],
            first: vec![(1, 1.0), (2, 2.0)],
            overhead: (0.0, 0.0),
        }
    }

    /// Measured points.
    pub fn points(&self) -> &[(usize, f64)] {
        &self.points
    }

    /// Sets what a step costs beside its forward, in the curve's units: `fixed` per step and
    /// `per_token` per token it yields (ignored unless both are finite and non-negative).
    pub fn set_step_overhead(&mut self, fixed: f64, per_token: f64) {
        if [fixed, per_token]
            .iter()
            .all(|v| v.is_finite() && *v >= 0.0)
        {
            self.overhead = (fixed, per_token);
        }
    }

    /// What a step of `rows` rows that yields `tokens` tokens costs: its forward and the
    /// step's overhead.
    pub fn step(&self, rows: usize, tokens: f64) -> f64 {
        self.cost(rows) + self.overhead.0 + self.overhead.1 * tokens
    }

    /// Refines the curve with a measured forward of `rows` rows, by 5% of the error each
    /// time so one noisy step changes little. The error moves the whole curve (its level:
    /// longer contexts and a busier host make every size slower), and the knot nearest
    /// `rows` moves once more (its shape), except the one-row knot: most steps run at one
    /// size, and if that knot alone followed its measurements, what a few more rows seem to
    /// cost against it would drift with them (a one-row knot that fell would stop every
    /// draft, and no draft would ever correct it). Curves with one knot (flat) stay as they
    /// are.
    pub fn observe(&mut self, rows: usize, seconds: f64) {
        let predicted = self.cost(rows);
        if self.points.len() < 2 || rows == 0 || !seconds.is_finite() || predicted <= 0.0 {
            return;
        }
        let factor = 1.0 + 0.05 * (seconds / predicted - 1.0).clamp(-0.5, 1.0);
        let distance = |r: usize| ((r as f64).ln() - (rows as f64).ln()).abs();
        let nearest = (0..self.points.len())
            .min_by(|&a, &b| distance(self.points[a].0).total_cmp(&distance(self.points[b].0)))
            .unwrap_or(0);
        for (i, point) in self.points.iter_mut().enumerate() {
            point.1 *= if i == nearest && i > 0 {
                factor * factor
            } else {
                factor
            };
        }
    }

    /// Estimated seconds for a forward of `rows` rows.
    pub fn cost(&self, rows: usize) -> f64 {
        along(&self.points, rows)
    }

    /// What a step of `base` rows with `extra` more rows, yielding `tokens` tokens, costs:
    /// `step(base + extra, tokens)`, except that the extra rows are priced at no less than
    /// the curve as first measured says, in proportion to what `base` rows cost now.
    ///
    /// Steps of many sequences, and prompt rows that compute no logits, teach `observe` a
    /// shape that no tree shows: at 16 clients the refined curve priced 16 -> 32 rows at
    /// 1.37 times, where a step of 16 sequences doubled with 16 draft rows (the first
    /// measurement said 1.93), and trees were granted that did not pay. The shape measured
    /// first is a floor under the price of rows; where the refined curve prices them
    /// higher (one sequence over a long context), it holds.
    pub fn step_with(&self, base: usize, extra: usize, tokens: f64) -> f64 {
        if base == 0 || extra == 0 {
            return self.step(base + extra, tokens);
        }
        let now = self.cost(base);
        let refined = self.cost(base + extra) - now;
        let first = along(&self.first, base);
        let floor = if first > 0.0 {
            now * (along(&self.first, base + extra) / first - 1.0)
        } else {
            0.0
        };
        self.step(base, tokens) + refined.max(floor)
    }

    /// A gain per draft node at or below which no draft pays on a step of `base` rows that
    /// yields `base` tokens: however many nodes (1 ..= `max_extra`) it adds, each expected
    /// to add that many tokens, the rate [`allocate`] maximises does not rise above the
    /// step's without drafts. The engine asks a sequence's drafter for an offer only when
    /// the sequence's best case gains more, so at a load where rows cost more than drafts
    /// return, no drafter prepares anything.
    ///
    /// Nodes of gain `g` pay for some `m` exactly when `g * (cost(base) + fixed overhead) >
    /// base * extra(m) / m`, where `extra(m)` is what [`CostCurve::step_with`] adds for `m`
    /// rows: the larger of the refined curve's price and the first curve's floor. Each of
    /// those two, per row, is least at a knot or at an end (it is linear between knots),
    /// so the larger of their two least values is a lower bound on the least price per row,
    /// and the gain returned is a lower bound too: exact while the curve has not been
    /// refined, never above the true break-even. Infinite when no row may be added.
    pub fn break_even_gain(&self, base: usize, max_extra: usize) -> f64 {
        if max_extra == 0 {
            return f64::INFINITY;
        }
        let base = base.max(1);
        let now = self.cost(base);
        let first_now = along(&self.first, base);
        let mut extras = vec![1, max_extra];
        extras.extend(
            self.points
                .iter()
                .chain(&self.first)
                .map(|&(rows, _)| rows.saturating_sub(base))
                .filter(|&m| m > 1 && m < max_extra),
        );
        let (mut refined, mut floor) = (f64::INFINITY, f64::INFINITY);
        for m in extras {
            let rows = m as f64;
            refined = refined.min((self.cost(base + m) - now) / rows);
            if first_now > 0.0 {
                floor = floor.min(now * (along(&self.first, base + m) / first_now - 1.0) / rows);
            }
        }
        let floor = if floor.is_finite() { floor } else { 0.0 };
        let per_row = refined.max(floor).max(0.0);
        base as f64 * per_row / (now + self.overhead.0)
    }

    /// How many rows (at most `max`) a forward of `base` rows can take on while its estimated
    /// cost grows by at most `share` of itself.
    pub fn rows_within(&self, base: usize, share: f64, max: usize) -> usize {
        let limit = self.cost(base.max(1)) * (1.0 + share);
        (0..max)
            .take_while(|k| self.cost(base + k + 1) <= limit)
            .count()
    }
}

/// `points`' piecewise-linear value at `rows`, extended along the last segment.
fn along(points: &[(usize, f64)], rows: usize) -> f64 {
    let p = points;
    if p.len() == 1 {
        return p[0].1;
    }
    let i = match p.binary_search_by_key(&rows, |&(r, _)| r) {
        Ok(i) => return p[i].1,
        Err(0) => 0,
        Err(i) if i >= p.len() => p.len() - 2,
        Err(i) => i - 1,
    };
    let ((r0, c0), (r1, c1)) = (p[i], p[i + 1]);
    let slope = (c1 - c0) / (r1 - r0) as f64;
    (c0 + slope * (rows as f64 - r0 as f64)).max(f64::MIN_POSITIVE)
}

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
mod tests {
    use super::*;

    fn offer(expected: &[f32]) -> DraftOffer {
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
    fn curve_interpolates_and_extrapolates() {
        let c = CostCurve::new(vec![(1, 1.0), (4, 2.5), (8, 4.5)]).unwrap();
        assert_eq!(c.cost(1), 1.0);
        assert!((c.cost(2) - 1.5).abs() < 1e-9);
        assert!((c.cost(16) - 8.5).abs() < 1e-9);
        assert!(CostCurve::new(vec![(0, 1.0)]).is_none());
        assert!(CostCurve::new(vec![(1, f64::NAN)]).is_none());
        assert_eq!(CostCurve::flat().cost(100), 1.0);
    }

    #[test]
    fn observations_move_the_level_and_the_shape_but_not_against_one_row() {
        let mut c = CostCurve::new(vec![(1, 1.0), (8, 2.0), (64, 10.0)]).unwrap();
        // Only one-row forwards run, each at half the predicted cost: the level follows,
        // and what eight rows cost against one stays as measured.
        for _ in 0..300 {
            c.observe(1, c.cost(1) * 0.5);
        }
        assert!(c.cost(1) < 0.01, "{:?}", c.points());
        assert!(
            (c.cost(8) / c.cost(1) - 2.0).abs() < 1e-9,
            "{:?}",
            c.points()
        );
        // Eight-row forwards at 4.0: the curve reaches them there, and eight rows now cost
        // more against one and against 64 than first measured.
        let mut c = CostCurve::new(vec![(1, 1.0), (8, 2.0), (64, 10.0)]).unwrap();
        for _ in 0..200 {
            c.observe(8, 4.0);
        }
        assert!((c.cost(8) - 4.0).abs() < 0.2, "{:?}", c.points());
        assert!(c.cost(8) / c.cost(1) > 2.5, "{:?}", c.points());
        assert!(c.cost(64) / c.cost(8) < 4.0, "{:?}", c.points());
        let mut flat = CostCurve::flat();
        flat.observe(10, 5.0);
        assert_eq!(flat, CostCurve::flat());
    }

    #[test]
    fn rows_are_priced_at_least_as_first_measured() {
        // First measured: 16 -> 32 rows doubles a step.
        let mut c = CostCurve::new(vec![(1, 1.0), (16, 4.0), (32, 8.0)]).unwrap();
        // Steps of 16 rows (sixteen sequences) that take twice what the curve said pull the
        // knot at 16 up; the refined curve then prices 16 more rows at a fraction of a step.
        for _ in 0..200 {
            c.observe(16, 8.0);
        }
        let (now, refined) = (c.cost(16), c.cost(32) - c.cost(16));
        assert!(refined < 0.5 * now, "{:?}", c.points());
        // The price of the 16 rows stays what the first curve says against the step now.
        assert!((c.step_with(16, 16, 16.0) - 2.0 * now).abs() < 1e-9 * now);
        // So sixteen nodes that each carry 0.9 expected tokens do not pay (16 + 14.4 tokens
        // for twice the cost), though the refined shape alone would grant them all.
        let expected: Vec<f32> = (1..=16).map(|n| 0.9 * n as f32).collect();
        let o = offer(&expected);
        let offers = [(SeqId(1), &o)];
        assert_eq!(allocate(&offers, 16, 16, 64, &c), vec![0]);
        let mut bent = CostCurve::new(c.points().to_vec()).unwrap();
        bent.observe(1, bent.cost(1));
        assert_eq!(allocate(&offers, 16, 16, 64, &bent), vec![16]);
        // Where the refined curve prices rows higher than first measured, it holds.
        let mut dear = CostCurve::new(vec![(1, 1.0), (2, 1.1), (8, 1.5)]).unwrap();
        for _ in 0..200 {
            dear.observe(8, 3.0);
        }
        assert!((dear.step_with(1, 7, 1.0) - dear.cost(8)).abs() < 1e-9);
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
