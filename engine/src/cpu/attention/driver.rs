//! The driver of paged tree attention on the CPU: a batch's work split into items (one
//! sequence's rows for one KV head over some of its key runs), run on the forward's team, a
//! long row's runs merged afterwards in run order. Its inner loops are `scores` and `values`.

use std::ops::Range;

use super::scores::key_scores;
use super::slots::{KeySlots, Rows};
use super::values::weighted_values;
use super::HeadShape;
use crate::cpu::kv_store::{KvRows, KvValue, LayerKv, LayerView};
use crate::cpu::softmax::{exp, exp_in_place, softmax_in_place, softmax_with_sink};
use crate::tree_batch::TreeBatch;

/// `q` is `[num_heads][rows][head_dim]` (already rotated); the batch's own K/V rows must
/// already be in `kv`. Returns `[rows][num_heads * head_dim]`.
pub fn paged_tree_attention(
    q: &[f32],
    kv: LayerView<'_>,
    batch: &TreeBatch,
    shape: HeadShape<'_>,
) -> Vec<f32> {
    match kv.kv {
        LayerKv::F16(kv) => paged_in(q, kv, batch, shape),
        LayerKv::F32(kv) => paged_in(q, kv, batch, shape),
    }
}

/// Keys per run of a row's softmax. A row that sees at least twice this many keys (its
/// context and visible tree nodes together) takes its softmax in runs at fixed key indices
/// (`[0, KEY_RUN)`, `[KEY_RUN, 2 * KEY_RUN)`, ..., the last run up to its final key), each
/// with its own maximum and sum, merged in run order afterwards; the runs of one long row can
/// then go to different cores. The runs depend only on how many keys the row sees, so its bits
/// still depend neither on the batch nor on whether it is a tree node or the same token
/// decoded as a chain; rows that see fewer keys take one softmax over all of them. A multiple
/// of 16 (the score loop's blocks).
pub const KEY_RUN: usize = 512;

/// How many runs a row that sees `keys` keys takes its softmax in.
fn runs_of(keys: usize) -> usize {
    (keys / KEY_RUN).max(1)
}

/// Rows whose query heads (`group` per row) are scored together against each key: up to 32
/// queries at once (the score loop reads each tile of keys once per six of them; the value
/// loop takes them a few at a time).
fn together(group: usize) -> usize {
    (32 / group.max(1)).max(1)
}

/// One work item: a sequence's rows, for one KV head, over some of its key runs.
struct Item {
    seq: usize,
    kv_head: usize,
    rows: Range<usize>,
    runs: Range<usize>,
}

/// What an item computed. Per run of its range, query head of its group and row, in that
/// order: the values (`head_dim` each) and the run's maximum and sum; rows with one run get
/// their finished output, rows with more the unnormalised sums of their run. An item that
/// holds every run of its rows merges them itself: then `values` holds one finished output
/// per query head and row, and `stats` is empty.
struct Partials {
    values: Vec<f32>,
    stats: Vec<(f32, f32)>,
}

impl Partials {
    /// Each row's runs merged into its output (the item holds every run of its rows, the
    /// i-th of which takes `runs[i]`; its query heads' sinks are `sinks`, where there are).
    fn merged(self, runs: &[usize], group: usize, hd: usize, sinks: Option<&[f32]>) -> Self {
        let n = runs.len();
        let mut values = vec![0.0f32; group * n * hd];
        let mut parts: Vec<(f32, f32, &[f32])> = Vec::new();
        for (i, &runs) in runs.iter().enumerate() {
            for g in 0..group {
                parts.clear();
                parts.extend((0..runs).map(|r| {
                    let at = (r * group + g) * n + i;
                    let (max, sum) = self.stats[at];
                    (max, sum, &self.values[at * hd..(at + 1) * hd])
                }));
                let at = g * n + i;
                let sink = sinks.map(|s| s[g]);
                merge_runs(&parts, &mut values[at * hd..(at + 1) * hd], sink);
            }
        }
        Self {
            values,
            stats: Vec::new(),
        }
    }
}

/// `paged_tree_attention` over rows of one value type.
fn paged_in<T: KvValue>(
    q: &[f32],
    kv: &KvRows<T>,
    batch: &TreeBatch,
    shape: HeadShape<'_>,
) -> Vec<f32> {
    let rows = batch.num_rows();
    let hd = shape.head_dim;
    let group = shape.num_heads / shape.num_kv_heads;
    // Work items: (sequence, KV head, rows, key runs), at least two per core where there
    // are enough. A decoding row or a draft tree has its key runs split first (its rows see
    // nearly as many keys each, and the rows taken together share each read of the context),
    // then its rows; a prefill chunk has only its rows split, which keeps the items even
    // where later rows see many more keys. A row's result never depends on how the work is
    // split.
    let items = batch.seqs.len() * shape.num_kv_heads;
    let parts = (rayon::current_num_threads() * 2)
        .div_ceil(items.max(1))
        .max(1);
    let mut work: Vec<Item> = Vec::new();
    for (s, seq) in batch.seqs.iter().enumerate() {
        let n = seq.rows.len();
        let runs = runs_of(seq.context_len + n);
        let pieces = if n <= KEY_RUN / 4 { parts.min(runs) } else { 1 };
        let split = n.div_ceil(parts.div_ceil(pieces)).max(1);
        for kv_head in 0..shape.num_kv_heads {
            for start in (0..n).step_by(split) {
                for piece in 0..pieces {
                    // The earlier pieces take more runs: the last one is the longest.
                    work.push(Item {
                        seq: s,
                        kv_head,
                        rows: start..(start + split).min(n),
                        runs: (piece * runs).div_ceil(pieces)
                            ..((piece + 1) * runs).div_ceil(pieces),
                    });
                }
            }
        }
    }
    let results: Vec<Partials> = crate::cpu::team::map(work.len(), |i| {
        attend_group(q, kv, batch, &work[i], group, shape)
    });

    let width = shape.num_heads * hd;
    let mut out = vec![0.0f32; rows * width];
    let mut parts: Vec<(f32, f32, &[f32])> = Vec::new();
    let mut first = 0;
    while first < work.len() {
        // The pieces of one (sequence, KV head, rows), in run order.
        let same = |w: &Item| {
            (w.seq, w.kv_head, w.rows.start)
                == (work[first].seq, work[first].kv_head, work[first].rows.start)
        };
        let last = first + work[first..].iter().take_while(|w| same(w)).count();
        let (pieces, partials) = (&work[first..last], &results[first..last]);
        let Item {
            seq: s,
            kv_head: kh,
            rows: part,
            ..
        } = &work[first];
        let seq = &batch.seqs[*s];
        let n = part.len();
        for (i, local) in part.clone().enumerate() {
            let row = seq.rows.start + local;
            let runs = runs_of(seq.context_len + seq.mask.count_visible(local));
            for g in 0..group {
                let head = kh * group + g;
                let dst = &mut out[row * width + head * hd..row * width + (head + 1) * hd];
                parts.clear();
                for (piece, partial) in pieces.iter().zip(partials) {
                    if partial.stats.is_empty() {
                        let at = g * n + i;
                        parts.push((0.0, 1.0, &partial.values[at * hd..(at + 1) * hd]));
                        continue;
                    }
                    for (r, run) in piece.runs.clone().enumerate() {
                        if run < runs {
                            let at = (r * group + g) * n + i;
                            let (max, sum) = partial.stats[at];
                            parts.push((max, sum, &partial.values[at * hd..(at + 1) * hd]));
                        }
                    }
                }
                merge_runs(&parts, dst, shape.sinks.map(|s| s[head]));
            }
        }
        first = last;
    }
    out
}

/// A row's output from its runs `(maximum, sum, values)` in key order: a single run's values
/// are already final (its sink taken in its softmax); more are weighed by `e^(max_run - max)
/// / sum over runs of e^(max_run - max) * sum_run`, added in run order, the head's `sink`
/// joining the maximum and the sum where it has one.
fn merge_runs(parts: &[(f32, f32, &[f32])], dst: &mut [f32], sink: Option<f32>) {
    if let [(_, _, values)] = parts {
        dst.copy_from_slice(values);
        return;
    }
    let max = parts.iter().map(|p| p.0).fold(f32::NEG_INFINITY, f32::max);
    let max = sink.map_or(max, |s| max.max(s));
    let sum: f32 = parts.iter().map(|&(m, s, _)| s * exp(m - max)).sum();
    let sum = sink.map_or(sum, |s| sum + exp(s - max));
    dst.fill(0.0);
    for &(m, _, values) in parts {
        let weight = exp(m - max) / sum;
        for (d, v) in dst.iter_mut().zip(values) {
            *d += weight * v;
        }
    }
}

/// The item's [`Partials`] for the query heads sharing its KV head, for its rows (indices into
/// the sequence's tree) over its key runs. Each key and value row is read once for all heads
/// of the group and the rows taken together; per head, row and run, the arithmetic is the
/// fixed-order `dot`, softmax (or its unnormalised part) and accumulation over the row's
/// visible keys in that run.
fn attend_group<T: KvValue>(
    q: &[f32],
    kv: &KvRows<T>,
    batch: &TreeBatch,
    item: &Item,
    group: usize,
    shape: HeadShape<'_>,
) -> Partials {
    let hd = shape.head_dim;
    let (seq, kh) = (&batch.seqs[item.seq], item.kv_head);
    // This head's value rows in the store (`[kv_head][slot][dim]`) and its key plane (tiles
    // of slots).
    let heads = shape.num_kv_heads.max(1);
    let (plane, values) = (kv.k.len() / heads, kv.v.len() / heads);
    let k = &kv.k[kh * plane..(kh + 1) * plane];
    let v = &kv.v[kh * values..(kh + 1) * values];
    let total_rows = batch.num_rows();
    let scale = shape.scale;
    // Slots of the context from the item's first run on (`context_slots[p - from]` for
    // position p), then of the tree's own rows.
    let c_len = seq.context_len;
    let from = (item.runs.start * KEY_RUN).min(c_len);
    let context_slots = &seq.context_slots[from..];
    let tree_slots: Vec<usize> = seq.rows.clone().map(|r| batch.slots[r].index()).collect();
    // Checked once here; the runs take parts of them.
    let context_values = Rows::new(context_slots, hd, values)
        .expect("invariant: batch validated every slot inside the store");
    let context_keys = KeySlots::new(context_slots, hd, plane)
        .expect("invariant: batch validated every slot inside the store");

    let n = item.rows.len();
    let slots = item.runs.len() * group * n;
    let mut partials = Partials {
        values: vec![0.0f32; slots * hd],
        stats: vec![(0.0, 0.0); slots],
    };
    // Each row's runs.
    let runs: Vec<usize> = item
        .rows
        .clone()
        .map(|local| runs_of(c_len + seq.mask.count_visible(local)))
        .collect();
    // Rows taken together (consecutive, with the same runs): their query heads share each
    // read of the context's keys and values.
    let together = together(group);
    let mut scores: Vec<f32> = Vec::new();
    let mut sums: Vec<f32> = Vec::new();
    let mut queries: Vec<&[f32]> = Vec::with_capacity(together * group);
    // The slots of the visible tree keys of the rows taken together.
    let mut visible: Vec<Vec<usize>> = vec![Vec::new(); together];
    let mut first = 0;
    while first < n {
        let len = runs[first..]
            .iter()
            .take(together)
            .take_while(|&&r| r == runs[first])
            .count();
        let chunk = first..first + len;
        let last_run = runs[first] - 1;
        queries.clear();
        for (r, local) in item.rows.clone().skip(first).take(len).enumerate() {
            visible[r].clear();
            visible[r].extend(seq.mask.visible(local).map(|j| tree_slots[j]));
            let row = seq.rows.start + local;
            queries.extend((0..group).map(|g| {
                let head = kh * group + g;
                &q[(head * total_rows + row) * hd..(head * total_rows + row + 1) * hd]
            }));
        }
        for (r_at, run) in item.runs.clone().enumerate() {
            if run > last_run {
                break;
            }
            // The run's keys: its part of the context, then each row's part of its tree keys
            // (key index `c_len + j` for the row's j-th visible node); the last run takes
            // every key from its start on.
            let lo = run * KEY_RUN;
            let hi = if run == last_run {
                usize::MAX
            } else {
                lo + KEY_RUN
            };
            let own = |v: &[usize]| {
                let len = v.len();
                lo.saturating_sub(c_len).min(len)..hi.saturating_sub(c_len).min(len)
            };
            let run = lo.min(c_len) - from..hi.min(c_len) - from;
            let (shared, shared_keys) = (context_values.part(run.clone()), context_keys.part(run));
            let longest = visible[..len]
                .iter()
                .map(|v| own(v).len())
                .max()
                .unwrap_or(0);
            // Each query's scores are one contiguous run: context, then its row's tree keys.
            let stride = shared.len() + longest;
            // Every score the loops below read is written first (each query's context keys,
            // then its row's own keys), so the buffer is only grown, never cleared.
            if scores.len() < queries.len() * stride {
                scores.resize(queries.len() * stride, 0.0);
            }
            sums.clear();
            sums.resize(queries.len() * hd, 0.0);
            key_scores(&queries, k, shared_keys, scale, &mut scores, stride);
            for (r, i) in chunk.clone().enumerate() {
                let slots = &visible[r][own(&visible[r])];
                let mine = KeySlots::new(slots, hd, plane)
                    .expect("invariant: batch validated every slot inside the store");
                let heads = &queries[r * group..(r + 1) * group];
                let at = r * group * stride + shared.len();
                key_scores(heads, k, mine, scale, &mut scores[at..], stride);
                for g in 0..group {
                    let start = (r * group + g) * stride;
                    let span = &mut scores[start..start + shared.len() + mine.len()];
                    if let Some(cap) = shape.softcap {
                        for s in span.iter_mut() {
                            *s = super::softcap(*s, cap);
                        }
                    }
                    partials.stats[(r_at * group + g) * n + i] = if last_run == 0 {
                        match shape.sinks {
                            Some(sinks) => softmax_with_sink(span, sinks[kh * group + g]),
                            None => softmax_in_place(span),
                        }
                        (0.0, 1.0)
                    } else {
                        exp_in_place(span)
                    };
                }
            }
            weighted_values(&scores, stride, v, shared, &mut sums);
            for (r, i) in chunk.clone().enumerate() {
                let mine = Rows::new(&visible[r][own(&visible[r])], hd, values)
                    .expect("invariant: batch validated every slot inside the store");
                let at = r * group * stride + shared.len();
                let dst = &mut sums[r * group * hd..(r + 1) * group * hd];
                weighted_values(&scores[at..], stride, v, mine, dst);
                for (g, value) in dst.chunks(hd).enumerate() {
                    let o = ((r_at * group + g) * n + i) * hd;
                    partials.values[o..o + hd].copy_from_slice(value);
                }
            }
        }
        first += len;
    }
    if item.runs == (0..1) && runs.iter().all(|&r| r == 1) {
        // One run per row: the values are the outputs already.
        partials.stats.clear();
        partials
    } else if item.runs == (0..runs_of(c_len + seq.rows.len())) {
        let sinks = shape.sinks.map(|s| &s[kh * group..(kh + 1) * group]);
        partials.merged(&runs, group, hd, sinks)
    } else {
        partials
    }
}
