//! The scheduler driven by a mock engine with no tensors: the "model" is a deterministic
//! function of the tokens so far, and the "KV store" records which token each slot was
//! computed for, so every step also checks that the context a sequence reads is exactly its
//! own tokens (prefix hits, forks and recomputation included). Covers budgets and caps,
//! starvation over 10,000 steps of random arrivals, preemption with identical output, aborts
//! at every lifecycle stage, and chunked prefill.

use std::collections::{BTreeMap, HashMap};

use kvcache::{ManagerConfig, SeqId};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use scheduler::{Progress, Scheduler, SchedulerConfig, SeqStatus, StepPlan};

/// The mock model's next token after `tokens`.
fn next_token(tokens: &[u32]) -> u32 {
    let mut h: u32 = 2166136261;
    for &t in tokens.iter().rev().take(3) {
        h = (h ^ t).wrapping_mul(16777619);
    }
    h % 50
}

/// What a sequence with `prompt` and first sampled token `first` generates alone.
fn solo_output(prompt: &[u32], first: u32, max_tokens: usize) -> Vec<u32> {
    let mut tokens = prompt.to_vec();
    tokens.push(first);
    while tokens.len() - prompt.len() < max_tokens {
        tokens.push(next_token(&tokens));
    }
    tokens[prompt.len()..].to_vec()
}

struct Request {
    prompt: Vec<u32>,
    max_tokens: usize,
    arrived_step: u64,
    fork_index: u32,
}

struct MockEngine {
    scheduler: Scheduler,
    rows: Vec<Option<u32>>,
    requests: HashMap<SeqId, Request>,
    finished: BTreeMap<SeqId, (Vec<u32>, u64)>,
    next_id: u64,
    step: u64,
}

impl MockEngine {
    fn new(config: SchedulerConfig) -> Self {
        let scheduler = Scheduler::new(config).unwrap();
        Self {
            rows: vec![None; scheduler.blocks().num_slots()],
            scheduler,
            requests: HashMap::new(),
            finished: BTreeMap::new(),
            next_id: 0,
            step: 0,
        }
    }

    fn add(&mut self, prompt: Vec<u32>, max_tokens: usize, n: usize) -> SeqId {
        let id = SeqId(self.next_id);
        self.next_id += 1;
        self.scheduler.add(id, prompt.clone(), n, None).unwrap();
        self.requests.insert(
            id,
            Request {
                prompt,
                max_tokens,
                arrived_step: self.step,
                fork_index: 0,
            },
        );
        id
    }

    /// Plans and runs one step; returns the plan.
    fn step(&mut self) -> StepPlan {
        self.step += 1;
        let running_before: Vec<SeqId> = self
            .requests
            .keys()
            .copied()
            .filter(|&id| self.scheduler.seq(id).unwrap().status() == SeqStatus::Running)
            .collect();
        let plan = self.scheduler.schedule();
        let config = *self.scheduler.config();
        assert!(plan.num_batched_tokens <= config.max_num_batched_tokens);
        assert!(plan.scheduled.len() <= config.max_num_seqs);
        assert_eq!(
            plan.num_batched_tokens,
            plan.scheduled
                .iter()
                .map(|s| s.num_new_tokens)
                .sum::<usize>()
        );
        // Every sequence that was running gets a turn, unless preempted.
        for id in running_before {
            let served = plan.scheduled.iter().any(|s| s.seq == id);
            assert!(served || plan.preempted.contains(&id), "{id:?} starved");
        }
        for m in &plan.kv_copies {
            self.rows[m.to.index()] = self.rows[m.from.index()];
        }
        for s in &plan.scheduled {
            let seq = self.scheduler.seq(s.seq).unwrap();
            let tokens = seq.tokens().to_vec();
            let table = self.scheduler.block_table(s.seq).unwrap();
            let bs = self.scheduler.blocks().block_size();
            for (p, &token) in tokens.iter().enumerate().take(s.num_computed) {
                let slot = table.slot(p, bs).unwrap();
                assert_eq!(self.rows[slot.index()], Some(token), "{:?} context", s.seq);
            }
            let end = s.num_computed + s.num_new_tokens;
            for (p, &token) in tokens.iter().enumerate().take(end).skip(s.num_computed) {
                let slot = table.slot(p, bs).unwrap();
                self.rows[slot.index()] = Some(token);
            }
            assert_eq!(s.samples, end == tokens.len());
        }
        for s in &plan.scheduled {
            if !s.samples {
                self.scheduler.commit(s.seq, Progress::Chain, &[]).unwrap();
                continue;
            }
            let seq = self.scheduler.seq(s.seq).unwrap();
            let forks = seq.pending_forks();
            let is_first = seq.output().is_empty();
            let next = next_token(seq.tokens());
            let request = &self.requests[&s.seq];
            let first_of_prompt = next_token(&request.prompt);
            let next = if is_first {
                next + request.fork_index
            } else {
                next
            };
            self.scheduler
                .commit(s.seq, Progress::Chain, &[next])
                .unwrap();
            for k in 1..=forks {
                let child = SeqId(self.next_id);
                self.next_id += 1;
                self.scheduler
                    .fork(s.seq, child, first_of_prompt + k as u32)
                    .unwrap();
                let parent = &self.requests[&s.seq];
                let entry = Request {
                    prompt: parent.prompt.clone(),
                    max_tokens: parent.max_tokens,
                    arrived_step: parent.arrived_step,
                    fork_index: k as u32,
                };
                self.requests.insert(child, entry);
            }
            self.finish_if_done(s.seq);
            for k in 0..forks {
                self.finish_if_done(SeqId(self.next_id - 1 - k as u64));
            }
        }
        self.scheduler.check_invariants().unwrap();
        plan
    }

    fn finish_if_done(&mut self, id: SeqId) {
        let seq = self.scheduler.seq(id).unwrap();
        if seq.output().len() >= self.requests[&id].max_tokens {
            let output = seq.output().to_vec();
            self.scheduler.finish(id);
            let request = self.requests.remove(&id).unwrap();
            let expected = solo_output(
                &request.prompt,
                next_token(&request.prompt) + request.fork_index,
                request.max_tokens,
            );
            assert_eq!(output, expected, "{id:?} output differs from its solo run");
            self.finished
                .insert(id, (output, self.step - request.arrived_step));
        }
    }

    fn abort(&mut self, id: SeqId) {
        assert!(self.scheduler.abort(id));
        self.requests.remove(&id);
    }
}

fn random_prompt(rng: &mut StdRng, len: usize) -> Vec<u32> {
    // Two shared stems so the prefix cache gets hits.
    let stem = rng.random_range(0..2u32);
    (0..len)
        .map(|i| {
            if i < 40 {
                stem * 7 + i as u32
            } else {
                rng.random_range(0..50)
            }
        })
        .collect()
}

fn config(
    num_blocks: usize,
    budget: usize,
    max_seqs: usize,
    max_model_len: usize,
) -> SchedulerConfig {
    SchedulerConfig {
        max_num_batched_tokens: budget,
        max_num_seqs: max_seqs,
        max_model_len,
        kv: ManagerConfig {
            num_blocks,
            block_size: 8,
            prefix_caching: true,
            watermark: 0.02,
            window: None,
        },
    }
}

#[test]
fn ten_thousand_steps_of_random_arrivals_respect_limits_and_starve_nobody() {
    let mut rng = StdRng::seed_from_u64(42);
    let mut engine = MockEngine::new(config(60, 64, 8, 200));
    let mut preempted = 0;
    for step in 0..10_000 {
        if step < 9_000 && rng.random_bool(0.3) {
            let len = rng.random_range(1..120);
            let max_tokens = rng.random_range(1..40);
            let n = if rng.random_bool(0.1) { 3 } else { 1 };
            let prompt = random_prompt(&mut rng, len);
            engine.add(prompt, max_tokens, n);
        }
        if rng.random_bool(0.01) && !engine.requests.is_empty() {
            let ids: Vec<SeqId> = engine.requests.keys().copied().collect();
            let victim = ids[rng.random_range(0..ids.len())];
            engine.abort(victim);
        }
        preempted += engine.step().preempted.len();
    }
    while engine.scheduler.has_work() {
        engine.step();
    }
    assert!(engine.requests.is_empty());
    assert!(engine.finished.len() > 2_000, "{}", engine.finished.len());
    assert!(
        preempted > 0,
        "the pool never ran dry: the test proves little"
    );
    let stats = engine.scheduler.cache_stats();
    assert_eq!(stats.in_use, 0);
    assert!(stats.prefix_hit_tokens > 0);
    // Every request finished; none waited unboundedly long.
    let longest = engine.finished.values().map(|(_, steps)| *steps).max();
    assert!(longest.unwrap() < 2_000, "longest wait {longest:?} steps");
}

#[test]
fn preempted_sequences_resume_with_identical_output() {
    let mut rng = StdRng::seed_from_u64(3);
    // 24 blocks of 8 = 192 positions for 6 sequences of up to ~80: preemption is certain.
    let mut engine = MockEngine::new(config(24, 64, 6, 128));
    for _ in 0..6 {
        let len = rng.random_range(20..50);
        let prompt = random_prompt(&mut rng, len);
        engine.add(prompt, 30, 1);
    }
    let mut preempted = 0;
    while engine.scheduler.has_work() {
        preempted += engine.step().preempted.len();
    }
    assert!(preempted > 0);
    assert_eq!(engine.finished.len(), 6);
    assert_eq!(engine.scheduler.stats().preemptions, preempted as u64);
}

#[test]
fn chunked_prefill_covers_exactly_the_prompt() {
    let mut engine = MockEngine::new(SchedulerConfig {
        max_model_len: 1200,
        ..config(200, 64, 4, 256)
    });
    let prompt: Vec<u32> = (0..1000).map(|i| i % 50).collect();
    let id = engine.add(prompt, 3, 1);
    let mut covered = 0;
    while covered < 1000 {
        let plan = engine.step();
        assert_eq!(plan.scheduled.len(), 1);
        let s = &plan.scheduled[0];
        assert_eq!(s.num_computed, covered);
        assert!(s.num_new_tokens <= 64);
        covered += s.num_new_tokens;
        assert_eq!(s.samples, covered == 1000);
    }
    assert_eq!(covered, 1000);
    assert_eq!(engine.scheduler.seq(id).unwrap().output().len(), 1);
    while engine.scheduler.has_work() {
        let plan = engine.step();
        assert_eq!(plan.num_batched_tokens, 1);
    }
}

#[test]
fn abort_at_every_lifecycle_stage_frees_every_block() {
    // Stages: waiting, mid-prefill, decoding, forked, preempted back to waiting.
    for stage in 0..5 {
        let mut engine = MockEngine::new(config(20, 16, 4, 144));
        let long: Vec<u32> = (0..60).collect();
        let a = engine.add(long.clone(), 50, if stage == 3 { 3 } else { 1 });
        match stage {
            0 => {}
            1 => {
                engine.step();
                assert!(engine.scheduler.seq(a).unwrap().num_computed() < 60);
            }
            2 | 3 => {
                while engine.scheduler.seq(a).unwrap().output().len() < 3 {
                    engine.step();
                }
            }
            _ => {
                let b = engine.add((100..160).collect(), 80, 1);
                while engine.scheduler.seq(b).map(|s| s.num_preemptions()) == Some(0)
                    && engine.scheduler.seq(a).map(|s| s.num_preemptions()) == Some(0)
                {
                    engine.step();
                }
            }
        }
        let ids: Vec<SeqId> = engine.requests.keys().copied().collect();
        if stage == 3 {
            assert_eq!(ids.len(), 3, "forks exist");
        }
        for id in ids {
            engine.abort(id);
        }
        engine.scheduler.check_invariants().unwrap();
        let stats = engine.scheduler.cache_stats();
        assert_eq!(stats.in_use, 0, "stage {stage}: {stats:?}");
        assert!(!engine.scheduler.has_work());
        assert!(engine.scheduler.schedule().is_empty());
    }
}

#[test]
fn config_that_could_starve_or_deadlock_is_rejected() {
    let too_small_budget = SchedulerConfig {
        max_num_batched_tokens: 4,
        ..config(100, 64, 8, 256)
    };
    assert!(Scheduler::new(too_small_budget).is_err());
    let pool_too_small = config(10, 64, 8, 256); // 80 positions < max_model_len 256
    assert!(Scheduler::new(pool_too_small).is_err());
    // A windowed pool must hold one sequence's window and one step: 32/8 + 64/8 + 2 blocks.
    let windowed = |num_blocks| SchedulerConfig {
        kv: ManagerConfig {
            window: Some(kvcache::WindowConfig {
                window: 32,
                num_blocks,
            }),
            ..config(100, 64, 8, 256).kv
        },
        ..config(100, 64, 8, 256)
    };
    assert!(Scheduler::new(windowed(13)).is_err());
    assert!(Scheduler::new(windowed(14)).is_ok());
    let mut s = Scheduler::new(config(100, 64, 8, 256)).unwrap();
    assert!(s.add(SeqId(1), vec![], 1, None).is_err());
    assert!(s.add(SeqId(1), vec![1; 256], 1, None).is_err());
    assert!(s.add(SeqId(1), vec![1; 255], 1, None).is_ok());
    assert!(s.add(SeqId(1), vec![1], 1, None).is_err(), "duplicate id");
}

/// One speculative step of the mock: every sequence with a draft budget feeds a chain of
/// its pending token plus drafted tokens, where the first `good` drafts are what the model
/// will produce and the rest are wrong; the accepted prefix and one bonus token commit.
fn speculative_step(
    engine: &mut MockEngine,
    drafts: &scheduler::DraftInputs,
    good: usize,
) -> StepPlan {
    let plan = engine.scheduler.schedule_with(Some(drafts));
    let config = *engine.scheduler.config();
    assert!(plan.num_batched_tokens <= config.max_num_batched_tokens);
    for m in &plan.kv_copies {
        engine.rows[m.to.index()] = engine.rows[m.from.index()];
    }
    let bs = engine.scheduler.blocks().block_size();
    for s in &plan.scheduled {
        let seq = engine.scheduler.seq(s.seq).unwrap();
        let mut tokens = seq.tokens().to_vec();
        let table = engine.scheduler.block_table(s.seq).unwrap().clone();
        for (p, &token) in tokens.iter().enumerate().take(s.num_computed) {
            let slot = table.slot(p, bs).unwrap();
            assert_eq!(engine.rows[slot.index()], Some(token));
        }
        if s.draft_budget == 0 {
            let end = s.num_computed + s.num_new_tokens;
            for (p, &token) in tokens.iter().enumerate().take(end).skip(s.num_computed) {
                engine.rows[table.slot(p, bs).unwrap().index()] = Some(token);
            }
            let new: Vec<u32> = if s.samples {
                vec![next_token(&tokens)]
            } else {
                vec![]
            };
            engine
                .scheduler
                .commit(s.seq, Progress::Chain, &new)
                .unwrap();
            if s.samples {
                engine.finish_if_done(s.seq);
            }
            continue;
        }
        // Tree = chain: pending, then drafts.
        let mut chain = vec![*tokens.last().unwrap()];
        let mut shadow = tokens.clone();
        for i in 0..s.draft_budget {
            let right = next_token(&shadow);
            let token = if i < good { right } else { (right + 1) % 50 };
            chain.push(token);
            shadow.push(token);
        }
        for (i, &token) in chain.iter().enumerate() {
            engine.rows[table.slot(s.num_computed + i, bs).unwrap().index()] = Some(token);
        }
        // Verify: accept drafts while they match the model, then one bonus token.
        let mut accepted = vec![0];
        let mut new = Vec::new();
        loop {
            let next = next_token(&tokens);
            let node = accepted.len();
            if node < chain.len() && chain[node] == next {
                accepted.push(node);
                new.push(next);
                tokens.push(next);
            } else {
                new.push(next);
                break;
            }
        }
        let moves = engine
            .scheduler
            .commit(
                s.seq,
                Progress::Tree {
                    accepted: &accepted,
                },
                &new,
            )
            .unwrap();
        for m in &moves {
            engine.rows[m.to.index()] = engine.rows[m.from.index()];
        }
        engine.finish_if_done_allowing_overshoot(s.seq);
    }
    engine.scheduler.check_invariants().unwrap();
    plan
}

impl MockEngine {
    /// Like `finish_if_done`, but a speculative step may pass `max_tokens`: the output is
    /// compared on its first `max_tokens` tokens.
    fn finish_if_done_allowing_overshoot(&mut self, id: SeqId) {
        let seq = self.scheduler.seq(id).unwrap();
        let max_tokens = self.requests[&id].max_tokens;
        if seq.output().len() >= max_tokens {
            let output = seq.output()[..max_tokens].to_vec();
            self.scheduler.finish(id);
            let request = self.requests.remove(&id).unwrap();
            let expected = solo_output(
                &request.prompt,
                next_token(&request.prompt) + request.fork_index,
                max_tokens,
            );
            assert_eq!(output, expected, "{id:?} speculative output differs");
            self.finished
                .insert(id, (output, self.step - request.arrived_step));
        }
    }
}

fn offers_for(engine: &MockEngine, cost: scheduler::CostCurve) -> scheduler::DraftInputs {
    let offers = engine
        .requests
        .keys()
        .map(|&id| {
            let offer = scheduler::DraftOffer {
                draft_cost: Vec::new(),
                expected_accepted: vec![0.9, 1.7, 2.4, 3.0, 3.5, 3.9],
            };
            (id, offer)
        })
        .collect();
    scheduler::DraftInputs { cost, offers }
}

#[test]
fn draft_budgets_follow_the_cost_curve_and_trees_commit_losslessly() {
    let mut rng = StdRng::seed_from_u64(9);
    for (cost, expect_drafts) in [
        (scheduler::CostCurve::flat(), true),
        (scheduler::CostCurve::linear(), false),
    ] {
        let mut engine = MockEngine::new(config(40, 64, 8, 160));
        let mut drafted = 0;
        for step in 0..3_000 {
            if step < 2_500 && rng.random_bool(0.2) {
                let len = rng.random_range(1..60);
                let prompt = random_prompt(&mut rng, len);
                engine.add(prompt, rng.random_range(1..40), 1);
            }
            engine.step += 1;
            let drafts = offers_for(&engine, cost.clone());
            let plan = speculative_step(&mut engine, &drafts, rng.random_range(0..4));
            drafted += plan.scheduled.iter().map(|s| s.draft_budget).sum::<usize>();
        }
        while engine.scheduler.has_work() {
            engine.step += 1;
            let drafts = offers_for(&engine, cost.clone());
            speculative_step(&mut engine, &drafts, 2);
        }
        assert_eq!(engine.scheduler.cache_stats().in_use, 0);
        assert!(engine.finished.len() > 300);
        assert_eq!(drafted > 0, expect_drafts, "drafted {drafted} nodes");
    }
}

#[test]
fn a_step_that_gives_a_prompt_its_first_token_drafts_little() {
    // Each row adds 1% to a step's cost: with these offers a decoding sequence alone gets a
    // full tree, but beside a prompt taking its first token drafts may add only 2%.
    let gentle = scheduler::CostCurve::new(vec![(1, 1.0), (64, 1.63)]).unwrap();
    let mut rng = StdRng::seed_from_u64(3);
    let mut engine = MockEngine::new(config(40, 64, 8, 160));
    let first = engine.add(random_prompt(&mut rng, 5), 30, 1);
    let budget_of = |engine: &mut MockEngine| {
        engine.step += 1;
        let drafts = offers_for(engine, gentle.clone());
        let plan = speculative_step(engine, &drafts, 0);
        let of_first = plan.scheduled.iter().find(|s| s.seq == first).unwrap();
        (of_first.draft_budget, plan.num_batched_tokens)
    };
    // The prompt's own first step: nothing decodes yet.
    assert_eq!(budget_of(&mut engine).0, 0);
    let (alone, _) = budget_of(&mut engine);
    assert_eq!(alone, 6, "a decoding sequence alone takes its whole tree");
    engine.add(random_prompt(&mut rng, 5), 30, 1);
    let (beside, rows) = budget_of(&mut engine);
    let base = rows - beside;
    assert!(beside >= 1, "2% of a step still buys a node here");
    assert!(
        gentle.cost(rows) <= 1.02 * gentle.cost(base) + 1e-9,
        "{beside} nodes beside a first token make the step cost {} against {}",
        gentle.cost(rows),
        gentle.cost(base)
    );
    let (after, _) = budget_of(&mut engine);
    assert_eq!(after, 6, "both decode: full trees again");
}
