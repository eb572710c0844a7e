//! The forward-cost curve the draft planner prices steps with (`CostCurve`): what a forward
//! of so many rows costs, measured at start-up and refined by the engine's own forwards, what
//! a step costs beside its forward (per step, per token it yields and per row it computes),
//! and what a forward of a few rows costs the one-row forwards after it (the after-effect)
//! where one sequence decodes alone.

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
    /// What the host spends beside the forward per row it computes (the speculators reading
    /// each row's logits), in the curve's units.
    per_row: f64,
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
            per_row: 0.0,
        })
    }

    /// Every forward costs the same, whatever its size (an idealised accelerator).
    pub fn flat() -> Self {
        Self {
            points: vec![(1, 1.0)],
            first: vec![(1, 1.0)],
            overhead: (0.0, 0.0),
            per_row: 0.0,
        }
    }

    /// Cost grows in proportion to rows (verification is never cheaper than decoding).
    pub fn linear() -> Self {
        Self {
            points: vec![(1, 1.0), (2, 2.0)],
            first: vec![(1, 1.0), (2, 2.0)],
            overhead: (0.0, 0.0),
            per_row: 0.0,
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

    /// Sets what the host spends beside the forward per row it computes, in the curve's
    /// units (ignored unless finite and non-negative). Where a row's forward is cheap (a GPU)
    /// the speculators' reading of its logits is a large part of what a draft row costs.
    /// A flat curve (one knot) is declared, not measured: it says rows cost nothing, and
    /// keeps saying so, as `observe` leaves it as it is.
    pub fn set_row_overhead(&mut self, per_row: f64) {
        if self.points.len() > 1 && per_row.is_finite() && per_row >= 0.0 {
            self.per_row = per_row;
        }
    }

    /// What a step of `rows` rows that yields `tokens` tokens costs: its forward and the
    /// step's overhead.
    pub fn step(&self, rows: usize, tokens: f64) -> f64 {
        self.cost(rows) + self.overhead.0 + self.overhead.1 * tokens + self.per_row * rows as f64
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
        self.step(base, tokens) + refined.max(floor) + self.per_row * extra as f64
    }

    /// A gain per draft node at or below which no draft pays on a step of `base` rows that
    /// yields `base` tokens: however many nodes (1 ..= `max_extra`) it adds, each expected
    /// to add that many tokens, the rate [`allocate`] maximises does not rise above the
    /// step's without drafts. The engine asks a sequence's drafter for an offer only when
    /// the sequence's best case gains more, so at a load where rows cost more than drafts
    /// return, no drafter prepares anything.
    ///
    /// Nodes of gain `g` pay for some `m` exactly when `g * (cost(base) + fixed overhead +
    /// base rows' overhead) > base * extra(m) / m`, where `extra(m)` is what
    /// [`CostCurve::step_with`] adds for `m` rows: the larger of the refined curve's price
    /// and the first curve's floor, plus each row's overhead. Each of
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
        let per_row = refined.max(floor).max(0.0) + self.per_row;
        base as f64 * per_row / (now + self.overhead.0 + self.per_row * base as f64)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::allocate;
    use crate::budget::tests::offer;
    use kvcache::SeqId;

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
}
