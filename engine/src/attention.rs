//! Paged tree attention on the CPU. For each sequence and KV head, every query row attends to
//! the sequence's whole cached context (read in place from its blocks in the
//! `PagedKvStore`) and to the rows of its own tree that its `TreeMask` marks visible
//! (ancestors and itself), with an exact two-pass softmax.
//!
//! Batch invariance: a row's keys are visited in one fixed order (context positions
//! ascending, then visible tree nodes ascending) and every reduction runs over that row alone,
//! so a row's output never depends on which other rows or sequences share the batch, and a
//! tree node computes bit-for-bit what its root path computes as a chain.

use std::ops::Range;

use candle_core::{DType, Device, Tensor};
use rayon::prelude::*;

use crate::attention_kernels as kernels;
use crate::batch::{SeqEntry, TreeBatch};
use crate::kv_store::{KvRows, KvValue, LayerKv};
use crate::softmax::softmax_in_place;
use crate::Result;

/// Which implementation computes attention. The two differ only in float summation order,
/// and that matters: quantized matmuls round activations to 8 bits, which turns a one-ulp
/// difference into logit differences of up to ~1 and so flips near-tied greedy choices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AttentionKernel {
    /// [`paged_tree_attention`]: reads K/V in place from the blocks; a row's arithmetic is
    /// independent of the batch and of sibling tree nodes, so verifying a tree gives exactly
    /// the tokens plain decoding gives. The engine's kernel.
    #[default]
    Fused,
    /// [`gathered_tree_attention`]: the candle ops candle-transformers' reference models use,
    /// so chains (prefill, decode) reproduce the reference bit for bit. Not tree-exact: the
    /// matmul sums over masked keys too, which moves its rounding.
    Reference,
}

impl AttentionKernel {
    /// Parses `--attention`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "fused" => Some(Self::Fused),
            "reference" => Some(Self::Reference),
            _ => None,
        }
    }
}

/// Head geometry of one attention call.
#[derive(Debug, Clone, Copy)]
pub struct HeadShape {
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads.
    pub num_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
}

/// `q` is `[num_heads][rows][head_dim]` (already rotated); the batch's own K/V rows must
/// already be in `kv`. Returns `[rows][num_heads * head_dim]`.
pub fn paged_tree_attention(
    q: &[f32],
    kv: &LayerKv,
    batch: &TreeBatch,
    shape: HeadShape,
) -> Vec<f32> {
    match kv {
        LayerKv::F16(kv) => paged_in(q, kv, batch, shape),
        LayerKv::F32(kv) => paged_in(q, kv, batch, shape),
    }
}

/// `paged_tree_attention` over rows of one value type.
fn paged_in<T: KvValue>(
    q: &[f32],
    kv: &KvRows<T>,
    batch: &TreeBatch,
    shape: HeadShape,
) -> Vec<f32> {
    let rows = batch.num_rows();
    let hd = shape.head_dim;
    let group = shape.num_heads / shape.num_kv_heads;
    // Work items: (sequence, KV head, rows). A sequence's rows are split only as far as it
    // takes to give every core two items, since rows in one item share each read of the
    // context. A row's result never depends on how rows are split.
    let items = batch.seqs.len() * shape.num_kv_heads;
    let parts = (rayon::current_num_threads() * 2)
        .div_ceil(items.max(1))
        .max(1);
    let split = rows.div_ceil(parts).max(1);
    let work: Vec<(usize, usize, Range<usize>)> = batch
        .seqs
        .iter()
        .enumerate()
        .flat_map(|(s, seq)| {
            let n = seq.rows.len();
            (0..shape.num_kv_heads).flat_map(move |kh| {
                (0..n)
                    .step_by(split)
                    .map(move |start| (s, kh, start..(start + split).min(n)))
            })
        })
        .collect();
    let results: Vec<Vec<f32>> = work
        .par_iter()
        .map(|(s, kh, part)| {
            attend_group(
                q,
                kv,
                batch,
                &batch.seqs[*s],
                *kh,
                part.clone(),
                group,
                shape,
            )
        })
        .collect();

    let width = shape.num_heads * hd;
    let mut out = vec![0.0f32; rows * width];
    for ((s, kh, part), result) in work.iter().zip(&results) {
        let seq = &batch.seqs[*s];
        let n = part.len();
        for g in 0..group {
            let head = kh * group + g;
            for (i, local) in part.clone().enumerate() {
                let row = seq.rows.start + local;
                let src = &result[(g * n + i) * hd..(g * n + i + 1) * hd];
                out[row * width + head * hd..row * width + (head + 1) * hd].copy_from_slice(src);
            }
        }
    }
    out
}

/// Output `[group][part rows][head_dim]` for the query heads sharing KV head `kh`, for the
/// sequence's rows `part` (indices into its tree). Each key and value row is read once for all
/// heads of the group; per head and row, the arithmetic is the fixed-order `dot`, softmax and
/// accumulation over the row's visible keys.
#[allow(clippy::too_many_arguments)]
fn attend_group<T: KvValue>(
    q: &[f32],
    kv: &KvRows<T>,
    batch: &TreeBatch,
    seq: &SeqEntry,
    kh: usize,
    part: Range<usize>,
    group: usize,
    shape: HeadShape,
) -> Vec<f32> {
    let hd = shape.head_dim;
    // This head's rows in the store: `[kv_head][slot][dim]`.
    let head_base = kh * (kv.k.len() / shape.num_kv_heads.max(1));
    let total_rows = batch.num_rows();
    let scale = (1.0 / (hd as f64).sqrt()) as f32;
    // Offsets of this head's K/V in the store: context first, then the tree's own rows.
    let context: Vec<usize> = batch
        .context_slots(seq)
        .expect("invariant: batch validated the block table covers the context")
        .into_iter()
        .map(|slot| head_base + slot.index() * hd)
        .collect();
    let tree: Vec<usize> = seq
        .rows
        .clone()
        .map(|r| head_base + batch.slots[r].index() * hd)
        .collect();

    let n = part.len();
    let mut out = vec![0.0f32; group * n * hd];
    let store = kv.k.len().min(kv.v.len());
    let context = kernels::Rows::new(&context, hd, store)
        .expect("invariant: batch validated every slot inside the store");
    // Rows taken together: their query heads share each read of the context's keys and
    // values (up to eight queries at once).
    let together = (8 / group).max(1);
    let rows: Vec<usize> = part.collect();
    let mut scores: Vec<f32> = Vec::new();
    let mut values: Vec<f32> = Vec::new();
    let mut visible: Vec<Vec<usize>> = vec![Vec::new(); together];
    let mut queries: Vec<&[f32]> = Vec::with_capacity(together * group);
    for (c, chunk) in rows.chunks(together).enumerate() {
        queries.clear();
        for (r, &local) in chunk.iter().enumerate() {
            visible[r].clear();
            visible[r].extend(seq.mask.visible(local).map(|j| tree[j]));
            let row = seq.rows.start + local;
            queries.extend((0..group).map(|g| {
                let head = kh * group + g;
                &q[(head * total_rows + row) * hd..(head * total_rows + row + 1) * hd]
            }));
        }
        let c_len = context.len();
        let longest = visible[..chunk.len()]
            .iter()
            .map(Vec::len)
            .max()
            .unwrap_or(0);
        // Each query's scores are one contiguous run: context, then its row's tree keys.
        let stride = c_len + longest;
        scores.clear();
        scores.resize(queries.len() * stride, 0.0);
        values.clear();
        values.resize(queries.len() * hd, 0.0);
        kernels::key_scores(&queries, &kv.k, context, scale, &mut scores, stride);
        for (r, own) in visible[..chunk.len()].iter().enumerate() {
            let own = kernels::Rows::new(own, hd, store)
                .expect("invariant: batch validated every slot inside the store");
            let heads = &queries[r * group..(r + 1) * group];
            let at = r * group * stride + c_len;
            kernels::key_scores(heads, &kv.k, own, scale, &mut scores[at..], stride);
            for g in 0..group {
                let start = (r * group + g) * stride;
                softmax_in_place(&mut scores[start..start + c_len + own.len()]);
            }
        }
        kernels::weighted_values(&scores, stride, &kv.v, context, &mut values);
        for (r, own) in visible[..chunk.len()].iter().enumerate() {
            let own = kernels::Rows::new(own, hd, store)
                .expect("invariant: batch validated every slot inside the store");
            let at = r * group * stride + c_len;
            let dst = &mut values[r * group * hd..(r + 1) * group * hd];
            kernels::weighted_values(&scores[at..], stride, &kv.v, own, dst);
            let i = c * together + r;
            for (g, value) in dst.chunks(hd).enumerate() {
                let o = (g * n + i) * hd;
                out[o..o + hd].copy_from_slice(value);
            }
        }
    }
    out
}

/// Attention with candle ops, one sequence at a time. `q` is `[1, heads, rows, dim]`
/// (rotated); the batch's own K/V rows must already be in `kv`. Returns `[rows, heads * dim]`.
///
/// Every sequence gets exactly the calls the reference makes for a prompt of its length
/// (or a single decode row), with K/V gathered in position order (context, then its tree
/// rows); a tree row's non-ancestors are masked to -inf, contribute exact zeros, and leave
/// the sum over its ancestors as a chain computes it.
pub fn gathered_tree_attention(
    q: &Tensor,
    kv: &LayerKv,
    batch: &TreeBatch,
    shape: HeadShape,
    device: &Device,
) -> Result<Tensor> {
    let hd = shape.head_dim;
    let group = shape.num_heads / shape.num_kv_heads;
    let mut outputs = Vec::with_capacity(batch.seqs.len());
    for seq in &batch.seqs {
        let n = seq.rows.len();
        let len = seq.context_len + n;
        let offsets: Vec<usize> = (0..seq.context_len)
            .map(|p| {
                batch
                    .context_slot(seq, p)
                    .expect("invariant: batch validated the block table covers the context")
                    .index()
                    * hd
            })
            .chain(seq.rows.clone().map(|r| batch.slots[r].index() * hd))
            .collect();
        let (k, v) = match kv {
            LayerKv::F16(kv) => (
                gather(&kv.k, &offsets, shape),
                gather(&kv.v, &offsets, shape),
            ),
            LayerKv::F32(kv) => (
                gather(&kv.k, &offsets, shape),
                gather(&kv.v, &offsets, shape),
            ),
        };
        let k = Tensor::from_vec(k, (1, shape.num_kv_heads, len, hd), device)?;
        let v = Tensor::from_vec(v, (1, shape.num_kv_heads, len, hd), device)?;
        let k = repeat_kv(k, group)?;
        let v = repeat_kv(v, group)?;
        let q = q.narrow(2, seq.rows.start, n)?.contiguous()?;
        let att = (q.matmul(&k.t()?)? / (hd as f64).sqrt())?;
        let att = if n > 1 {
            let mask: Vec<u8> = (0..n)
                .flat_map(|i| {
                    (0..len).map(move |j| {
                        u8::from(j >= seq.context_len && !seq.mask.sees(i, j - seq.context_len))
                    })
                })
                .collect();
            let mask = Tensor::from_vec(mask, (n, len), device)?.broadcast_as(att.shape())?;
            let neg_inf = Tensor::new(f32::NEG_INFINITY, device)?.broadcast_as(att.shape())?;
            mask.where_cond(&neg_inf, &att)?
        } else {
            att
        };
        let att = candle_nn::ops::softmax_last_dim(&att)?;
        let y = att.matmul(&v.contiguous()?)?;
        outputs.push(y.transpose(1, 2)?.reshape((n, shape.num_heads * hd))?);
    }
    Ok(Tensor::cat(&outputs, 0)?.to_dtype(DType::F32)?)
}

/// The head rows at `offsets` (within one KV head's rows) of every KV head of `store`
/// (`[kv_head][slot][dim]`), as f32 laid out `[kv_head][offset][dim]`.
fn gather<T: KvValue>(store: &[T], offsets: &[usize], shape: HeadShape) -> Vec<f32> {
    let hd = shape.head_dim;
    let plane = store.len() / shape.num_kv_heads.max(1);
    let mut out = Vec::with_capacity(shape.num_kv_heads * offsets.len() * hd);
    for kh in 0..shape.num_kv_heads {
        for &at in offsets {
            let at = kh * plane + at;
            out.extend(store[at..at + hd].iter().map(|x| x.to_f32()));
        }
    }
    out
}

/// `[b, kv_heads, len, d]` -> `[b, kv_heads * n_rep, len, d]`, query head h reading KV head
/// h / n_rep (the reference's layout, built the reference's way).
fn repeat_kv(xs: Tensor, n_rep: usize) -> Result<Tensor> {
    if n_rep == 1 {
        return Ok(xs);
    }
    let (b, kv_heads, len, d) = xs.dims4()?;
    Ok(Tensor::cat(&vec![&xs; n_rep], 2)?.reshape((b, kv_heads * n_rep, len, d))?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::LogitRows;
    use crate::kv_store::{KvDtype, PagedKvStore};
    use crate::tree::TokenTree;
    use kvcache::{BlockId, BlockTable};

    /// Naive attention over explicit key/value lists, for comparison.
    fn naive(q: &[f32], keys: &[&[f32]], values: &[&[f32]]) -> Vec<f32> {
        let scale = 1.0 / (q.len() as f32).sqrt();
        let s: Vec<f32> = keys
            .iter()
            .map(|k| k.iter().zip(q).map(|(a, b)| a * b).sum::<f32>() * scale)
            .collect();
        let m = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f32> = s.iter().map(|x| (x - m).exp()).collect();
        let z: f32 = e.iter().sum();
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
        let shape = HeadShape {
            num_heads: 4,
            num_kv_heads: 2,
            head_dim,
        };
        let hd = head_dim;
        let row_width = 2 * hd;
        let mut store = PagedKvStore::new(1, 32, (2, hd), dtype);
        let mut seed = 1u32;
        let mut rnd = move || {
            seed = seed.wrapping_mul(1664525).wrapping_add(1013904223);
            (seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        };
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
                // The store's layout: `[kv_head][slot][dim]`.
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
}
