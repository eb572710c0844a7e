//! Paged tree attention against naive attention, over short contexts and long ones (several
//! key runs), and the bits of a row against its batch.

use super::*;
use crate::cpu::kv_store::{KvDtype, PagedKvStore};
use crate::tree::TokenTree;
use crate::tree_batch::{LogitRows, TreeBatch};
use kvcache::{BlockId, BlockTable};

/// Naive attention over explicit key/value lists, for comparison.
fn naive(q: &[f32], keys: &[&[f32]], values: &[&[f32]]) -> Vec<f32> {
    naive_with_sink(q, keys, values, None)
}

/// `naive`, with a sink: one more logit in the softmax, with no value (computed in f64).
fn naive_with_sink(q: &[f32], keys: &[&[f32]], values: &[&[f32]], sink: Option<f32>) -> Vec<f32> {
    let scale = 1.0 / (q.len() as f32).sqrt();
    let s: Vec<f32> = keys
        .iter()
        .map(|k| k.iter().zip(q).map(|(a, b)| a * b).sum::<f32>() * scale)
        .collect();
    let m = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let e: Vec<f32> = s.iter().map(|x| (x - m).exp()).collect();
    let z: f32 = e.iter().sum::<f32>() + sink.map_or(0.0, |s| (s - m).exp());
    let mut out = vec![0.0; q.len()];
    for (w, v) in e.iter().zip(values) {
        for (o, x) in out.iter_mut().zip(*v) {
            *o += w / z * x;
        }
    }
    out
}

#[test]
fn matches_naive_attention_over_context_and_ancestors() {
    // 8: the generic path; 64 and 128: the widths with kernels specialised at compile time.
    for head_dim in [8, 64, 128] {
        for dtype in [KvDtype::F16, KvDtype::F32] {
            check_against_naive(head_dim, dtype);
        }
    }
}

fn check_against_naive(head_dim: usize, dtype: KvDtype) {
    let shape = HeadShape::plain(4, 2, head_dim);
    let hd = head_dim;
    let row_width = 2 * hd;
    let mut store = PagedKvStore::new(1, 32, (2, hd), dtype);
    let mut rnd = random(1);
    let all: Vec<u32> = (0..32).collect();
    let slots: Vec<kvcache::Slot> = all.iter().map(|&s| kvcache::Slot(s)).collect();
    let k: Vec<f32> = (0..32 * row_width).map(|_| rnd()).collect();
    let v: Vec<f32> = (0..32 * row_width).map(|_| rnd()).collect();
    store.write(0, &slots, &k, &v).unwrap();
    // What the store holds (f16: rounded) is what attention must attend over.
    let (k, v) = store.layer(0).to_f32();

    // Context of 6 in blocks [5, 2] (block size 4), tree 0 -> {1, 2}, 2 -> 3.
    let table = BlockTable::from_blocks(vec![BlockId(5), BlockId(2), BlockId(7)]);
    let tree = TokenTree::new(vec![1, 2, 3, 4], vec![None, Some(0), Some(0), Some(2)]).unwrap();
    let mut batch = TreeBatch::new(4);
    batch.push(6, &table, &tree, LogitRows::All).unwrap();
    let q: Vec<f32> = (0..4 * 4 * hd).map(|_| rnd()).collect();
    let out = paged_tree_attention(&q, store.layer(0), &batch, shape);

    let ctx_slots: Vec<usize> = (0..6).map(|p| table.slot(p, 4).unwrap().index()).collect();
    for node in 0..4 {
        let mut visible = ctx_slots.clone();
        visible.extend(tree.path_to(node).iter().map(|&j| batch.slots[j].index()));
        for head in 0..4 {
            let kh = head / 2;
            // `to_f32` gives `[kv_head][slot][dim]`.
            let key = |s: usize| &k[(kh * 32 + s) * hd..(kh * 32 + s + 1) * hd];
            let val = |s: usize| &v[(kh * 32 + s) * hd..(kh * 32 + s + 1) * hd];
            let keys: Vec<&[f32]> = visible.iter().map(|&s| key(s)).collect();
            let vals: Vec<&[f32]> = visible.iter().map(|&s| val(s)).collect();
            let qrow = &q[(head * 4 + node) * hd..(head * 4 + node + 1) * hd];
            let want = naive(qrow, &keys, &vals);
            let got = &out[node * 4 * hd + head * hd..node * 4 * hd + (head + 1) * hd];
            for (a, b) in want.iter().zip(got) {
                assert!(
                    (a - b).abs() < 1e-5,
                    "{dtype:?} head dim {hd} node {node} head {head}: {a} vs {b}"
                );
            }
        }
    }
}

/// SmolLM2's head shape.
const SMOL: HeadShape<'static> = HeadShape {
    num_heads: 9,
    num_kv_heads: 3,
    head_dim: 64,
    scale: 0.125,
    softcap: None,
    sinks: None,
};

/// SmolLM2's head shape with a sink per query head: some far above a row's scores (the row
/// gives almost nothing to its keys), some far below, some among them.
const SINKS: [f32; 9] = [0.3, -2.0, 4.5, -30.0, 0.0, 1.2, 60.0, -0.7, 2.4];

/// A one-layer store of `blocks` blocks of 16 slots, filled with random keys and values;
/// returns it with what it holds as f32 (`[kv_head][slot][dim]`).
fn random_store(blocks: usize, dtype: KvDtype, seed: u32) -> (PagedKvStore, Vec<f32>, Vec<f32>) {
    let num_slots = blocks * 16;
    let width = SMOL.num_kv_heads * SMOL.head_dim;
    let mut store = PagedKvStore::new(1, num_slots, (SMOL.num_kv_heads, SMOL.head_dim), dtype);
    let mut rnd = random(seed);
    let slots: Vec<kvcache::Slot> = (0..num_slots as u32).map(kvcache::Slot).collect();
    let k: Vec<f32> = (0..num_slots * width).map(|_| rnd()).collect();
    let v: Vec<f32> = (0..num_slots * width).map(|_| rnd()).collect();
    store.write(0, &slots, &k, &v).unwrap();
    let (k, v) = store.layer(0).to_f32();
    (store, k, v)
}

fn random(mut seed: u32) -> impl FnMut() -> f32 {
    move || {
        seed = seed.wrapping_mul(1664525).wrapping_add(1013904223);
        (seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5
    }
}

/// A table over `blocks` blocks in a scrambled order.
fn scrambled_table(blocks: usize) -> BlockTable {
    BlockTable::from_blocks(
        (0..blocks)
            .map(|b| BlockId(((b * 37) % blocks) as u32))
            .collect(),
    )
}

#[test]
fn long_rows_match_naive_attention_over_their_key_runs() {
    long_rows_against_naive(SMOL);
}

#[test]
fn sinks_join_the_softmax_of_short_and_long_rows() {
    long_rows_against_naive(HeadShape {
        sinks: Some(&SINKS),
        ..SMOL
    });
}

#[test]
fn a_tree_node_with_sinks_computes_its_chain_bits_across_key_runs() {
    tree_against_chain(HeadShape {
        sinks: Some(&SINKS),
        ..SMOL
    });
}

#[test]
fn the_reference_kernel_takes_sinks_as_the_fused_one_does() {
    // A decoding row over 40 positions and a prefill chain of 5: the candle ops' attention
    // against naive attention with the sinks.
    let shape = HeadShape {
        sinks: Some(&SINKS),
        ..SMOL
    };
    let blocks = 4;
    let (store, k, v) = random_store(blocks, KvDtype::F32, 21);
    let table = scrambled_table(blocks);
    let hd = SMOL.head_dim;
    for (context, rows) in [(40usize, 1usize), (0, 5)] {
        let mut batch = TreeBatch::new(16);
        let tree = TokenTree::chain(&vec![3u32; rows]);
        batch.push(context, &table, &tree, LogitRows::All).unwrap();
        let q: Vec<f32> = values(SMOL.num_heads * rows * hd, 17);
        let qt = candle_core::Tensor::from_slice(
            &q,
            (1, SMOL.num_heads, rows, hd),
            &candle_core::Device::Cpu,
        )
        .unwrap();
        let out = gathered_tree_attention(
            &qt,
            store.layer(0),
            &batch,
            shape,
            &candle_core::Device::Cpu,
        )
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
        let fused = paged_tree_attention(&q, store.layer(0), &batch, shape);
        let slots = blocks * 16;
        let width = SMOL.num_heads * hd;
        for node in 0..rows {
            let visible: Vec<usize> = (0..context + node + 1)
                .map(|p| table.slot(p, 16).unwrap().index())
                .collect();
            for head in 0..SMOL.num_heads {
                let kh = head / 3;
                let key = |s: usize| &k[(kh * slots + s) * hd..(kh * slots + s + 1) * hd];
                let val = |s: usize| &v[(kh * slots + s) * hd..(kh * slots + s + 1) * hd];
                let keys: Vec<&[f32]> = visible.iter().map(|&s| key(s)).collect();
                let vals: Vec<&[f32]> = visible.iter().map(|&s| val(s)).collect();
                let qrow = &q[(head * rows + node) * hd..(head * rows + node + 1) * hd];
                let want = naive_with_sink(qrow, &keys, &vals, Some(SINKS[head]));
                let at = node * width + head * hd;
                for (i, w) in want.iter().enumerate() {
                    for (name, got) in [("reference", out[at + i]), ("fused", fused[at + i])] {
                        assert!(
                            (got - w).abs() < 2e-5,
                            "{name}: context {context} node {node} head {head}: {got} vs {w}"
                        );
                    }
                }
            }
        }
    }
}

/// Paged tree attention under `shape` against naive attention over short and long rows.
fn long_rows_against_naive(shape: HeadShape<'_>) {
    // 1022 cached positions: the tree's rows see 1023 to 1026 keys, so one row takes one
    // softmax and the others two runs, side by side in one batch; 1600: three runs. A chain
    // of 200 rows over 900 positions (a prefill chunk, whose rows are split rather than its
    // runs) sees 901 to 1100 keys.
    let tree = TokenTree::new(
        vec![1, 2, 3, 4, 5],
        vec![None, Some(0), Some(0), Some(2), Some(3)],
    )
    .unwrap();
    let chunk = TokenTree::chain(&[7; 200]);
    for (context, tree) in [(1022usize, &tree), (1600, &tree), (900, &chunk)] {
        for dtype in [KvDtype::F16, KvDtype::F32] {
            let blocks = (context + tree.len()).div_ceil(16) + 1;
            let (store, k, v) = random_store(blocks, dtype, 7);
            let table = scrambled_table(blocks);
            let mut batch = TreeBatch::new(16);
            batch.push(context, &table, tree, LogitRows::All).unwrap();
            let rows = tree.len();
            let hd = SMOL.head_dim;
            let mut rnd = random(11);
            let q: Vec<f32> = (0..SMOL.num_heads * rows * hd).map(|_| rnd()).collect();
            let out = paged_tree_attention(&q, store.layer(0), &batch, shape);
            let width = SMOL.num_heads * hd;
            let slots = blocks * 16;
            let ctx: Vec<usize> = (0..context)
                .map(|p| table.slot(p, 16).unwrap().index())
                .collect();
            for node in 0..rows {
                let mut visible = ctx.clone();
                visible.extend(tree.path_to(node).iter().map(|&j| batch.slots[j].index()));
                for head in 0..SMOL.num_heads {
                    let kh = head / 3;
                    let row = |data: &'static str, s: usize| {
                        let src = if data == "k" { &k } else { &v };
                        &src[(kh * slots + s) * hd..(kh * slots + s + 1) * hd]
                    };
                    let keys: Vec<&[f32]> = visible.iter().map(|&s| row("k", s)).collect();
                    let vals: Vec<&[f32]> = visible.iter().map(|&s| row("v", s)).collect();
                    let qrow = &q[(head * rows + node) * hd..(head * rows + node + 1) * hd];
                    let sink = shape.sinks.map(|s| s[head]);
                    let want = naive_with_sink(qrow, &keys, &vals, sink);
                    let got = &out[node * width + head * hd..node * width + (head + 1) * hd];
                    for (a, b) in want.iter().zip(got) {
                        assert!(
                            (a - b).abs() < 2e-5,
                            "{dtype:?} context {context} node {node} head {head}: {a} vs {b}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn a_tree_node_computes_its_chain_bits_across_key_runs() {
    tree_against_chain(SMOL);
}

/// A drafted chain's rows against the same tokens decoded one at a time, under `shape`.
fn tree_against_chain(shape: HeadShape<'_>) {
    // A chain of six drafted tokens over 1020 cached positions: its rows see 1021 to 1026
    // keys, one softmax for the first three and two runs for the rest. Decoded one at a time
    // instead, each token sees the same keys in the same slots.
    let context = 1020usize;
    let blocks = (context + 6).div_ceil(16) + 1;
    let (store, _, _) = random_store(blocks, KvDtype::F16, 3);
    let table = scrambled_table(blocks);
    let tokens = [5u32, 6, 7, 8, 9, 10];
    let mut tree_batch = TreeBatch::new(16);
    tree_batch
        .push(context, &table, &TokenTree::chain(&tokens), LogitRows::All)
        .unwrap();
    let (rows, hd) = (tokens.len(), SMOL.head_dim);
    let mut rnd = random(5);
    let q: Vec<f32> = (0..SMOL.num_heads * rows * hd).map(|_| rnd()).collect();
    let tree_out = paged_tree_attention(&q, store.layer(0), &tree_batch, shape);
    let width = SMOL.num_heads * hd;
    for (d, &token) in tokens.iter().enumerate() {
        let mut chain = TreeBatch::new(16);
        chain
            .push(
                context + d,
                &table,
                &TokenTree::chain(&[token]),
                LogitRows::All,
            )
            .unwrap();
        let q_row: Vec<f32> = (0..SMOL.num_heads)
            .flat_map(|h| q[(h * rows + d) * hd..(h * rows + d + 1) * hd].to_vec())
            .collect();
        let chain_out = paged_tree_attention(&q_row, store.layer(0), &chain, shape);
        assert_eq!(
            &tree_out[d * width..(d + 1) * width],
            &chain_out[..],
            "node {d} ({} keys)",
            context + d + 1
        );
    }
}

#[test]
fn a_long_row_computes_the_same_bits_alone_and_beside_others() {
    // Alone on two threads, a decoding row over 1500 positions has its key runs split
    // between items and merged afterwards; beside three other sequences each item holds
    // all of its runs; with one thread too. Every way gives the same bits.
    let blocks = 256;
    let (store, _, _) = random_store(blocks, KvDtype::F16, 9);
    let hd = SMOL.head_dim;
    let mut rnd = random(13);
    // (context, rows, first block) of each sequence; the long one first.
    let seqs = [
        (1500usize, 1usize, 0usize),
        (300, 2, 100),
        (700, 2, 130),
        (1200, 3, 180),
    ];
    let tables: Vec<BlockTable> = seqs
        .iter()
        .map(|&(c, n, first)| {
            BlockTable::from_blocks(
                (first..first + (c + n).div_ceil(16))
                    .map(|b| BlockId(b as u32))
                    .collect(),
            )
        })
        .collect();
    let queries: Vec<Vec<f32>> = seqs
        .iter()
        .map(|&(_, n, _)| (0..SMOL.num_heads * n * hd).map(|_| rnd()).collect())
        .collect();
    // Attention over the sequences `which`, on `threads` threads: the long row's output.
    let run = |which: &[usize], threads: usize| {
        let mut batch = TreeBatch::new(16);
        for &s in which {
            let (c, n, _) = seqs[s];
            let tokens: Vec<u32> = (0..n as u32).collect();
            batch
                .push(c, &tables[s], &TokenTree::chain(&tokens), LogitRows::All)
                .unwrap();
        }
        let total: usize = which.iter().map(|&s| seqs[s].1).sum();
        // q is `[heads][rows][dim]` over the whole batch.
        let mut q = vec![0.0f32; SMOL.num_heads * total * hd];
        let mut row = 0;
        for &s in which {
            let n = seqs[s].1;
            for h in 0..SMOL.num_heads {
                for i in 0..n {
                    let src = &queries[s][(h * n + i) * hd..(h * n + i + 1) * hd];
                    q[(h * total + row + i) * hd..(h * total + row + i + 1) * hd]
                        .copy_from_slice(src);
                }
            }
            row += n;
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        let out = pool.install(|| paged_tree_attention(&q, store.layer(0), &batch, SMOL));
        let at = which
            .iter()
            .take_while(|&&s| s != 0)
            .map(|&s| seqs[s].1)
            .sum::<usize>();
        let width = SMOL.num_heads * hd;
        out[at * width..(at + 1) * width].to_vec()
    };
    let alone = run(&[0], 2);
    assert_eq!(alone, run(&[0, 1, 2, 3], 2));
    assert_eq!(alone, run(&[2, 3, 0, 1], 2));
    assert_eq!(alone, run(&[0], 1));
    assert_eq!(alone, run(&[0], 4));
}

/// Pseudo-random values in [-0.5, 0.5).
pub(super) fn values(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(1664525).wrapping_add(1013904223);
            (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        })
        .collect()
}
