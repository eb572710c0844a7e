//! Unit tests of the state slots: slots handed out and taken back, the boundaries a step
//! saves and which of them stay (the interval, the prompt's last, the latest few), the
//! capacity the memory bound buys and its least-recently-used eviction, and the counts
//! reported as `StateStats`.
use super::*;

/// Slots over blocks of 4 for states of one byte: at most `capacity` snapshots (at least
/// four), kept at every `interval`-th boundary.
fn slots(capacity: usize, interval: usize) -> StateSlots {
    StateSlots::new(
        true,
        4,
        1,
        StateSnapshotConfig {
            interval,
            max_bytes: capacity,
        },
    )
}

/// Whether a sequence admitted past `at` cached positions of `tokens` finds a snapshot.
fn kept(slots: &mut StateSlots, tokens: &[u32], at: usize) -> bool {
    let ok = slots.plan(SeqId(9), &step(tokens, at, 1, true)).is_ok();
    slots.release(SeqId(9));
    ok
}

fn step(tokens: &[u32], num_computed: usize, rows: usize, commits: bool) -> Step<'_> {
    Step {
        tokens,
        scope: None,
        num_computed,
        rows,
        commits,
        prompt_len: 10,
    }
}

#[test]
fn slots_are_reused_once_given_back_and_never_shared() {
    let mut slots = slots(8, 8);
    let tokens: Vec<u32> = (0..32).collect();
    let a = slots.plan(SeqId(1), &step(&tokens, 0, 2, true)).unwrap();
    let b = slots.plan(SeqId(2), &step(&tokens, 0, 2, true)).unwrap();
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_ne!(a.state.slot, b.state.slot);
    slots.ran(SeqId(1), a.clone());
    slots.release(SeqId(1));
    let c = slots.plan(SeqId(3), &step(&tokens, 0, 2, true)).unwrap();
    assert_eq!(
        c.unwrap().state.slot,
        a.state.slot,
        "a freed slot is taken again"
    );
    let none = StateSlots::new(false, 4, 0, StateSnapshotConfig::default());
    assert!(none.stats(8).is_none());
    assert!(StateSlots::new(false, 4, 0, StateSnapshotConfig::default())
        .plan(SeqId(4), &step(&tokens, 0, 1, true))
        .unwrap()
        .is_none());
}

#[test]
fn a_step_saves_the_boundaries_it_passes_and_keeps_the_interval_and_the_latest() {
    let mut slots = slots(64, SNAPSHOT_INTERVAL);
    let tokens: Vec<u32> = (0..100).collect();
    // A prefill of 10 positions passes boundaries 4 and 8.
    let p = slots
        .plan(SeqId(1), &step(&tokens, 0, 10, true))
        .unwrap()
        .unwrap();
    let at: Vec<usize> = p.saves.iter().map(|s| s.0).collect();
    assert_eq!(at, [4, 8]);
    let changes = slots.ran(SeqId(1), p);
    assert_eq!(changes.added.len(), 2);
    assert!(changes.removed.is_empty(), "both among the latest few");
    // A verified tree keeps nothing new; the next step folds the accepted path in.
    let p = slots
        .plan(SeqId(1), &step(&tokens, 10, 5, false))
        .unwrap()
        .unwrap();
    assert!(p.saves.is_empty() && !p.state.commits);
    slots.ran(SeqId(1), p);
    let p = slots
        .plan(SeqId(1), &step(&tokens, 13, 1, true))
        .unwrap()
        .unwrap();
    let at: Vec<usize> = p.saves.iter().map(|s| s.0).collect();
    assert_eq!(at, [12], "folded from 10 to 13, then one row kept");
    slots.ran(SeqId(1), p);
    // Another sequence admitted past 12 cached positions resumes from that snapshot.
    let p = slots
        .plan(SeqId(2), &step(&tokens, 12, 3, true))
        .unwrap()
        .unwrap();
    assert!(p.state.resume.is_some());
    assert!(p.saves.is_empty(), "12 is kept already; 15 is no boundary");
    // Far on: the latest four stay, and the interval's (32: the 8th block) and the
    // prompt's last (8), not the others.
    let p = slots
        .plan(SeqId(1), &step(&tokens, 14, 40, true))
        .unwrap()
        .unwrap();
    let changes = slots.ran(SeqId(1), p);
    assert_eq!(changes.added.len(), 10, "16 to 52");
    for (at, want) in [(4, false), (8, true), (12, false), (20, false), (32, true)] {
        assert_eq!(kept(&mut slots, &tokens, at), want, "boundary {at}");
    }
    for at in [40, 44, 48, 52] {
        assert!(
            kept(&mut slots, &tokens, at),
            "boundary {at}, among the latest"
        );
    }
    // Past an unkept boundary: a clear error.
    let err = slots
        .plan(SeqId(3), &step(&tokens, 4, 1, true))
        .unwrap_err();
    assert!(err.to_string().contains("no state kept"), "{err}");
}

#[test]
fn the_interval_decides_which_boundaries_stay_past_the_latest_few() {
    let tokens: Vec<u32> = (0..100).collect();
    // One sequence (prompt of 10: its last boundary is 8) runs to 60, passing the
    // boundaries of blocks 1 to 15; the latest four (48 to 60) stay whatever the interval.
    for (interval, want) in [
        (4, vec![8, 16, 32, 48, 52, 56, 60]),
        (8, vec![8, 32, 48, 52, 56, 60]),
        (0, vec![8, 48, 52, 56, 60]),
        (1, (1..=15).map(|b| b * 4).collect()),
    ] {
        let mut slots = slots(64, interval);
        let p = slots
            .plan(SeqId(1), &step(&tokens, 0, 60, true))
            .unwrap()
            .unwrap();
        assert_eq!(p.saves.len(), 15, "interval {interval}");
        slots.ran(SeqId(1), p);
        let stats = slots.stats(4).unwrap();
        assert_eq!(stats.snapshots, want.len(), "interval {interval}");
        assert_eq!(stats.snapshot_bytes, want.len(), "one byte each");
        let found: Vec<usize> = (1..=15)
            .map(|b| b * 4)
            .filter(|&at| kept(&mut slots, &tokens, at))
            .collect();
        assert_eq!(found, want, "interval {interval}");
    }
}

#[test]
fn the_memory_bound_buys_its_snapshots_and_at_least_four() {
    const MIB: usize = 1 << 20;
    assert_eq!(
        StateSnapshotConfig::default(),
        StateSnapshotConfig {
            interval: 8,
            max_bytes: 1024 * MIB,
        }
    );
    assert_eq!(snapshot_capacity(1024 * MIB, 3 * MIB), 341);
    assert_eq!(snapshot_capacity(64 * MIB, MIB), 64);
    assert_eq!(snapshot_capacity(64 * MIB, MIB + 1), 63);
    assert_eq!(snapshot_capacity(MIB, 2 * MIB), 4, "at least four");
    let err = StateSnapshotConfig {
        interval: 8,
        max_bytes: 0,
    }
    .validate()
    .unwrap_err()
    .to_string();
    assert!(err.contains("--state-snapshot-mib"), "{err}");
    // States of 1 MiB within 6 MiB: eight sequences each leave one, the oldest two go.
    let mut slots = StateSlots::new(
        true,
        4,
        MIB,
        StateSnapshotConfig {
            interval: 8,
            max_bytes: 6 * MIB + MIB / 2,
        },
    );
    let tokens: Vec<u32> = (0..400).collect();
    let mut removed = 0;
    for (i, seq) in (0..8).map(SeqId).enumerate() {
        let tokens = &tokens[i * 40..];
        let p = slots.plan(seq, &step(tokens, 0, 4, true)).unwrap().unwrap();
        removed += slots.ran(seq, p).removed.len();
        slots.release(seq);
    }
    assert_eq!(removed, 2);
    let stats = slots.stats(8).unwrap();
    assert_eq!((stats.snapshots, stats.snapshot_bytes), (6, 6 * MIB));
    for (i, want) in [(0, false), (1, false), (2, true), (7, true)] {
        assert_eq!(kept(&mut slots, &tokens[i * 40..], 4), want, "sequence {i}");
    }
}

#[test]
fn stats_count_the_sequences_holding_slots_and_the_steps_resumed() {
    let mut slots = slots(64, 8);
    let tokens: Vec<u32> = (0..40).collect();
    let stats = slots.stats(3).unwrap();
    assert_eq!(
        stats,
        StateStats {
            slots_total: 3,
            ..StateStats::default()
        }
    );
    let p = slots
        .plan(SeqId(1), &step(&tokens, 0, 12, true))
        .unwrap()
        .unwrap();
    assert_eq!(slots.stats(3).unwrap().slots_in_use, 1);
    slots.ran(SeqId(1), p);
    // Two sequences admitted past the 8 cached positions: the step of one fails and
    // counts nothing; the other's runs and counts once, however long it goes on.
    let p = slots
        .plan(SeqId(2), &step(&tokens, 8, 4, true))
        .unwrap()
        .unwrap();
    assert!(p.state.resume.is_some());
    slots.abandon(p);
    let p = slots
        .plan(SeqId(3), &step(&tokens, 8, 4, true))
        .unwrap()
        .unwrap();
    slots.ran(SeqId(3), p);
    let p = slots
        .plan(SeqId(3), &step(&tokens, 12, 1, true))
        .unwrap()
        .unwrap();
    assert!(p.state.resume.is_none());
    slots.ran(SeqId(3), p);
    let stats = slots.stats(3).unwrap();
    assert_eq!((stats.slots_in_use, stats.resumes), (3, 1));
    for seq in [1, 2, 3].map(SeqId) {
        slots.release(seq);
    }
    let stats = slots.stats(3).unwrap();
    assert_eq!(
        (stats.slots_in_use, stats.snapshots, stats.resumes),
        (0, 3, 1)
    );
}

#[test]
fn snapshots_beyond_the_capacity_go_least_recently_used_first() {
    let mut slots = slots(4, 8);
    let tokens: Vec<u32> = (0..300).collect();
    let mut removed = 0;
    for (i, seq) in (0..6).map(SeqId).enumerate() {
        let p = slots
            .plan(seq, &step(&tokens[i * 40..], 0, 4, true))
            .unwrap()
            .unwrap();
        removed += slots.ran(seq, p).removed.len();
        slots.release(seq);
        if i == 3 {
            // The first sequence's snapshot is read again: it outlives the next two.
            assert!(kept(&mut slots, &tokens, 4));
        }
    }
    assert_eq!(removed, 2);
    assert_eq!(slots.held(), 4, "four snapshots, no sequence");
    for (i, want) in [(0, true), (1, false), (2, false), (3, true), (5, true)] {
        assert_eq!(kept(&mut slots, &tokens[i * 40..], 4), want, "sequence {i}");
    }
}
