//! Seeded randomised test of the block manager against a model of the KV store: 100,000+
//! random admissions (with prefix hits), tree writes with compaction, forks followed by
//! writes into shared blocks, truncations, releases and evictions. After every operation the
//! manager's invariants hold and every live sequence reads back exactly its own tokens from
//! the slots its table maps, so a wrong share, a missed copy-on-write or a stale cache hit
//! shows up as wrong content, not just as a wrong count. A second run adds a windowed slot
//! space: there every position a next query can still see must read back its own token.

use std::collections::BTreeMap;

use kvcache::{BlockManager, KvGroup, KvMove, ManagerConfig, SeqId, Slot, WindowConfig};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const BLOCK_SIZE: usize = 4;
const NUM_BLOCKS: usize = 48;

struct Harness {
    manager: BlockManager,
    /// The "KV store": which token each slot's row was computed for.
    rows: Vec<Option<u32>>,
    /// The windowed space's "KV store", where there is one.
    window_rows: Vec<Option<u32>>,
    window: Option<usize>,
    /// Committed tokens of each live sequence.
    seqs: BTreeMap<SeqId, Vec<u32>>,
    next_id: u64,
    rng: StdRng,
    counts: BTreeMap<&'static str, usize>,
}

impl Harness {
    fn new(seed: u64, prefix_caching: bool, window: Option<usize>) -> Self {
        let manager = BlockManager::new(ManagerConfig {
            num_blocks: NUM_BLOCKS,
            block_size: BLOCK_SIZE,
            prefix_caching,
            watermark: 0.05,
            window: window.map(|window| WindowConfig {
                window,
                num_blocks: NUM_BLOCKS / 2,
            }),
        });
        Self {
            rows: vec![None; manager.num_slots()],
            window_rows: vec![None; manager.num_window_slots().unwrap_or(0)],
            window,
            manager,
            seqs: BTreeMap::new(),
            next_id: 0,
            rng: StdRng::seed_from_u64(seed),
            counts: BTreeMap::new(),
        }
    }

    fn count(&mut self, what: &'static str) {
        *self.counts.entry(what).or_default() += 1;
    }

    fn slot(&self, seq: SeqId, position: usize) -> Slot {
        self.manager.slot(seq, position).expect("position mapped")
    }

    /// The window's slot of `position`, where the windowed space holds it.
    fn window_slot(&self, seq: SeqId, position: usize) -> Option<Slot> {
        self.manager
            .window_table(seq)
            .and_then(|t| t.slot(position, BLOCK_SIZE))
    }

    /// Writes `token` as position `position`'s row in every space that holds it.
    fn write(&mut self, seq: SeqId, position: usize, token: u32) {
        let slot = self.slot(seq, position);
        self.rows[slot.index()] = Some(token);
        if self.window.is_some() {
            let slot = self.window_slot(seq, position).expect("new rows are held");
            self.window_rows[slot.index()] = Some(token);
        }
    }

    fn apply(&mut self, moves: &[KvMove]) {
        for m in moves {
            let rows = match m.group {
                KvGroup::Full => &mut self.rows,
                KvGroup::Window => &mut self.window_rows,
            };
            rows[m.to.index()] = rows[m.from.index()];
        }
    }

    fn random_seq(&mut self) -> Option<SeqId> {
        if self.seqs.is_empty() {
            return None;
        }
        let i = self.rng.random_range(0..self.seqs.len());
        self.seqs.keys().nth(i).copied()
    }

    fn add(&mut self) {
        // Prompts share one of three stems so prefix hits are frequent.
        let stem = self.rng.random_range(0..3u32);
        let stem_len = self.rng.random_range(0..14);
        let tail_len = self.rng.random_range(1..8);
        let mut prompt: Vec<u32> = (0..stem_len).map(|i| stem * 100 + i).collect();
        prompt.extend((0..tail_len).map(|_| self.rng.random_range(0..5)));
        let seq = SeqId(self.next_id);
        self.next_id += 1;
        let Some(hit) = self
            .manager
            .admit(seq, &prompt, prompt.len(), None)
            .unwrap()
        else {
            self.count("add refused");
            return;
        };
        if hit > 0 {
            self.count("prefix hit");
        }
        assert_eq!(hit % BLOCK_SIZE, 0);
        assert!(hit < prompt.len());
        for (p, &token) in prompt.iter().enumerate().take(hit) {
            assert_eq!(
                self.rows[self.slot(seq, p).index()],
                Some(token),
                "stale hit"
            );
        }
        if let Some(window) = self.window {
            // What the first computed query (position `hit`) sees must be held, and right.
            for (p, &token) in prompt.iter().enumerate().take(hit) {
                if p + window > hit {
                    let slot = self.window_slot(seq, p).expect("seen positions are held");
                    assert_eq!(
                        self.window_rows[slot.index()],
                        Some(token),
                        "stale window hit"
                    );
                }
            }
        }
        let moves = self.manager.ensure_capacity(seq, prompt.len()).unwrap();
        let moves = moves.expect("admission reserved the prompt");
        self.apply(&moves);
        for (p, &token) in prompt.iter().enumerate().skip(hit) {
            self.write(seq, p, token);
        }
        self.manager.commit(seq, &prompt).unwrap();
        self.seqs.insert(seq, prompt);
        self.count("add");
    }

    /// One speculative step: write a tree of k nodes, accept a random increasing path.
    fn grow(&mut self) {
        let Some(seq) = self.random_seq() else { return };
        let len = self.seqs[&seq].len();
        let nodes = self.rng.random_range(1..7);
        let Some(moves) = self.manager.ensure_capacity(seq, len + nodes).unwrap() else {
            self.count("grow refused");
            return;
        };
        if !moves.is_empty() {
            self.count("copy on write");
        }
        self.apply(&moves);
        let tree: Vec<u32> = (0..nodes).map(|_| self.rng.random_range(0..5)).collect();
        for (i, &token) in tree.iter().enumerate() {
            self.write(seq, len + i, token);
        }
        let mut accepted = vec![0];
        for node in 1..nodes {
            if self.rng.random_bool(0.5) {
                accepted.push(node);
            }
        }
        let moves = self.manager.plan_compaction(seq, len, &accepted).unwrap();
        self.apply(&moves);
        let tokens = self.seqs.get_mut(&seq).expect("live");
        tokens.extend(accepted.iter().map(|&i| tree[i]));
        let tokens = tokens.clone();
        self.manager.commit(seq, &tokens).unwrap();
        if self.rng.random_bool(0.5) {
            self.manager.truncate(seq, tokens.len()).unwrap();
        }
        self.count("grow");
    }

    fn fork(&mut self) {
        let Some(parent) = self.random_seq() else {
            return;
        };
        let child = SeqId(self.next_id);
        self.next_id += 1;
        self.manager.fork(parent, child).unwrap();
        let tokens = self.seqs[&parent].clone();
        self.seqs.insert(child, tokens);
        self.count("fork");
    }

    fn truncate(&mut self) {
        let Some(seq) = self.random_seq() else { return };
        let len = self.rng.random_range(1..=self.seqs[&seq].len());
        let skipped = self.manager.window_table(seq).map_or(0, |t| t.skipped());
        match self.manager.truncate(seq, len) {
            Ok(_) => {
                self.seqs.get_mut(&seq).expect("live").truncate(len);
                self.count("truncate");
            }
            Err(_) => {
                // Only a window that let go of what the next query would see refuses.
                let window = self.window.expect("a full space always truncates");
                assert!(skipped > (len + 1).saturating_sub(window) / BLOCK_SIZE);
                self.count("truncate refused");
            }
        }
    }

    fn release(&mut self) {
        let Some(seq) = self.random_seq() else { return };
        self.manager.release(seq).unwrap();
        self.seqs.remove(&seq);
        self.count("release");
    }

    fn check(&self) {
        self.manager.check_invariants().unwrap();
        let stats = self.manager.stats();
        assert_eq!(stats.free + stats.in_use + stats.cached, stats.total);
        assert_eq!(stats.num_seqs, self.seqs.len());
        for (&seq, tokens) in &self.seqs {
            assert_eq!(self.manager.seq_len(seq), Some(tokens.len()));
            for (p, &token) in tokens.iter().enumerate() {
                let row = self.rows[self.slot(seq, p).index()];
                assert_eq!(row, Some(token), "{seq:?} position {p}");
            }
            if let Some(window) = self.window {
                // Every position the next query sees is held and reads back its token.
                let seen = (tokens.len() + 1).saturating_sub(window);
                for (p, &token) in tokens.iter().enumerate().skip(seen) {
                    let slot = self.window_slot(seq, p).expect("seen positions are held");
                    assert_eq!(self.window_rows[slot.index()], Some(token), "window {p}");
                }
            }
        }
    }
}

fn run(
    seed: u64,
    prefix_caching: bool,
    window: Option<usize>,
    ops: usize,
) -> BTreeMap<&'static str, usize> {
    let mut h = Harness::new(seed, prefix_caching, window);
    for _ in 0..ops {
        match h.rng.random_range(0..100) {
            0..=24 => h.add(),
            25..=64 => h.grow(),
            65..=74 => h.fork(),
            75..=84 => h.truncate(),
            _ => h.release(),
        }
        h.check();
    }
    let live: Vec<SeqId> = h.seqs.keys().copied().collect();
    for seq in live {
        h.manager.release(seq).unwrap();
    }
    h.seqs.clear();
    h.check();
    let stats = h.manager.stats();
    assert_eq!(stats.in_use, 0, "blocks leaked: {stats:?}");
    assert_eq!(stats.num_seqs, 0);
    if prefix_caching {
        h.counts.insert("evictions", stats.evictions as usize);
    }
    h.counts
}

#[test]
fn hundred_thousand_random_operations_keep_every_invariant() {
    let counts = run(7, true, None, 100_000);
    // Every kind of operation must actually have happened, or the test proves little.
    for what in [
        "add",
        "add refused",
        "prefix hit",
        "grow",
        "grow refused",
        "copy on write",
        "fork",
        "truncate",
        "release",
        "evictions",
    ] {
        assert!(
            counts.get(what).copied().unwrap_or(0) > 100,
            "{what}: {counts:?}"
        );
    }
}

#[test]
fn random_operations_without_prefix_caching() {
    let counts = run(11, false, None, 20_000);
    assert_eq!(counts.get("prefix hit"), None);
    assert!(counts["copy on write"] > 100, "{counts:?}");
}

#[test]
fn random_operations_with_a_windowed_space() {
    let counts = run(13, true, Some(6), 50_000);
    for what in [
        "add",
        "add refused",
        "prefix hit",
        "grow refused",
        "copy on write",
        "truncate",
        "truncate refused",
        "evictions",
    ] {
        assert!(
            counts.get(what).copied().unwrap_or(0) > 100,
            "{what}: {counts:?}"
        );
    }
}
