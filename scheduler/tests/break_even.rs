//! `CostCurve::break_even_gain` against the planner it stands in for: on every curve, base
//! and gain tried, nodes that gain no more than the break-even are never granted by
//! `budget::allocate`, and on a curve not yet refined, nodes that gain more always are.

use scheduler::budget::allocate;
use scheduler::{CostCurve, DraftOffer, SeqId};

/// Nodes `allocate` grants one sequence whose every one of `max_extra` nodes is expected to
/// add `gain` tokens, on a step of `base` rows that yields `base` tokens.
fn granted(cost: &CostCurve, base: usize, max_extra: usize, gain: f32) -> usize {
    let offer = DraftOffer::free((1..=max_extra).map(|n| gain * n as f32).collect());
    allocate(&[(SeqId(1), &offer)], base, base, max_extra, cost)[0]
}

/// Curves shaped like measured CPU forwards (a slow first row, cheap rows up to a point,
/// then dearer ones), a line, a flat one, and one with a knot that makes a few more rows
/// cheaper per row than one, each with and without a step overhead.
fn curves() -> Vec<CostCurve> {
    let shapes = [
        vec![
            (1, 2.4),
            (2, 2.7),
            (4, 3.1),
            (8, 4.1),
            (16, 7.0),
            (32, 13.0),
            (64, 26.0),
            (128, 55.0),
        ],
        vec![(1, 1.0), (2, 2.0)],
        vec![(1, 1.0)],
        vec![(1, 1.0), (2, 1.9), (10, 2.0), (40, 8.0)],
    ];
    let mut curves = Vec::new();
    for shape in shapes {
        let curve = CostCurve::new(shape).expect("a curve");
        let mut with_overhead = curve.clone();
        with_overhead.set_step_overhead(0.5, 0.02);
        curves.push(curve);
        curves.push(with_overhead);
    }
    curves
}

/// Gains from 0 to 1 in steps of 0.01.
fn gains() -> impl Iterator<Item = f32> {
    (0..=100).map(|i| i as f32 / 100.0)
}

#[test]
fn the_break_even_is_exact_on_a_curve_not_yet_refined() {
    for cost in curves() {
        for base in [1, 3, 8, 16, 40, 64] {
            for max_extra in [1, 16, 80] {
                let even = cost.break_even_gain(base, max_extra);
                for gain in gains() {
                    let nodes = granted(&cost, base, max_extra, gain);
                    let g = f64::from(gain);
                    if g <= even * (1.0 - 1e-4) {
                        assert_eq!(nodes, 0, "{cost:?} base {base} gain {gain} even {even}");
                    } else if g >= even * (1.0 + 1e-4) + 1e-6 {
                        assert!(nodes > 0, "{cost:?} base {base} gain {gain} even {even}");
                    }
                }
            }
        }
    }
}

#[test]
fn the_break_even_never_stops_a_tree_that_would_pay_on_a_refined_curve() {
    let mut checked = 0;
    for mut cost in curves() {
        // Busy steps of many rows measured dearer than first said, single rows cheaper:
        // the refined curve and the first one's floor now disagree.
        for _ in 0..40 {
            let (big, small) = (cost.cost(64), cost.cost(1));
            cost.observe(64, big * 1.6);
            cost.observe(1, small * 0.7);
        }
        for base in [1, 3, 8, 16, 40, 64] {
            for max_extra in [1, 16, 80] {
                let even = cost.break_even_gain(base, max_extra);
                for gain in gains() {
                    if granted(&cost, base, max_extra, gain) > 0 {
                        assert!(
                            f64::from(gain) > even,
                            "{cost:?} base {base} gain {gain} even {even}"
                        );
                        checked += 1;
                    }
                }
            }
        }
    }
    assert!(checked > 100, "only {checked} granted plans were checked");
}

#[test]
fn without_room_nothing_breaks_even() {
    let cost = CostCurve::flat();
    assert_eq!(cost.break_even_gain(4, 0), f64::INFINITY);
    assert_eq!(cost.break_even_gain(4, 8), 0.0);
    assert_eq!(granted(&cost, 4, 8, 0.01), 8);
}
