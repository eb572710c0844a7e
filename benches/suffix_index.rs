//! Criterion bench of the global suffix index (`engine::spec::methods::suffix::index`) at 1M and
//! 10M indexed tokens, against a suffix automaton over the same tokens, the structure it was
//! chosen over. The tokens are real text: every string of the JSON data under
//! `benches/data` (Spec-Bench, ShareGPT, GSM8K, code edits) tokenized with SmolLM2's
//! tokenizer (fetched like the tests' model), 90% of the documents repeated in shuffled
//! order until the index holds the target, the other 10% held out. Per size it prints the
//! bytes per indexed token and the build time per token, and measures what a drafting
//! sequence pays per step (`lookup`: the longest-suffix match of its last 32 tokens, the
//! continuations of its occurrences merged into a trie, the draft cut best first) on text the
//! index holds and on held-out text, and what learning a 1,000-token request costs an index
//! kept full by evicting the oldest. `cargo bench --bench suffix_index`; numbers in
//! benches/README.md ("Global suffix index").

use std::time::Instant;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use engine::spec::methods::continuations::ContinuationTree;
use engine::spec::methods::suffix::index::{Occurrences, SuffixIndex};
use engine::spec::{Candidates, SpecMethod};
use engine::LoadOptions;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

const FILES: [&str; 6] = [
    "spec_bench_dev.jsonl",
    "spec_bench_long_13.jsonl",
    "sharegpt_200.json",
    "gsm8k_30.jsonl",
    "code_edits.jsonl",
    "batch_spec_bench_64.jsonl",
];

/// Every string of at least 40 characters in `value`.
fn strings(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::String(s) if s.len() >= 40 => out.push(s.clone()),
        serde_json::Value::Array(items) => items.iter().for_each(|v| strings(v, out)),
        serde_json::Value::Object(map) => map.values().for_each(|v| strings(v, out)),
        _ => {}
    }
}

/// The tokenized documents.
fn documents() -> Vec<Vec<u32>> {
    let loaded = engine::load_model("smollm2-135m", &LoadOptions::default())
        .expect("load smollm2-135m for its tokenizer");
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/data");
    let mut texts = Vec::new();
    for file in FILES {
        let body = std::fs::read_to_string(dir.join(file)).expect("bench data");
        match serde_json::from_str::<serde_json::Value>(&body) {
            Ok(value) => strings(&value, &mut texts),
            Err(_) => {
                for line in body.lines().filter(|l| !l.trim().is_empty()) {
                    let value: serde_json::Value = serde_json::from_str(line).expect("jsonl");
                    strings(&value, &mut texts);
                }
            }
        }
    }
    texts.sort();
    texts.dedup();
    texts
        .iter()
        .map(|t| loaded.tokenizer.encode_plain(t).expect("tokenize"))
        .filter(|t| t.len() >= 40)
        .collect()
}

/// A suffix automaton over token requests (separator `u32::MAX` between them), with each
/// state's first end position, for the longest match and one continuation. Each state's
/// transitions are a sorted list.
struct Automaton {
    len: Vec<u32>,
    link: Vec<u32>,
    first_end: Vec<u32>,
    next: Vec<Vec<(u32, u32)>>,
    last: u32,
    text: Vec<u32>,
}

impl Automaton {
    fn new() -> Self {
        Self {
            len: vec![0],
            link: vec![u32::MAX],
            first_end: vec![0],
            next: vec![Vec::new()],
            last: 0,
            text: Vec::new(),
        }
    }

    fn get(&self, state: u32, token: u32) -> Option<u32> {
        let edges = &self.next[state as usize];
        edges
            .binary_search_by_key(&token, |&(t, _)| t)
            .ok()
            .map(|i| edges[i].1)
    }

    fn set(&mut self, state: u32, token: u32, to: u32) {
        let edges = &mut self.next[state as usize];
        match edges.binary_search_by_key(&token, |&(t, _)| t) {
            Ok(i) => edges[i].1 = to,
            Err(i) => edges.insert(i, (token, to)),
        }
    }

    fn new_state(&mut self, len: u32, link: u32, first_end: u32, next: Vec<(u32, u32)>) -> u32 {
        self.len.push(len);
        self.link.push(link);
        self.first_end.push(first_end);
        self.next.push(next);
        self.len.len() as u32 - 1
    }

    fn push(&mut self, token: u32) {
        let at = self.text.len() as u32;
        self.text.push(token);
        let cur = self.new_state(self.len[self.last as usize] + 1, 0, at, Vec::new());
        let mut p = self.last;
        while p != u32::MAX && self.get(p, token).is_none() {
            self.set(p, token, cur);
            p = self.link[p as usize];
        }
        if let Some(q) = (p != u32::MAX).then(|| self.get(p, token)).flatten() {
            if self.len[p as usize] + 1 == self.len[q as usize] {
                self.link[cur as usize] = q;
            } else {
                let edges = self.next[q as usize].clone();
                let clone = self.new_state(
                    self.len[p as usize] + 1,
                    self.link[q as usize],
                    self.first_end[q as usize],
                    edges,
                );
                while p != u32::MAX && self.get(p, token) == Some(q) {
                    self.set(p, token, clone);
                    p = self.link[p as usize];
                }
                self.link[q as usize] = clone;
                self.link[cur as usize] = clone;
            }
        }
        self.last = cur;
    }

    /// Bytes held: per state its length, link, end and list, per transition 8, the text.
    fn bytes(&self) -> usize {
        let lists: usize = self.next.iter().map(|e| e.capacity() * 8).sum();
        self.len.len() * (12 + std::mem::size_of::<Vec<(u32, u32)>>()) + lists + self.text.len() * 4
    }

    /// The longest suffix of `context` that occurs, and the tokens after its first end.
    fn lookup(&self, context: &[u32], depth: usize) -> (usize, Vec<u32>) {
        let (mut state, mut len) = (0u32, 0usize);
        for &t in context {
            while state != 0 && self.get(state, t).is_none() {
                state = self.link[state as usize];
                len = self.len[state as usize] as usize;
            }
            if let Some(s) = self.get(state, t) {
                state = s;
                len += 1;
            }
        }
        let end = self.first_end[state as usize] as usize;
        let tail = self.text
            [(end + 1).min(self.text.len())..(end + 1 + depth).min(self.text.len())]
            .iter()
            .copied()
            .take_while(|&t| t != u32::MAX)
            .collect();
        (len, tail)
    }
}

/// What a `suffix` drafter does per step with the global index.
fn draft_step(
    index: &SuffixIndex,
    context: &[u32],
    found: &mut Occurrences,
    tree: &mut ContinuationTree,
    out: &mut Candidates,
) -> usize {
    index.find(context, &(0..0), found);
    tree.clear();
    let depth = (2 * found.len).clamp(4, 32);
    for &(at, _) in &found.at {
        tree.add(index.continuation(at, depth), 1.0);
    }
    tree.best_first(0.1, 64, out);
    out.len()
}

fn queries(docs: &[Vec<u32>], rng: &mut StdRng, n: usize) -> Vec<Vec<u32>> {
    (0..n)
        .map(|_| {
            let doc = &docs[rng.random_range(0..docs.len())];
            let end = rng.random_range(32..doc.len());
            doc[end - 32..end].to_vec()
        })
        .collect()
}

fn suffix_index(c: &mut Criterion) {
    let mut docs = documents();
    let mut rng = StdRng::seed_from_u64(7);
    docs.shuffle(&mut rng);
    let held_out = docs.split_off(docs.len() * 9 / 10);
    let total: usize = docs.iter().map(Vec::len).sum();
    println!(
        "suffix_index: {} documents, {total} tokens indexed in each pass, {} held out ({})",
        docs.len(),
        held_out.len(),
        SpecMethod::Suffix.as_str()
    );
    let mut group = c.benchmark_group("suffix_index");
    group.sample_size(20);
    group.measurement_time(std::time::Duration::from_secs(4));
    group.warm_up_time(std::time::Duration::from_secs(1));
    for (label, target) in [("1M", 1usize << 20), ("10M", 10 << 20)] {
        let mut order = docs.clone();
        let mut stream = Vec::new();
        while stream.iter().map(Vec::len).sum::<usize>() < target {
            order.shuffle(&mut rng);
            stream.extend(order.iter().cloned());
        }
        let started = Instant::now();
        let mut index = SuffixIndex::new();
        for (i, request) in stream.iter().enumerate() {
            index.push_request(request, i as u64);
        }
        let build = started.elapsed().as_secs_f64();
        println!(
            "suffix_index {label}: {} positions, {:.1} bytes/token, build {:.0} ns/token",
            index.len(),
            index.bytes() as f64 / index.len() as f64,
            build * 1e9 / index.len() as f64
        );
        let held = queries(&held_out, &mut rng, 512);
        let seen = queries(&docs, &mut rng, 512);
        for (kind, qs) in [("indexed", &seen), ("held_out", &held)] {
            let mut found = Occurrences::default();
            let mut tree = ContinuationTree::new();
            let mut out = Candidates::new();
            let drafted: usize = qs
                .iter()
                .map(|q| draft_step(&index, q, &mut found, &mut tree, &mut out))
                .sum();
            println!(
                "suffix_index {label} {kind}: {:.1} draft nodes per lookup",
                drafted as f64 / qs.len() as f64
            );
            let mut i = 0;
            group.bench_function(format!("lookup_{kind}_{label}"), |b| {
                b.iter(|| {
                    i = (i + 1) % qs.len();
                    draft_step(&index, &qs[i], &mut found, &mut tree, &mut out)
                })
            });
        }
        let request: Vec<u32> = held_out.iter().flatten().copied().take(1000).collect();
        group.bench_function(format!("learn_1k_tokens_full_{label}"), |b| {
            b.iter_batched_ref(
                || (),
                |_| {
                    index.push_request(&request, u64::MAX);
                    while index.len() > target {
                        index.evict_oldest();
                    }
                },
                BatchSize::SmallInput,
            )
        });
        drop(index);
        // The suffix automaton over the same stream.
        let started = Instant::now();
        let mut sam = Automaton::new();
        for request in &stream {
            for &t in request {
                sam.push(t);
            }
            sam.push(u32::MAX);
        }
        let build = started.elapsed().as_secs_f64();
        println!(
            "suffix_automaton {label}: {} states, {:.1} bytes/token, build {:.0} ns/token",
            sam.len.len(),
            sam.bytes() as f64 / sam.text.len() as f64,
            build * 1e9 / sam.text.len() as f64
        );
        let mut i = 0;
        group.bench_function(format!("automaton_lookup_held_out_{label}"), |b| {
            b.iter(|| {
                i = (i + 1) % held.len();
                sam.lookup(&held[i], 32)
            })
        });
    }
    group.finish();
}

criterion_group!(benches, suffix_index);
criterion_main!(benches);
