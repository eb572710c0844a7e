//! Paged attention's two inner loops: the scores of one query against a row's keys, and the
//! probability-weighted sum of its values. For head widths that are multiples of 16 (64, 128)
//! both use fused multiply-adds in sixteen lanes: a score sums `q[i] * k[i]` into lane `i % 16`,
//! adds lanes `l` and `l + 8`, then combines the eight in `reduce::dot`'s fixed order; the value
//! sum adds `p * v` per key, in key order, with one rounding each. The AVX-512 versions and the
//! portable ones give the same bits (an FMA rounds once whoever computes it); the AVX-512 ones
//! take four keys at a time so their chains of dependent adds overlap, and ask for the rows 32
//! keys ahead of the one they read (a context's blocks are short contiguous runs, which the
//! hardware prefetcher alone follows late). Other widths use `reduce::dot` and separate
//! multiplies and adds. Every sum runs over one row's keys in one order, so a row's result
//! never depends on the other rows of the batch.

use crate::kv_store::KvValue;
use crate::reduce::{combine8, dot};

/// Offsets of `width`-value rows, each checked to lie inside a store of `len` values (so the
/// unchecked loops may read them).
#[derive(Clone, Copy)]
pub struct Rows<'a> {
    at: &'a [usize],
    width: usize,
    /// The store length the rows were checked against.
    store: usize,
}

#[allow(clippy::len_without_is_empty)]
impl<'a> Rows<'a> {
    /// How many rows.
    pub fn len(&self) -> usize {
        self.at.len()
    }

    /// `None` unless every row lies inside `len` values.
    pub fn new(at: &'a [usize], width: usize, len: usize) -> Option<Self> {
        at.iter().all(|&a| a + width <= len).then_some(Self {
            at,
            width,
            store: len,
        })
    }
}

/// Whether this CPU runs the AVX-512 loops (checked once).
fn avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static AVX512: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *AVX512
            .get_or_init(|| is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("fma"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// How many keys ahead the loops that stream keys or values from memory ask for them.
#[cfg(target_arch = "x86_64")]
const AHEAD: usize = 32;

/// Queries scored together by the AVX-512 loop for heads of `16 * ch` values (two keys' chunks
/// and two accumulators per query stay in registers).
#[cfg(target_arch = "x86_64")]
fn queries_at_once(ch: usize) -> usize {
    if ch <= 4 {
        8
    } else {
        4
    }
}

/// Queries whose value sums stay in registers together (`ch` accumulators each).
#[cfg(target_arch = "x86_64")]
fn values_at_once(ch: usize) -> usize {
    if ch <= 4 {
        6
    } else {
        3
    }
}

/// `scores[g * stride + j] = score(queries[g], k[keys[j]..]) * scale` for every query `g`
/// (the query heads of the rows that share one KV head and these keys): each key is read once
/// for all of them.
pub fn key_scores<T: KvValue>(
    queries: &[&[f32]],
    k: &[T],
    keys: Rows<'_>,
    scale: f32,
    scores: &mut [f32],
    stride: usize,
) {
    let (hd, len) = (keys.width, keys.at.len());
    assert!(queries.iter().all(|q| q.len() == hd));
    assert!(len <= stride);
    assert!(queries.is_empty() || (queries.len() - 1) * stride + len <= scores.len());
    assert!(keys.store <= k.len());
    #[cfg(target_arch = "x86_64")]
    if avx512() && matches!(hd, 64 | 128) {
        let ch = hd / 16;
        // Whole runs of sixteen keys in blocks of four, two or one queries; the rest below.
        let done = len / 16 * 16;
        let mut g = 0;
        while g < queries.len() {
            let q = match queries.len() - g {
                1 => 1,
                2 | 3 => 2,
                _ => 4,
            };
            let qs = &queries[g..g + q];
            for j in (0..done).step_by(16 / q) {
                if g == 0 {
                    // The first queries stream the keys from memory; the others find them
                    // in cache.
                    x86::prefetch_rows(
                        k,
                        &keys.at[(j + AHEAD).min(len)..(j + AHEAD + 16 / q).min(len)],
                        hd,
                    );
                }
                let at = &keys.at[j..j + 16 / q];
                let out = &mut scores[g * stride + j..];
                // SAFETY: as below; `out` holds `(q - 1) * stride + 16 / q` scores, since
                // `j + 16 / q <= len <= stride`.
                unsafe {
                    match (ch, q) {
                        (4, 1) => x86::score_block::<4, 1, T>(qs, k, at, scale, out, stride),
                        (4, 2) => x86::score_block::<4, 2, T>(qs, k, at, scale, out, stride),
                        (4, _) => x86::score_block::<4, 4, T>(qs, k, at, scale, out, stride),
                        (_, 1) => x86::score_block::<8, 1, T>(qs, k, at, scale, out, stride),
                        (_, 2) => x86::score_block::<8, 2, T>(qs, k, at, scale, out, stride),
                        (_, _) => x86::score_block::<8, 4, T>(qs, k, at, scale, out, stride),
                    }
                }
            }
            g += q;
        }
        let at_once = queries_at_once(ch);
        let keys = Rows {
            at: &keys.at[done..],
            ..keys
        };
        let scores = &mut scores[done..];
        for (c, qs) in queries.chunks(at_once).enumerate() {
            let scores = &mut scores[c * at_once * stride..];
            // SAFETY: AVX-512F and FMA were detected; the lengths are checked above, and every
            // key row lies inside `k` (`Rows` checked them against a length `k` covers).
            unsafe {
                let (at, out) = (keys.at, scores);
                match (ch, qs.len()) {
                    (4, 1) => x86::key_scores::<4, 1, T>(qs, k, at, scale, out, stride),
                    (4, 2) => x86::key_scores::<4, 2, T>(qs, k, at, scale, out, stride),
                    (4, 3) => x86::key_scores::<4, 3, T>(qs, k, at, scale, out, stride),
                    (4, 4) => x86::key_scores::<4, 4, T>(qs, k, at, scale, out, stride),
                    (4, 5) => x86::key_scores::<4, 5, T>(qs, k, at, scale, out, stride),
                    (4, 6) => x86::key_scores::<4, 6, T>(qs, k, at, scale, out, stride),
                    (4, 7) => x86::key_scores::<4, 7, T>(qs, k, at, scale, out, stride),
                    (4, _) => x86::key_scores::<4, 8, T>(qs, k, at, scale, out, stride),
                    (_, 1) => x86::key_scores::<8, 1, T>(qs, k, at, scale, out, stride),
                    (_, 2) => x86::key_scores::<8, 2, T>(qs, k, at, scale, out, stride),
                    (_, 3) => x86::key_scores::<8, 3, T>(qs, k, at, scale, out, stride),
                    (_, _) => x86::key_scores::<8, 4, T>(qs, k, at, scale, out, stride),
                }
            }
        }
        return;
    }
    let _ = avx512;
    let mut widened = Vec::new();
    for (g, query) in queries.iter().enumerate() {
        let key = |at: usize| &k[at..at + hd];
        for (s, &at) in scores[g * stride..][..len].iter_mut().zip(keys.at) {
            *s = match hd {
                64 => score::<64, T>(query, key(at)),
                128 => score::<128, T>(query, key(at)),
                _ => {
                    widened.clear();
                    widened.extend(key(at).iter().map(|x| x.to_f32()));
                    dot(query, &widened)
                }
            } * scale;
        }
    }
}

/// `dst[g * hd..][..hd] += sum_j p[g * stride + j] * v[keys[j]..]` for every query `g`, in
/// key order; each value row is read once for all of them.
pub fn weighted_values<T: KvValue>(
    p: &[f32],
    stride: usize,
    v: &[T],
    keys: Rows<'_>,
    dst: &mut [f32],
) {
    let (hd, len) = (keys.width, keys.at.len());
    let nq = dst.len() / hd;
    assert!(dst.len() == nq * hd && len <= stride && keys.store <= v.len());
    assert!(nq == 0 || (nq - 1) * stride + len <= p.len());
    #[cfg(target_arch = "x86_64")]
    if avx512() && matches!(hd, 64 | 128) {
        let ch = hd / 16;
        let at_once = values_at_once(ch);
        for (c, dst) in dst.chunks_mut(at_once * hd).enumerate() {
            let p = &p[c * at_once * stride..];
            let at = keys.at;
            // SAFETY: as in `key_scores`, for the value rows.
            unsafe {
                match (ch, dst.len() / hd) {
                    (4, 1) => x86::weighted_values::<4, 1, T>(p, stride, v, at, dst),
                    (4, 2) => x86::weighted_values::<4, 2, T>(p, stride, v, at, dst),
                    (4, 3) => x86::weighted_values::<4, 3, T>(p, stride, v, at, dst),
                    (4, 4) => x86::weighted_values::<4, 4, T>(p, stride, v, at, dst),
                    (4, 5) => x86::weighted_values::<4, 5, T>(p, stride, v, at, dst),
                    (4, _) => x86::weighted_values::<4, 6, T>(p, stride, v, at, dst),
                    (_, 1) => x86::weighted_values::<8, 1, T>(p, stride, v, at, dst),
                    (_, 2) => x86::weighted_values::<8, 2, T>(p, stride, v, at, dst),
                    (_, _) => x86::weighted_values::<8, 3, T>(p, stride, v, at, dst),
                }
            }
        }
        return;
    }
    for (g, dst) in dst.chunks_mut(hd).enumerate() {
        let p = &p[g * stride..][..len];
        match hd {
            64 => fused_sum::<64, T>(p, v, keys.at, dst),
            128 => fused_sum::<128, T>(p, v, keys.at, dst),
            _ => {
                for (&p, &at) in p.iter().zip(keys.at) {
                    for (y, x) in dst.iter_mut().zip(&v[at..at + hd]) {
                        *y += p * x.to_f32();
                    }
                }
            }
        }
    }
}

/// A score in sixteen fused lanes (see the module doc), `HD` a multiple of 16.
#[inline(always)]
fn score<const HD: usize, T: KvValue>(q: &[f32], k: &[T]) -> f32 {
    let (q, k): (&[f32; HD], &[T; HD]) = (
        q.try_into().expect("invariant: query row of HD values"),
        k.try_into().expect("invariant: key row of HD values"),
    );
    let mut acc = [0.0f32; 16];
    for c in 0..HD / 16 {
        for l in 0..16 {
            acc[l] = q[c * 16 + l].mul_add(k[c * 16 + l].to_f32(), acc[l]);
        }
    }
    combine8(&std::array::from_fn(|l| acc[l] + acc[l + 8]))
}

/// The value sum in fused multiply-adds, the row held in registers across the keys.
#[inline(always)]
fn fused_sum<const HD: usize, T: KvValue>(p: &[f32], v: &[T], keys: &[usize], dst: &mut [f32]) {
    let mut acc: [f32; HD] = dst.try_into().expect("invariant: output row of HD values");
    for (&p, &at) in p.iter().zip(keys) {
        let value: &[T; HD] = v[at..at + HD]
            .try_into()
            .expect("invariant: value row of HD values");
        for d in 0..HD {
            acc[d] = p.mul_add(value[d].to_f32(), acc[d]);
        }
    }
    dst.copy_from_slice(&acc);
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::KvValue;

    /// Asks for the rows of `width` values at `rows` in `store` (a prefetch never faults).
    #[inline]
    pub fn prefetch_rows<T>(store: &[T], rows: &[usize], width: usize) {
        let bytes = width * std::mem::size_of::<T>();
        for &at in rows {
            let row = store.as_ptr().wrapping_add(at) as *const i8;
            for line in (0..bytes).step_by(64) {
                // SAFETY: prefetching reads nothing and never faults, whatever the address.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(line)) };
            }
        }
    }

    /// `combine8` of lanes `l` plus `l + 8` of a sixteen-lane sum.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn combine16(acc: __m512) -> f32 {
        let half = _mm256_add_ps(
            _mm512_castps512_ps256(acc),
            _mm512_extractf32x8_ps::<1>(acc),
        );
        let t = _mm_add_ps(
            _mm256_castps256_ps128(half),
            _mm256_extractf128_ps::<1>(half),
        );
        let u = _mm_hadd_ps(t, t);
        _mm_cvtss_f32(_mm_add_ss(u, _mm_movehdup_ps(u)))
    }

    /// `combine16` of sixteen sums at once, with the same additions: lanes `l` and `l + 8`,
    /// then `l` and `l + 4`, then neighbours, then the two halves of each four. Lane `p` of the
    /// result is the sum of `acc[4 * (p % 4) + p / 4]`.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn combine16x16(acc: &[__m512; 16]) -> __m512 {
        let halves: [__m512; 8] = std::array::from_fn(|i| {
            let (a, b) = (acc[2 * i], acc[2 * i + 1]);
            _mm512_add_ps(
                _mm512_shuffle_f32x4::<0x44>(a, b),
                _mm512_shuffle_f32x4::<0xee>(a, b),
            )
        });
        let quarters: [__m512; 4] = std::array::from_fn(|i| {
            let (a, b) = (halves[2 * i], halves[2 * i + 1]);
            _mm512_add_ps(
                _mm512_shuffle_f32x4::<0x88>(a, b),
                _mm512_shuffle_f32x4::<0xdd>(a, b),
            )
        });
        let pairs: [__m512; 2] = std::array::from_fn(|i| {
            let (a, b) = (quarters[2 * i], quarters[2 * i + 1]);
            _mm512_add_ps(
                _mm512_shuffle_ps::<0x88>(a, b),
                _mm512_shuffle_ps::<0xdd>(a, b),
            )
        });
        _mm512_add_ps(
            _mm512_shuffle_ps::<0x88>(pairs[0], pairs[1]),
            _mm512_shuffle_ps::<0xdd>(pairs[0], pairs[1]),
        )
    }

    /// The scores of `Q` queries of `16 * CH` values against `16 / Q` keys: each (query, key)
    /// sum in its own register, every chunk of a key loaded once for all `Q` queries, then
    /// one transposed `combine16x16` instead of sixteen horizontal ones. Query `g`'s scores
    /// go to `scores[g * stride..][..16 / Q]`, in key order.
    ///
    /// # Safety
    /// As `key_scores`, with `Q` queries, `16 / Q` keys, and `scores` holding
    /// `(Q - 1) * stride + 16 / Q` values.
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub unsafe fn score_block<const CH: usize, const Q: usize, T: KvValue>(
        queries: &[&[f32]],
        k: &[T],
        keys: &[usize],
        scale: f32,
        scores: &mut [f32],
        stride: usize,
    ) {
        let per = 16 / Q;
        debug_assert!(queries.len() == Q && keys.len() == per);
        let q: [*const f32; Q] = std::array::from_fn(|g| queries[g].as_ptr());
        let rows: [*const T; 16] =
            std::array::from_fn(|j| k.as_ptr().add(*keys.get_unchecked(j % per)));
        let rows = &rows[..per];
        // Register `i` holds lane `p = 4 * (i % 4) + i / 4` of the result: query `p / per`
        // against key `p % per`.
        let mut acc = [_mm512_setzero_ps(); 16];
        for c in 0..CH {
            for (j, row) in rows.iter().enumerate() {
                let key = T::load16(row.add(16 * c));
                for (g, q) in q.iter().enumerate() {
                    let p = g * per + j;
                    let i = 4 * (p % 4) + p / 4;
                    acc[i] = _mm512_fmadd_ps(_mm512_loadu_ps(q.add(16 * c)), key, acc[i]);
                }
            }
        }
        let mut out = [0f32; 16];
        _mm512_storeu_ps(
            out.as_mut_ptr(),
            _mm512_mul_ps(combine16x16(&acc), _mm512_set1_ps(scale)),
        );
        for (g, run) in out.chunks_exact(per).enumerate() {
            scores
                .get_unchecked_mut(g * stride..g * stride + per)
                .copy_from_slice(run);
        }
    }

    /// `super::key_scores` for `NQ` queries of `16 * CH` values: two keys at a time, each
    /// key's chunks loaded once for every query.
    ///
    /// # Safety
    /// The CPU must have AVX-512F and FMA; every query holds `16 * CH` values, every
    /// `keys[j] + 16 * CH <= k.len()` and `scores` holds `(NQ - 1) * stride + keys.len()`.
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub unsafe fn key_scores<const CH: usize, const NQ: usize, T: KvValue>(
        queries: &[&[f32]],
        k: &[T],
        keys: &[usize],
        scale: f32,
        scores: &mut [f32],
        stride: usize,
    ) {
        let len = keys.len();
        let q: [*const f32; NQ] = std::array::from_fn(|g| queries[g].as_ptr());
        let base = k.as_ptr();
        let mut j = 0;
        while j + 2 <= len {
            let rows = [base.add(keys[j]), base.add(keys[j + 1])];
            let mut acc = [[_mm512_setzero_ps(); NQ]; 2];
            for c in 0..CH {
                let key = [
                    T::load16(rows[0].add(16 * c)),
                    T::load16(rows[1].add(16 * c)),
                ];
                for g in 0..NQ {
                    let q = _mm512_loadu_ps(q[g].add(16 * c));
                    acc[0][g] = _mm512_fmadd_ps(q, key[0], acc[0][g]);
                    acc[1][g] = _mm512_fmadd_ps(q, key[1], acc[1][g]);
                }
            }
            for (i, acc) in acc.iter().enumerate() {
                for (g, acc) in acc.iter().enumerate() {
                    *scores.get_unchecked_mut(g * stride + j + i) = combine16(*acc) * scale;
                }
            }
            j += 2;
        }
        if j < len {
            let row = base.add(keys[j]);
            let mut acc = [_mm512_setzero_ps(); NQ];
            for c in 0..CH {
                let key = T::load16(row.add(16 * c));
                for g in 0..NQ {
                    acc[g] = _mm512_fmadd_ps(_mm512_loadu_ps(q[g].add(16 * c)), key, acc[g]);
                }
            }
            for (g, acc) in acc.iter().enumerate() {
                *scores.get_unchecked_mut(g * stride + j) = combine16(*acc) * scale;
            }
        }
    }

    /// `super::weighted_values` for `NQ` queries of `16 * CH` values.
    ///
    /// # Safety
    /// As `key_scores`, with `dst` of `NQ * 16 * CH` values and `p` of
    /// `(NQ - 1) * stride + keys.len()`.
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub unsafe fn weighted_values<const CH: usize, const NQ: usize, T: KvValue>(
        p: &[f32],
        stride: usize,
        v: &[T],
        keys: &[usize],
        dst: &mut [f32],
    ) {
        let mut acc: [[__m512; CH]; NQ] = std::array::from_fn(|g| {
            std::array::from_fn(|c| _mm512_loadu_ps(dst.as_ptr().add((g * CH + c) * 16)))
        });
        let base = v.as_ptr();
        for (j, &at) in keys.iter().enumerate() {
            if let Some(&ahead) = keys.get(j + super::AHEAD) {
                prefetch_rows(v, &[ahead], CH * 16);
            }
            let row = base.add(at);
            let value: [__m512; CH] = std::array::from_fn(|c| T::load16(row.add(16 * c)));
            for (g, acc) in acc.iter_mut().enumerate() {
                let p = _mm512_set1_ps(*p.get_unchecked(g * stride + j));
                for (acc, value) in acc.iter_mut().zip(&value) {
                    *acc = _mm512_fmadd_ps(p, *value, *acc);
                }
            }
        }
        for (g, acc) in acc.iter().enumerate() {
            for (c, acc) in acc.iter().enumerate() {
                _mm512_storeu_ps(dst.as_mut_ptr().add((g * CH + c) * 16), *acc);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(1664525).wrapping_add(1013904223);
                (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5
            })
            .collect()
    }

    /// The portable loops, whatever this CPU has.
    fn portable<T: KvValue>(
        hd: usize,
        q: &[f32],
        k: &[T],
        keys: &[usize],
        p: &[f32],
    ) -> (Vec<f32>, Vec<f32>) {
        let scores = keys
            .iter()
            .map(|&at| {
                let s = match hd {
                    64 => score::<64, T>(q, &k[at..at + hd]),
                    _ => score::<128, T>(q, &k[at..at + hd]),
                };
                s * 0.125
            })
            .collect();
        let mut out = vec![0.0; hd];
        match hd {
            64 => fused_sum::<64, T>(p, k, keys, &mut out),
            _ => fused_sum::<128, T>(p, k, keys, &mut out),
        }
        (scores, out)
    }

    #[test]
    fn the_fast_loops_give_the_portable_bits_and_track_f64() {
        for hd in [64, 128] {
            let store = values(40 * hd, hd as u32);
            let halves: Vec<f16> = store.iter().map(|&x| f16::from_f32(x)).collect();
            check_store(hd, &store);
            check_store(hd, &halves);
        }
        assert!(Rows::new(&[10], 64, 73).is_none());
    }

    fn check_store<T: KvValue>(hd: usize, store: &[T]) {
        let keys: Vec<usize> = (0..37).map(|i| (i * 13 % 40) * hd).collect();
        let q = values(hd, 3);
        let rows = Rows::new(&keys, hd, store.len()).unwrap();
        let kind = std::any::type_name::<T>();
        for nq in 1..=9 {
            let qs: Vec<Vec<f32>> = (0..nq).map(|g| values(hd, 3 + g as u32)).collect();
            let q_refs: Vec<&[f32]> = qs.iter().map(|q| q.as_slice()).collect();
            let ps: Vec<f32> = (0..nq)
                .flat_map(|g| values(keys.len(), 9 + g as u32))
                .collect();
            let mut scores = vec![0.0; nq * keys.len()];
            key_scores(&q_refs, store, rows, 0.125, &mut scores, keys.len());
            let mut out = vec![0.0; nq * hd];
            weighted_values(&ps, keys.len(), store, rows, &mut out);
            for g in 0..nq {
                let p_g = &ps[g * keys.len()..(g + 1) * keys.len()];
                let (want_scores, want_out) = portable(hd, &qs[g], store, &keys, p_g);
                assert_eq!(
                    &scores[g * keys.len()..][..keys.len()],
                    &want_scores[..],
                    "{kind}, hd {hd}, {nq} queries, query {g}: scores"
                );
                assert_eq!(
                    &out[g * hd..][..hd],
                    &want_out[..],
                    "{kind}, hd {hd}, {nq} queries, query {g}: values"
                );
            }
        }
        let mut scores = vec![0.0; keys.len()];
        key_scores(&[&q], store, rows, 0.125, &mut scores, keys.len());
        for (j, &at) in keys.iter().enumerate() {
            let exact: f64 = (0..hd)
                .map(|i| q[i] as f64 * store[at + i].to_f32() as f64)
                .sum();
            assert!((scores[j] as f64 - exact * 0.125).abs() < 1e-5, "{kind}");
        }
    }
}
