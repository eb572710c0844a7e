//! Prefill-only sequences (pooling requests) beside generation: while a generating sequence
//! is in the scheduler they take at most their share of a step between them, a generating
//! request queued behind them is admitted past them, alone they take whole steps, and a
//! prompt that ends is committed without a new token (its blocks then serve the cache).

use kvcache::{ManagerConfig, SeqId};
use scheduler::{Progress, Scheduler, SchedulerConfig};

fn scheduler(budget: usize) -> Scheduler {
    Scheduler::new(SchedulerConfig {
        max_num_batched_tokens: budget,
        max_num_seqs: 8,
        max_model_len: 512,
        kv: ManagerConfig {
            num_blocks: 256,
            block_size: 4,
            prefix_caching: true,
            watermark: 0.0,
            window: None,
        },
    })
    .unwrap()
}

fn prompt(len: u32, from: u32) -> Vec<u32> {
    (from..from + len).collect()
}

/// Tokens each sequence is fed by the next step, committing every fed token (and a new
/// token for a generating sequence that caught up; a prefill-only one that ends is
/// committed without one and leaves).
fn step(s: &mut Scheduler, pooling: &[SeqId]) -> Vec<(SeqId, usize)> {
    let plan = s.schedule();
    let mut fed = Vec::new();
    for p in &plan.scheduled {
        fed.push((p.seq, p.num_new_tokens));
        match (p.samples, pooling.contains(&p.seq)) {
            (true, true) => {
                // Its answer is out: it leaves, as the engine removes it.
                s.commit_prompt_end(p.seq).unwrap();
                assert!(s.abort(p.seq));
            }
            (true, false) => {
                s.commit(p.seq, Progress::Chain, &[7]).unwrap();
            }
            (false, _) => {
                s.commit(p.seq, Progress::Chain, &[]).unwrap();
            }
        }
    }
    fed
}

fn fed(plan: &[(SeqId, usize)], id: SeqId) -> usize {
    plan.iter().find(|(s, _)| *s == id).map_or(0, |&(_, n)| n)
}

#[test]
fn prefill_only_sequences_take_a_share_of_steps_while_generation_runs() {
    let mut s = scheduler(128);
    assert_eq!(s.prefill_only_share(), 16);
    let chat = SeqId(0);
    s.add(chat, prompt(5, 100), 1, None).unwrap();
    step(&mut s, &[]);
    let (a, b) = (SeqId(1), SeqId(2));
    for (id, from) in [(a, 0), (b, 200)] {
        s.add(id, prompt(40, from), 1, None).unwrap();
        s.set_prefill_only(id).unwrap();
    }
    // A generating request queued behind the prefill-only ones.
    let late = SeqId(3);
    s.add(late, prompt(30, 300), 1, None).unwrap();
    let first = step(&mut s, &[a, b]);
    assert_eq!(fed(&first, chat), 1);
    assert_eq!(fed(&first, a) + fed(&first, b), 16, "{first:?}");
    assert_eq!(fed(&first, late), 30, "the late request waited: {first:?}");
    // Every step: the decodes, and 16 prompt tokens of the prefill-only ones.
    let mut pooled = 16;
    while pooled < 80 {
        let plan = step(&mut s, &[a, b]);
        assert_eq!(fed(&plan, chat), 1);
        let n = fed(&plan, a) + fed(&plan, b);
        assert!(n <= 16 && n > 0, "{plan:?}");
        pooled += n;
    }
    assert_eq!(s.stats().running, 2, "both prompts ended");
}

#[test]
fn alone_prefill_only_sequences_take_whole_steps_and_fill_the_cache() {
    let mut s = scheduler(64);
    let a = SeqId(0);
    s.add(a, prompt(100, 0), 1, None).unwrap();
    s.set_prefill_only(a).unwrap();
    assert_eq!(fed(&step(&mut s, &[a]), a), 64);
    assert_eq!(fed(&step(&mut s, &[a]), a), 36);
    assert_eq!(s.stats().running, 0, "it left when its prompt ended");
    // The same prompt again reads what the first one computed.
    let b = SeqId(1);
    s.add(b, prompt(100, 0), 1, None).unwrap();
    s.set_prefill_only(b).unwrap();
    let plan = s.schedule();
    assert!(plan.scheduled[0].num_computed >= 96, "{plan:?}");
    // Only the end of a prompt fed this step commits without a token.
    s.commit_prompt_end(b).unwrap();
    let c = SeqId(2);
    s.add(c, prompt(100, 500), 1, None).unwrap();
    s.schedule();
    assert!(s.commit_prompt_end(c).is_err());
}
