//! Unit tests of the speculation state: acceptance learnt per evidence level, a costly
//! method probed and then charged by tree size, the reading of rows priced per row,
//! learning rows charged on the cost curve,
//! drafters left unprepared where no tree could pay, and no offer made where its own trees
//! could not, a method asked again once its record says it pays.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::offers::PROBE_VERIFICATIONS;
use super::*;
use crate::spec::speculator::ObservedRow;

/// Speculation with one registered method, `name`, made by `make`, over a vocabulary of 16,
/// with free rows (so that every drafter is asked), and a drafter of that method for a
/// sequence of one token.
fn one_method(name: &'static str, make: fn() -> Box<dyn Speculator>) -> (Speculation, SeqDrafter) {
    one_method_on(CostCurve::flat(), name, make)
}

/// `one_method` on the cost curve `cost`.
fn one_method_on(
    cost: CostCurve,
    name: &'static str,
    make: fn() -> Box<dyn Speculator>,
) -> (Speculation, SeqDrafter) {
    let config = SpeculationConfig {
        speculators: vec![SpeculatorFactory::new(name, move |_| make())],
        cost,
        ..SpeculationConfig::default()
    };
    let speculation = Speculation::new(config, 16).expect("a new method name");
    let request = SpecRequest {
        method: SpecMethod::Named(name),
        max_draft_tokens: None,
    };
    let state = speculation
        .drafter_for(Some(request), &[0], 1, None, None)
        .expect("the method drafts");
    (speculation, state)
}

/// Proposes four nodes; its evidence is 2 after an odd token and 1 after an even one.
struct Parity {
    last: u32,
}

impl Drafter for Parity {
    fn method(&self) -> SpecMethod {
        SpecMethod::Named("parity")
    }
    fn prepare(&mut self, ctx: &DraftContext<'_>) -> usize {
        self.last = ctx.tokens.last().copied().unwrap_or(0);
        4
    }
    fn evidence(&self) -> u8 {
        1 + (self.last % 2) as u8
    }
    fn draft(&mut self, ctx: &DraftContext<'_>, _budget: usize) -> TokenTree {
        TokenTree::chain(&ctx.tokens[ctx.tokens.len() - 1..])
    }
    fn observe(&mut self, _tokens: &[u32], _appended: usize) {}
}

struct ParitySpeculator;

impl Speculator for ParitySpeculator {
    fn method(&self) -> SpecMethod {
        SpecMethod::Named("parity")
    }
    fn drafter(&self, _seq: &NewSequence<'_>) -> Option<Box<dyn Drafter>> {
        Some(Box::new(Parity { last: 0 }))
    }
}

#[test]
fn acceptance_is_learnt_per_evidence_level() {
    let (mut speculation, mut state) = one_method("parity", || Box::new(ParitySpeculator));
    let seq = SeqId(1);
    let tree = TokenTree::chain(&[0, 1, 2, 3, 4]);
    // After odd tokens every node is accepted, after even ones none.
    for step in 0..200u32 {
        let tokens = [step];
        let offered = speculation.offers(std::iter::once((seq, &tokens[..], &mut state, 0)), 1, 80);
        assert!(offered.is_some());
        let accepted: Vec<usize> = if step % 2 == 1 {
            (0..5).collect()
        } else {
            vec![0]
        };
        speculation.verified(&mut state, &tree, &accepted);
    }
    let mut expected = |token: u32| {
        let tokens = [token];
        let inputs = speculation
            .offers(std::iter::once((seq, &tokens[..], &mut state, 0)), 1, 80)
            .expect("an offer");
        inputs.offers[&seq].expected_accepted.clone()
    };
    let strong = expected(7);
    let weak = expected(8);
    assert!(strong[3] > 3.0, "{strong:?}");
    assert!(weak[3] < 0.5, "{weak:?}");
}

/// Drafts eight nodes, at 5 ms of its own forwards per node.
struct Costly;

impl Drafter for Costly {
    fn method(&self) -> SpecMethod {
        SpecMethod::Named("costly")
    }
    fn prepare(&mut self, _ctx: &DraftContext<'_>) -> usize {
        8
    }
    fn draft(&mut self, ctx: &DraftContext<'_>, _budget: usize) -> TokenTree {
        TokenTree::chain(&ctx.tokens[ctx.tokens.len() - 1..])
    }
    fn observe(&mut self, _tokens: &[u32], _appended: usize) {}
}

impl Speculator for Costly {
    fn method(&self) -> SpecMethod {
        SpecMethod::Named("costly")
    }
    fn drafter(&self, _seq: &NewSequence<'_>) -> Option<Box<dyn Drafter>> {
        Some(Box::new(Costly))
    }
    fn draft_seconds(&self, nodes: usize) -> Option<f64> {
        Some(0.005 * nodes as f64)
    }
}

#[test]
fn a_costly_method_is_probed_then_charged_by_tree_size() {
    let (mut speculation, mut state) = one_method("costly", || Box::new(Costly));
    let seq = SeqId(1);
    // A forward of 10 ms: one unit of the flat curve.
    speculation.observe_forward(1, 0.010, std::iter::empty());
    let offer = |speculation: &mut Speculation, state: &mut SeqDrafter| {
        let tokens = [3];
        let inputs = speculation
            .offers(std::iter::once((seq, &tokens[..], state, 0)), 1, 80)
            .expect("an offer");
        inputs.offers[&seq].clone()
    };
    // Without evidence: a probe of at most four nodes, each expected to be accepted.
    let probe = offer(&mut speculation, &mut state);
    assert_eq!(probe.expected_accepted, vec![1.0, 2.0, 3.0, 4.0]);
    let want = [0.5, 1.0, 1.5, 2.0];
    assert!(probe
        .draft_cost
        .iter()
        .zip(want)
        .all(|(c, w)| (c - w).abs() < 1e-9));
    assert_eq!(probe.draft_cost.len(), 4);
    // Trees that never get a node accepted end the probe and teach the truth.
    let tree = TokenTree::chain(&[3, 4, 5, 6, 7]);
    for _ in 0..PROBE_VERIFICATIONS {
        speculation.verified(&mut state, &tree, &[0]);
    }
    let after = offer(&mut speculation, &mut state);
    assert_eq!(after.expected_accepted.len(), 8);
    assert!(after.expected_accepted[3] < 1.0, "{after:?}");
    assert!((after.draft_cost[7] - 4.0).abs() < 1e-9, "{after:?}");
    // A method that only looks things up is free.
    let mut lookup = speculation
        .drafter_for(
            Some(SpecRequest {
                method: SpecMethod::PromptLookup,
                max_draft_tokens: None,
            }),
            &[3, 4, 3],
            1,
            None,
            None,
        )
        .expect("prompt lookup drafts");
    let tokens = [3, 4, 3];
    let inputs = speculation
        .offers(std::iter::once((seq, &tokens[..], &mut lookup, 0)), 1, 80)
        .expect("a continuation of 3 to offer");
    assert!(inputs.offers[&seq].is_free());
}

/// The cost curve the planner is offered with `state`'s drafter, for sequence 1 after the
/// token 3.
fn offered_cost(speculation: &mut Speculation, state: &mut SeqDrafter) -> CostCurve {
    let tokens = [3];
    speculation
        .offers(std::iter::once((SeqId(1), &tokens[..], state, 0)), 1, 80)
        .expect("an offer")
        .cost
}

#[test]
fn what_a_step_spends_beside_its_forward_is_offered_as_overhead() {
    let (mut speculation, mut state) = one_method("costly", || Box::new(Costly));
    let overhead = |speculation: &mut Speculation, state: &mut SeqDrafter| {
        let cost = offered_cost(speculation, state);
        cost.step(1, 1.0) - cost.cost(1)
    };
    // No step measured yet: none.
    speculation.observe_forward(1, 0.010, std::iter::empty());
    assert_eq!(overhead(&mut speculation, &mut state), 0.0);
    // A 13 ms step around a 10 ms forward (one unit of the flat curve) and 1 ms of
    // sampling two tokens: 0.2 units per step and 0.05 per token. A step without a forward
    // teaches nothing.
    speculation.observe_sampling(2, 0.001);
    speculation.observe_step(Some(0.013));
    speculation.observe_step(Some(0.500));
    let units = overhead(&mut speculation, &mut state);
    assert!((units - 0.25).abs() < 1e-9, "{units}");
}

/// Drafts as `ParitySpeculator` does, and spends `SLOW_ROW` reading every computed row.
struct SlowReader;

const SLOW_ROW: std::time::Duration = std::time::Duration::from_millis(2);

impl Speculator for SlowReader {
    fn method(&self) -> SpecMethod {
        SpecMethod::Named("slow-reader")
    }
    fn drafter(&self, _seq: &NewSequence<'_>) -> Option<Box<dyn Drafter>> {
        Some(Box::new(Parity { last: 0 }))
    }
    fn observe_row(&mut self, _row: &ObservedRow<'_>) {
        let started = std::time::Instant::now();
        while started.elapsed() < SLOW_ROW {
            std::hint::spin_loop();
        }
    }
}

#[test]
fn reading_each_computed_row_is_priced_per_row_not_per_step() {
    // A measured curve, though level (a flat one declares rows free and takes no price).
    let level = CostCurve::new(vec![(1, 1.0), (64, 1.0)]).expect("a curve");
    let (mut speculation, mut state) = one_method_on(level, "slow-reader", || Box::new(SlowReader));

    // A 10 ms forward (one unit of the curve) of four rows, each read in 2 ms, in a
    // step of 20 ms: the reading is 0.2 units a row, and the step's fixed overhead the
    // 2 ms left (0.2 units) beside it. Three more rows cost three more readings.
    let logits = [0.0f32; 16];
    let rows = (0..4).map(|token| ObservedRow {
        token,
        logits: &logits,
        cache_scope: None,
        before: Default::default(),
    });
    speculation.observe_forward(4, 0.010, rows);
    let read = speculation.this_step.observing;
    assert!(read >= 4.0 * SLOW_ROW.as_secs_f64(), "{read}");
    speculation.observe_step(Some(0.010 + read + 0.002));
    let cost = offered_cost(&mut speculation, &mut state);
    let one_row = cost.step(1, 1.0) - cost.cost(1);
    let three_more = cost.step_with(1, 3, 1.0) - cost.step(1, 1.0);
    let per_row = read / 4.0 / 0.010;
    assert!(
        (one_row - (0.2 + per_row)).abs() < 1e-6,
        "{one_row} against {per_row}"
    );
    assert!(
        (three_more - 3.0 * per_row).abs() < 1e-6,
        "{three_more} against {per_row}"
    );
}

#[test]
fn learning_rows_are_charged_on_the_cost_curve() {
    let rows_of = |cost: CostCurve, step_rows: usize| {
        let config = SpeculationConfig {
            cost,
            ..SpeculationConfig::default()
        };
        let speculation = Speculation::new(config, 100).expect("the built-in methods");
        let request = SpecRequest {
            method: SpecMethod::Recycling,
            max_draft_tokens: None,
        };
        let state = speculation
            .drafter_for(Some(request), &[0], 1, None, None)
            .expect("recycling drafts");
        // Prompt rows feeding 50 distinct tokens, then repeats: an empty matrix wants
        // each token once.
        let fed: Vec<(usize, u32, &SeqDrafter)> = (0..80)
            .map(|row| (row, (row % 50) as u32, &state))
            .collect();
        speculation.learning_rows(&fed, step_rows)
    };
    // Where rows are free, every wanted token once, up to the cap.
    let free = rows_of(CostCurve::flat(), 80);
    assert_eq!(free, (0..PROMPT_LEARNING_ROWS).collect::<Vec<_>>());
    // Where each row costs as much as the next: one added row in a hundred is 1%.
    assert_eq!(rows_of(CostCurve::linear(), 80), Vec::<usize>::new());
    assert_eq!(rows_of(CostCurve::linear(), 300), vec![0, 1, 2]);
    // Rows that cost a tenth of a step each (a flat curve's start, then a slope).
    let gentle = CostCurve::new(vec![(1, 1.0), (101, 2.0)]).expect("a curve");
    assert_eq!(rows_of(gentle, 80).len(), 1);
}

/// Counts its preparations; proposes four nodes.
struct Counted(Arc<AtomicUsize>);

impl Drafter for Counted {
    fn method(&self) -> SpecMethod {
        SpecMethod::Named("counted")
    }
    fn prepare(&mut self, _ctx: &DraftContext<'_>) -> usize {
        self.0.fetch_add(1, Ordering::Relaxed);
        4
    }
    fn draft(&mut self, ctx: &DraftContext<'_>, _budget: usize) -> TokenTree {
        TokenTree::chain(&ctx.tokens[ctx.tokens.len() - 1..])
    }
    fn observe(&mut self, _tokens: &[u32], _appended: usize) {}
}

struct CountedSpeculator(Arc<AtomicUsize>);

impl Speculator for CountedSpeculator {
    fn method(&self) -> SpecMethod {
        SpecMethod::Named("counted")
    }
    fn drafter(&self, _seq: &NewSequence<'_>) -> Option<Box<dyn Drafter>> {
        Some(Box::new(Counted(self.0.clone())))
    }
}

#[test]
fn a_drafter_prepares_only_where_its_best_case_could_pay() {
    // One row costs 1, a second 0.1 more; from 64 rows on each row costs 0.6 (a step of 64
    // sequences pays 0.31 per token, and no gain per node reaches 0.6 / 0.31).
    let cost = CostCurve::new(vec![(1, 1.0), (2, 1.1), (64, 20.0), (128, 60.0)]).expect("a curve");
    let (mut speculation, mut state, prepared) = counted(cost.clone());
    let seq = SeqId(1);
    let tokens = [5];
    let mut offer = |base: usize, forced: usize| {
        speculation
            .offers(
                std::iter::once((seq, &tokens[..], &mut state, forced)),
                base,
                80,
            )
            .map(|inputs| inputs.offers[&seq].expected_accepted.clone())
    };
    // Alone, a second row costs a tenth of the first: the prior's trees could pay.
    assert!(cost.break_even_gain(1, 80) < 0.2);
    let alone = offer(1, 0).expect("an offer");
    assert_eq!(alone.len(), 4);
    assert_eq!(prepared.load(Ordering::Relaxed), 1);
    // Among 64 rows no tree could: the drafter is not asked.
    assert!(cost.break_even_gain(64, 80) > 1.0);
    assert_eq!(offer(64, 0), None);
    assert_eq!(prepared.load(Ordering::Relaxed), 1);
    // Tokens an output format forces are certain: they are offered at any load.
    let forced = offer(64, 2).expect("forced tokens are offered");
    assert_eq!(forced[..2], [1.0, 2.0]);
    assert_eq!(prepared.load(Ordering::Relaxed), 2);
}

/// Speculation with the "counted" method alone over `cost`, its drafter for one sequence,
/// and the count of that drafter's preparations.
fn counted(cost: CostCurve) -> (Speculation, SeqDrafter, Arc<AtomicUsize>) {
    let prepared = Arc::new(AtomicUsize::new(0));
    let counter = prepared.clone();
    let config = SpeculationConfig {
        speculators: vec![SpeculatorFactory::new("counted", move |_| {
            Box::new(CountedSpeculator(counter.clone()))
        })],
        cost,
        ..SpeculationConfig::default()
    };
    let speculation = Speculation::new(config, 16).expect("a new method name");
    let state = counted_drafter(&speculation);
    (speculation, state, prepared)
}

/// A new sequence's "counted" drafter.
fn counted_drafter(speculation: &Speculation) -> SeqDrafter {
    let request = SpecRequest {
        method: SpecMethod::Named("counted"),
        max_draft_tokens: None,
    };
    speculation
        .drafter_for(Some(request), &[0], 1, None, None)
        .expect("the method drafts")
}

/// Whether `state`'s drafter offers anything after token 5, alone on a step.
fn offer(speculation: &mut Speculation, state: &mut SeqDrafter) -> bool {
    let tokens = [5];
    speculation
        .offers(std::iter::once((SeqId(1), &tokens[..], state, 0)), 1, 80)
        .is_some()
}

#[test]
fn a_method_that_starts_to_pay_is_asked_again() {
    // Every extra row costs half a step: the prior's best node (0.4 tokens) does not pay.
    let cost = CostCurve::new(vec![(1, 1.0), (2, 1.5), (3, 2.0), (128, 64.5)]).expect("a curve");
    assert!((cost.break_even_gain(1, 80) - 0.5).abs() < 1e-6);
    let (mut speculation, mut state, prepared) = counted(cost);
    // A new method explores all the same: its first trees are offered as sure.
    assert!(offer(&mut speculation, &mut state));
    assert_eq!(prepared.load(Ordering::Relaxed), 1);
    // They are rejected: once it has shown that, it is no longer asked to prepare.
    let tree = TokenTree::chain(&[5, 6, 7, 8, 9]);
    for _ in 0..(PROBE_VERIFICATIONS as usize) {
        speculation.verified(&mut state, &tree, &[0]);
    }
    assert!(!offer(&mut speculation, &mut state));
    assert_eq!(prepared.load(Ordering::Relaxed), 1);
    // Its trees turn out to be accepted whole (verified, as forced tokens would be): the
    // best case the check keeps for it follows, and it is asked to prepare again.
    let tree = TokenTree::chain(&[5, 6, 7, 8, 9]);
    for _ in 0..50 {
        speculation.verified(&mut state, &tree, &[0, 1, 2, 3, 4]);
    }
    assert!(offer(&mut speculation, &mut state));
    assert_eq!(prepared.load(Ordering::Relaxed), 2);
}

#[test]
fn an_offer_whose_own_trees_cannot_pay_is_not_made() {
    // A second row costs 0.3 of a step.
    let cost = CostCurve::new(vec![(1, 1.0), (2, 1.3), (3, 1.6), (128, 39.1)]).expect("a curve");
    let (mut speculation, mut state, prepared) = counted(cost);
    // The prior's first node (0.4 tokens with its exploration bonus) pays for its row.
    assert!(offer(&mut speculation, &mut state));
    // Its trees are never accepted: the drafter still prepares (the method's best case,
    // which includes evidence levels never seen, could pay), but its own curve cannot, so
    // it makes no offer for the planner to weigh.
    let tree = TokenTree::chain(&[5, 6, 7, 8, 9]);
    for _ in 0..200 {
        speculation.verified(&mut state, &tree, &[0]);
    }
    // A new sequence of the method (whose own record has not lowered its trust yet).
    let mut fresh = counted_drafter(&speculation);
    let before = prepared.load(Ordering::Relaxed);
    assert!(!offer(&mut speculation, &mut fresh));
    assert_eq!(prepared.load(Ordering::Relaxed), before + 1);
}
