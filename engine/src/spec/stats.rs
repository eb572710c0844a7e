//! Online acceptance statistics: for one method and evidence level, the expected number of
//! accepted draft tokens as a function of the tree size, learnt from verification outcomes
//! (an exponential moving average per size bucket, starting from a pessimistic prior: below
//! what the drafters were measured to accept on Spec-Bench, so a method without evidence
//! gets small trees and earns larger ones with observed acceptance). The scheduler uses
//! these curves to decide how many nodes each sequence's tree gets.

/// Largest tree size of each bucket.
const BUCKET_UPPER: [usize; 8] = [1, 2, 4, 8, 16, 32, 64, usize::MAX];
/// Expected accepted tokens before any observation (SmolLM2-135M on Spec-Bench accepted
/// 0.35-0.5 tokens from 2-node trees, 0.45-0.65 from 4, 0.55-0.7 from 8 and 0.65-0.8 from
/// 16: `benches/README.md`).
const PRIOR: [f32; 8] = [0.25, 0.35, 0.45, 0.55, 0.65, 0.75, 0.85, 0.95];
/// Weight of a new observation once a bucket has many.
const ALPHA: f32 = 0.05;
/// The prior counts as this many observations: a bucket's first observations move it
/// as a mean would (weight `1 / (seen + PRIOR_WEIGHT)`), later ones as the moving average.
const PRIOR_WEIGHT: f32 = 3.0;
/// A size bucket never tried is expected to add, per node beyond the last tried bucket,
/// this share of what each node of that bucket added (a chain's deeper nodes accept less
/// than its first ones). Without it a method whose 2-node trees accept 1.4 tokens would be
/// expected to gain nothing from a third or fourth node, and would never learn otherwise.
const EXTRAPOLATION: f32 = 0.8;
/// Exploration bonus of a size bucket without observations, shrinking as one over the
/// square root of its observations (an upper confidence bound). With a pessimistic prior
/// alone a method whose small trees would pay never drafts, and so never shows that they
/// do; the bonus buys a few small trees early, which the evidence then keeps or stops.
const EXPLORATION: f32 = 0.15;

use crate::spec::methods::prediction;
use crate::spec::SpecMethod;

/// Weight of a new measurement in the moving averages of measured costs.
const COST_SMOOTHING: f64 = 0.2;

pub(crate) fn smooth(average: &mut Option<f64>, sample: f64) {
    if !sample.is_finite() || sample < 0.0 {
        return;
    }
    *average = Some(match *average {
        Some(a) => a + COST_SMOOTHING * (sample - a),
        None => sample,
    });
}

/// Expected accepted tokens by tree size for one method.
#[derive(Debug, Clone, PartialEq)]
pub struct AcceptanceStats {
    expected: [f32; 8],
    /// Observations that reached each bucket.
    seen: [u32; 8],
    observations: u64,
}

impl Default for AcceptanceStats {
    fn default() -> Self {
        Self {
            expected: PRIOR,
            seen: [0; 8],
            observations: 0,
        }
    }
}

fn bucket(nodes: usize) -> usize {
    BUCKET_UPPER
        .iter()
        .position(|&upper| nodes <= upper)
        .unwrap_or(BUCKET_UPPER.len() - 1)
}

/// The most any tree expected to accept `expected[n - 1]` tokens with n nodes accepts per
/// node (the steepest slope from the origin of that curve).
pub fn best_per_node(expected: &[f32]) -> f32 {
    (expected.iter().enumerate())
        .map(|(i, &e)| e / (i + 1) as f32)
        .fold(0.0, f32::max)
}

/// Expected accepted tokens at each bucket's size for a chain each of whose nodes, given
/// its parent, is accepted with probability `rate`.
fn chain_prior(rate: f32) -> [f32; 8] {
    let rate = rate.clamp(0.0, 0.999);
    BUCKET_UPPER.map(|upper| {
        let nodes = upper.min(128) as i32;
        rate * (1.0 - rate.powi(nodes)) / (1.0 - rate)
    })
}

impl AcceptanceStats {
    /// `method`'s statistics at `evidence` before any observation: the pessimistic prior,
    /// except for a request's prediction. A client sends that on purpose and an output that
    /// follows it follows it for long, so its chains start from the acceptance its
    /// evidence level promises ([`prediction::prior_rate`]): a right prediction drafts from
    /// the first request even where rows are dear, and the evidence then keeps or stops it.
    pub fn prior(method: SpecMethod, evidence: u8) -> Self {
        let expected = match method {
            SpecMethod::Prediction => chain_prior(prediction::prior_rate(evidence)),
            _ => PRIOR,
        };
        Self {
            expected,
            seen: [0; 8],
            observations: 0,
        }
    }

    /// The most hopeful of `method`'s priors, whatever the evidence (what a method not seen
    /// yet may do at best).
    pub fn best_prior(method: SpecMethod) -> Self {
        match method {
            SpecMethod::Prediction => Self {
                expected: chain_prior(prediction::BEST_PRIOR_RATE),
                ..Self::default()
            },
            _ => Self::default(),
        }
    }

    /// Records that a tree of `nodes` drafted nodes had `accepted` of them accepted, where
    /// only the count is known: each smaller size is taken to have accepted as many, up to
    /// its own size (an upper bound; [`AcceptanceStats::record_tree`] knows better).
    #[cfg(test)]
    pub fn record(&mut self, nodes: usize, accepted: usize) {
        self.record_tree(nodes, |upper| accepted.min(upper));
    }

    /// Records a verified tree of `nodes` drafted nodes (best first, each node's parent
    /// before it) where `accepted_within(n)` is how many draft tokens the tree of its first
    /// n nodes would have accepted: its accepted path up to the first node beyond them.
    /// Smaller trees are prefixes of this one, so smaller buckets learn what they would
    /// have accepted, not an upper bound of it: a wide tree accepting its fourth candidate
    /// says nothing good about its first one alone.
    pub fn record_tree(&mut self, nodes: usize, accepted_within: impl Fn(usize) -> usize) {
        if nodes == 0 {
            return;
        }
        let last = bucket(nodes);
        for ((expected, seen), &upper) in self
            .expected
            .iter_mut()
            .zip(&mut self.seen)
            .zip(&BUCKET_UPPER)
            .take(last + 1)
        {
            let got = accepted_within(upper.min(nodes)).min(upper) as f32;
            let alpha = ALPHA.max(1.0 / (*seen as f32 + PRIOR_WEIGHT));
            *expected += alpha * (got - *expected);
            *seen = seen.saturating_add(1);
        }
        self.observations += 1;
    }

    /// Verification outcomes recorded.
    pub fn observations(&self) -> u64 {
        self.observations
    }

    /// The most a tree of at most `max_nodes` nodes is expected to accept per node (the
    /// steepest slope from the origin of [`AcceptanceStats::curve`]): no node of such a tree
    /// is worth more to the planner.
    pub fn best_per_node(&self, max_nodes: usize) -> f32 {
        best_per_node(&self.curve(max_nodes))
    }

    /// Expected accepted tokens for 1..=`max_nodes` nodes, with each bucket's exploration
    /// bonus: linear between the buckets' upper sizes, non-decreasing, never above the
    /// number of nodes. A bucket never tried expects at least what the last two buckets'
    /// slope, damped by [`EXTRAPOLATION`], reaches.
    pub fn curve(&self, max_nodes: usize) -> Vec<f32> {
        let mut knots: Vec<(f32, f32)> = vec![(0.0, 0.0)];
        for (b, &upper) in BUCKET_UPPER.iter().enumerate() {
            let x = if upper == usize::MAX {
                128.0
            } else {
                upper as f32
            };
            let mut value = self.expected[b];
            if self.seen[b] == 0 && b > 0 && self.seen[b - 1] > 0 {
                let (x1, y1) = knots[knots.len() - 1];
                let (x0, y0) = knots[knots.len() - 2];
                let slope = (y1 - y0) / (x1 - x0);
                value = value.max(y1 + EXTRAPOLATION * slope.max(0.0) * (x - x1));
            }
            let bonus = EXPLORATION / (1.0 + self.seen[b] as f32).sqrt();
            knots.push((x, value.min(x) + bonus));
        }
        let mut best = 0.0f32;
        (1..=max_nodes)
            .map(|n| {
                let x = n as f32;
                let i = knots.iter().rposition(|k| k.0 <= x).unwrap_or(0);
                let value = match knots.get(i + 1) {
                    Some(&(x1, y1)) => {
                        let (x0, y0) = knots[i];
                        y0 + (y1 - y0) * (x - x0) / (x1 - x0)
                    }
                    None => knots[i].1,
                };
                best = best.max(value);
                best.min(x)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prediction_that_is_followed_starts_hopeful_and_learns_otherwise() {
        // Level 16: a 5-token match near the anchor. On a CPU where a second row costs 0.45
        // of a step and eight cost 3.6 steps, its 8-node chain must pay from the start.
        let mut s = AcceptanceStats::prior(SpecMethod::Prediction, 16);
        let c = s.curve(8);
        assert!((1.0 + c[7]) / 3.6 > 1.5, "{c:?}");
        assert!(c[0] > 0.45, "{c:?}");
        assert_eq!(
            AcceptanceStats::prior(SpecMethod::PromptLookup, 16),
            AcceptanceStats::default()
        );
        let best = AcceptanceStats::best_prior(SpecMethod::Prediction).best_per_node(128);
        assert!(best >= s.best_per_node(128), "{best}");
        // Predictions that are never followed lose their trees.
        for _ in 0..60 {
            s.record(8, 0);
        }
        assert!(s.curve(8)[7] < 0.5, "{:?}", s.curve(8));
    }

    #[test]
    fn curve_is_monotone_capped_and_learns() {
        let mut s = AcceptanceStats::default();
        let c = s.curve(100);
        assert!(c.windows(2).all(|w| w[0] <= w[1]));
        assert!(c.iter().enumerate().all(|(i, &e)| e <= (i + 1) as f32));
        for _ in 0..500 {
            s.record(16, 6);
        }
        assert!((s.curve(16)[15] - 6.0).abs() < 0.1);
        for _ in 0..500 {
            s.record(4, 0);
        }
        assert!(s.curve(4)[3] < 0.1);
    }

    #[test]
    fn sizes_without_evidence_get_a_bonus_that_evidence_removes() {
        let mut s = AcceptanceStats::default();
        let explored = s.curve(1)[0];
        assert!(explored > PRIOR[0] + 0.1, "{explored}");
        for _ in 0..100 {
            s.record(1, 0);
        }
        // After a hundred failures one node is expected to accept almost nothing.
        assert!(s.curve(1)[0] < 0.05, "{:?}", s.curve(1));
    }

    #[test]
    fn no_node_is_worth_more_than_the_best_per_node() {
        let mut s = AcceptanceStats::default();
        for _ in 0..50 {
            s.record(1, 0);
            s.record(4, 3);
        }
        let best = s.best_per_node(16);
        let c = s.curve(16);
        assert!(c
            .iter()
            .enumerate()
            .all(|(i, &e)| e <= best * (i + 1) as f32 + 1e-6));
        // Reached by a tree of more than one node: one node alone accepts half the time,
        // while two nodes (a prefix of four) were both accepted.
        assert!(c
            .iter()
            .enumerate()
            .skip(1)
            .any(|(i, &e)| (e - best * (i + 1) as f32).abs() < 1e-6));
        assert!(best > c[0] + 0.3, "{best} {c:?}");
    }

    #[test]
    fn a_wide_trees_later_candidates_do_not_credit_its_first() {
        // Four alternatives for the next token; the fourth is always the one accepted.
        let (mut exact, mut bound) = (AcceptanceStats::default(), AcceptanceStats::default());
        let accepted_path = [4usize];
        for _ in 0..200 {
            exact.record_tree(4, |n| accepted_path.iter().take_while(|&&i| i <= n).count());
            bound.record(4, 1);
        }
        assert!(exact.curve(1)[0] < 0.05, "{:?}", exact.curve(4));
        assert!(
            (exact.curve(4)[3] - 1.0).abs() < 0.05,
            "{:?}",
            exact.curve(4)
        );
        // Counting alone credits the first node with the fourth's acceptance.
        assert!(bound.curve(1)[0] > 0.95, "{:?}", bound.curve(4));
    }

    #[test]
    fn first_observations_count_like_a_mean() {
        let mut s = AcceptanceStats::default();
        for _ in 0..3 {
            s.record(2, 2);
        }
        // A moving average alone (weight 0.05) would still be near the prior of 0.35.
        let two = s.curve(2)[1];
        assert!(two > 1.4, "{two}");
    }

    #[test]
    fn a_size_never_tried_is_extrapolated_then_learnt() {
        let mut s = AcceptanceStats::default();
        for _ in 0..200 {
            s.record(1, 1);
            s.record(2, 2);
        }
        // One and two nodes are always accepted: four nodes, never tried, are expected to
        // add most of what the second node added, not to fall back to the prior.
        let c = s.curve(4);
        assert!(c[3] > 3.0, "{c:?}");
        assert!(c[3] <= 4.0, "{c:?}");
        // Eight nodes are two buckets away from any evidence: still the prior.
        assert!(s.curve(8)[7] < c[3] + 0.2, "{:?}", s.curve(8));
        // Tried, four nodes turn out to accept no more than two.
        for _ in 0..200 {
            s.record(4, 2);
        }
        let c = s.curve(4);
        assert!((c[3] - 2.0).abs() < 0.1, "{c:?}");
    }
}
