//! Paged attention's second inner loop (the first is `scores`): the probability-weighted sum
//! of a row's values. For head widths that are multiples of 16 (64, 128) the value sum uses
//! fused multiply-adds in sixteen lanes, adding `p * v` per key, in key order, with one
//! rounding each; the AVX-512 version and the portable one give the same bits (an FMA rounds
//! once whoever computes it). The AVX-512 version reads each value row once for several queries and
//! asks for the rows 32 keys ahead of the one it reads (a context's blocks are short
//! contiguous runs, which the hardware prefetcher alone follows late). Other widths use
//! separate multiplies and adds. Every sum runs over one row's keys in one order, so a row's
//! result never depends on the other rows of the batch.

use super::avx512;
use super::slots::Rows;
use crate::cpu::kv_store::KvValue;

/// How many keys ahead the loops that stream keys or values from memory ask for them.
#[cfg(target_arch = "x86_64")]
const AHEAD: usize = 32;

/// Queries whose value sums stay in registers together (`ch` accumulators each).
#[cfg(target_arch = "x86_64")]
fn values_at_once(ch: usize) -> usize {
    if ch <= 4 {
        6
    } else {
        3
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
    let (hd, len) = (keys.width, keys.len());
    let nq = dst.len() / hd;
    assert!(dst.len() == nq * hd && len <= stride && keys.store <= v.len());
    assert!(nq == 0 || (nq - 1) * stride + len <= p.len());
    #[cfg(target_arch = "x86_64")]
    if avx512() && matches!(hd, 64 | 128) {
        let ch = hd / 16;
        let at_once = values_at_once(ch);
        for (c, dst) in dst.chunks_mut(at_once * hd).enumerate() {
            let p = &p[c * at_once * stride..];
            let at = keys.slots;
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
            64 => fused_sum::<64, T>(p, v, keys.slots, dst),
            128 => fused_sum::<128, T>(p, v, keys.slots, dst),
            _ => {
                for (&p, &at) in p.iter().zip(keys.slots) {
                    for (y, x) in dst.iter_mut().zip(&v[at * hd..(at + 1) * hd]) {
                        *y += p * x.to_f32();
                    }
                }
            }
        }
    }
}

/// The value sum in fused multiply-adds, the row held in registers across the keys.
#[inline(always)]
fn fused_sum<const HD: usize, T: KvValue>(p: &[f32], v: &[T], keys: &[usize], dst: &mut [f32]) {
    let mut acc: [f32; HD] = dst.try_into().expect("invariant: output row of HD values");
    for (&p, &at) in p.iter().zip(keys) {
        let value: &[T; HD] = v[at * HD..(at + 1) * HD]
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
                prefetch_rows(v, &[ahead * CH * 16], CH * 16);
            }
            let row = base.add(at * CH * 16);
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
    use crate::cpu::attention::tests::values;
    use half::f16;

    #[test]
    fn the_fast_value_loop_gives_the_portable_bits() {
        for hd in [64, 128] {
            let store = values(40 * hd, hd as u32);
            let halves: Vec<f16> = store.iter().map(|&x| f16::from_f32(x)).collect();
            check_values(hd, &store);
            check_values(hd, &halves);
        }
        assert!(Rows::new(&[1], 64, 127).is_none());
        assert!(Rows::new(&[1], 64, 128).is_some());
    }

    fn check_values<T: KvValue>(hd: usize, store: &[T]) {
        let keys: Vec<usize> = (0..37).map(|i| i * 13 % 40).collect();
        let rows = Rows::new(&keys, hd, store.len()).unwrap();
        let kind = std::any::type_name::<T>();
        for nq in 1..=9 {
            let ps: Vec<f32> = (0..nq)
                .flat_map(|g| values(keys.len(), 9 + g as u32))
                .collect();
            let mut out = vec![0.0; nq * hd];
            weighted_values(&ps, keys.len(), store, rows, &mut out);
            for g in 0..nq {
                let p_g = &ps[g * keys.len()..(g + 1) * keys.len()];
                let mut want = vec![0.0; hd];
                match hd {
                    64 => fused_sum::<64, T>(p_g, store, &keys, &mut want),
                    _ => fused_sum::<128, T>(p_g, store, &keys, &mut want),
                }
                assert_eq!(
                    &out[g * hd..][..hd],
                    &want[..],
                    "{kind}, hd {hd}, {nq} queries, query {g}"
                );
            }
        }
    }
}
