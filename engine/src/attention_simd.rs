//! AVX2 versions of paged attention's two inner loops for head widths that are multiples of 8,
//! bit-identical to the portable ones in `attention`: a score is `reduce::dot`'s eight lanes of
//! separate multiplies and adds (one 256-bit register), combined in its fixed order, and the
//! value sum adds `p * v` per key in key order. Only the scheduling differs: four keys' dot
//! products run at once so their chains of dependent adds overlap, and the output row stays
//! in registers across the keys.

use std::arch::x86_64::*;
use std::sync::OnceLock;

/// Whether this CPU runs the AVX2 loops (checked once).
pub fn available() -> bool {
    static AVX2: OnceLock<bool> = OnceLock::new();
    *AVX2.get_or_init(|| is_x86_feature_detected!("avx2"))
}

/// `dot`'s combination of its eight partial sums `((a0 + a4) + (a1 + a5)) + ((a2 + a6) + (a3 +
/// a7))`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn combine(acc: __m256) -> f32 {
    let t = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps::<1>(acc));
    let u = _mm_hadd_ps(t, t);
    _mm_cvtss_f32(_mm_add_ss(u, _mm_movehdup_ps(u)))
}

/// `scores[j] = dot(query, k[keys[j]..]) * scale`.
///
/// # Safety
/// The CPU must have AVX2 (`available`); `query` holds `8 * CH` values, every
/// `keys[j] + 8 * CH <= k.len()` and `scores.len() == keys.len()`.
#[target_feature(enable = "avx2")]
pub unsafe fn key_scores<const CH: usize>(
    query: &[f32],
    k: &[f32],
    keys: &[usize],
    scale: f32,
    scores: &mut [f32],
) {
    debug_assert!(query.len() == 8 * CH && scores.len() == keys.len());
    let q: [__m256; CH] = std::array::from_fn(|c| _mm256_loadu_ps(query.as_ptr().add(8 * c)));
    let base = k.as_ptr();
    let mut j = 0;
    while j + 4 <= keys.len() {
        let rows = [
            base.add(keys[j]),
            base.add(keys[j + 1]),
            base.add(keys[j + 2]),
            base.add(keys[j + 3]),
        ];
        let mut acc = [_mm256_setzero_ps(); 4];
        for (c, q) in q.iter().enumerate() {
            for (acc, row) in acc.iter_mut().zip(&rows) {
                let product = _mm256_mul_ps(*q, _mm256_loadu_ps(row.add(8 * c)));
                *acc = _mm256_add_ps(*acc, product);
            }
        }
        for (i, acc) in acc.iter().enumerate() {
            *scores.get_unchecked_mut(j + i) = combine(*acc) * scale;
        }
        j += 4;
    }
    while j < keys.len() {
        let row = base.add(keys[j]);
        let mut acc = _mm256_setzero_ps();
        for (c, q) in q.iter().enumerate() {
            acc = _mm256_add_ps(acc, _mm256_mul_ps(*q, _mm256_loadu_ps(row.add(8 * c))));
        }
        *scores.get_unchecked_mut(j) = combine(acc) * scale;
        j += 1;
    }
}

/// `dst += sum_j p[j] * v[keys[j]..]`, in key order.
///
/// # Safety
/// As `key_scores`, with `dst` of `8 * CH` values and `p.len() == keys.len()`.
#[target_feature(enable = "avx2")]
pub unsafe fn weighted_values<const CH: usize>(
    p: &[f32],
    v: &[f32],
    keys: &[usize],
    dst: &mut [f32],
) {
    debug_assert!(dst.len() == 8 * CH && p.len() == keys.len());
    let mut acc: [__m256; CH] = std::array::from_fn(|c| _mm256_loadu_ps(dst.as_ptr().add(8 * c)));
    let base = v.as_ptr();
    for (&p, &at) in p.iter().zip(keys) {
        let p = _mm256_set1_ps(p);
        let row = base.add(at);
        for (c, acc) in acc.iter_mut().enumerate() {
            *acc = _mm256_add_ps(*acc, _mm256_mul_ps(p, _mm256_loadu_ps(row.add(8 * c))));
        }
    }
    for (c, acc) in acc.iter().enumerate() {
        _mm256_storeu_ps(dst.as_mut_ptr().add(8 * c), *acc);
    }
}
