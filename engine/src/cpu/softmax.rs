//! The softmax of attention scores, in arithmetic that vectorises and gives the same bits on
//! every CPU: `exp` is computed in f32 fused multiply-adds (Cody-Waite reduction by ln 2,
//! Cephes' degree-6 polynomial, the power of two built from its bits), the maximum and the
//! sum run in eight fixed lanes. The library `exp` is a call per value that no compiler
//! vectorises, and it was the largest part of attention; this one is within 2 ulp of the
//! exact value (tested) and, like every reduction of the attention kernel, depends only on
//! the row's own scores, so results stay batch invariant.

/// `e^x` within 2 ulp of the exact value from -87 to 88; 0 below (where `e^x` is under
/// f32's smallest normal and vanishes beside the row's maximum). Above 88 the result is
/// wrong (the caller's business: `silu` takes such values as infinite).
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split so that `n * LN2_HI` is exact for the `n` that occur.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const FLOOR: f32 = -87.0;
    // Adding 1.5 * 2^23 rounds to an integer (ties to even) that then sits in the low bits
    // of the sum's mantissa: `n` and its integer come without a float-to-int conversion,
    // which Rust's saturating `as` would keep from vectorising.
    const SHIFTER: f32 = 12_582_912.0;
    let clamped = x.max(FLOOR);
    let shifted = clamped.mul_add(LOG2E, SHIFTER);
    let n = shifted - SHIFTER;
    let r = (-n).mul_add(LN2_HI, clamped);
    let r = (-n).mul_add(LN2_LO, r);
    let mut p = 1.987_569_1e-4f32;
    p = p.mul_add(r, 1.398_199_9e-3);
    p = p.mul_add(r, 8.333_452e-3);
    p = p.mul_add(r, 4.166_579_6e-2);
    p = p.mul_add(r, 1.666_666_5e-1);
    p = p.mul_add(r, 0.5);
    let y = p.mul_add(r * r, r) + 1.0;
    let exponent = shifted
        .to_bits()
        .wrapping_sub(SHIFTER.to_bits())
        .wrapping_add(127);
    let scale = f32::from_bits(exponent << 23);
    if x < FLOOR {
        0.0
    } else {
        y * scale
    }
}

/// `xs[i] = e^(xs[i] - max) / sum_j e^(xs[j] - max)`, the division taken as a multiply by
/// the sum's reciprocal (one division a row instead of one a value: measured on an Intel Xeon,
/// the divisions were 5% of attention over 900 keys).
pub fn softmax_in_place(xs: &mut [f32]) {
    let (_, sum) = exp_in_place(xs);
    let reciprocal = 1.0 / sum;
    for x in xs.iter_mut() {
        *x *= reciprocal;
    }
}

/// `softmax_in_place` with a sink: a logit `sink` that joins the maximum and the denominator
/// but has no value of its own (gpt-oss's attention sinks), so the row's probabilities sum to
/// less than one: `xs[i] = e^(xs[i] - m) / (sum_j e^(xs[j] - m) + e^(sink - m))` with `m` the
/// larger of the row's maximum and the sink.
pub fn softmax_with_sink(xs: &mut [f32], sink: f32) {
    let (max, sum) = exp_in_place(xs);
    // The values hold e^(x - max); where the sink is larger, both terms move to its scale.
    let (factor, total) = if sink > max {
        let factor = exp(max - sink);
        (factor, sum * factor + 1.0)
    } else {
        (1.0, sum + exp(sink - max))
    };
    let reciprocal = factor / total;
    for x in xs.iter_mut() {
        *x *= reciprocal;
    }
}

/// `xs[i] = e^(xs[i] - max)`, unnormalised: returns `max` and the sum of the new values (the
/// part of a softmax that one run of a longer row's keys contributes). The sum runs in eight
/// lanes (value `i` into lane `i % 8`, in index order, combined by `combine8`; the last
/// `len % 8` values added after, in order); the maximum is exact in any order.
pub fn exp_in_place(xs: &mut [f32]) -> (f32, f32) {
    #[cfg(target_arch = "x86_64")]
    if avx512() {
        // SAFETY: AVX-512F was detected.
        return unsafe { x86::exp_in_place(xs) };
    }
    portable_exp_in_place(xs)
}

/// `exp_in_place` in plain Rust, on any CPU.
fn portable_exp_in_place(xs: &mut [f32]) -> (f32, f32) {
    let mut lanes = [f32::NEG_INFINITY; 8];
    let mut chunks = xs.chunks_exact(8);
    for c in &mut chunks {
        for l in 0..8 {
            lanes[l] = lanes[l].max(c[l]);
        }
    }
    let max = chunks
        .remainder()
        .iter()
        .chain(&lanes)
        .copied()
        .fold(f32::NEG_INFINITY, f32::max);
    for x in xs.iter_mut() {
        *x = exp(*x - max);
    }
    let mut sums = [0f32; 8];
    let mut chunks = xs.chunks_exact(8);
    for c in &mut chunks {
        for l in 0..8 {
            sums[l] += c[l];
        }
    }
    let mut sum = crate::cpu::reduce::combine8(&sums);
    for x in chunks.remainder() {
        sum += x;
    }
    (max, sum)
}

/// Whether this CPU runs the AVX-512 pass (checked once).
#[cfg(target_arch = "x86_64")]
fn avx512() -> bool {
    static AVX512: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVX512.get_or_init(|| is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("fma"))
}

/// `exp_in_place` in sixteen lanes, with the same bits: `exp`'s fused multiply-adds, plain
/// multiplies and adds one for one (an FMA rounds once whoever computes it), and the
/// eight-lane sum taken in the same pass as the exponentials, so that its chain of dependent
/// adds overlaps their arithmetic (measured: a 528-score row went from 258 to 154 ns on an
/// AMD EPYC of family 26).
#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// `super::exp` of sixteen values.
    #[inline]
    #[target_feature(enable = "avx512f,fma")]
    unsafe fn exp16(x: __m512) -> __m512 {
        let set = _mm512_set1_ps;
        let clamped = _mm512_max_ps(x, set(-87.0));
        let shifter = set(12_582_912.0);
        let shifted = _mm512_fmadd_ps(clamped, set(std::f32::consts::LOG2_E), shifter);
        let n = _mm512_sub_ps(shifted, shifter);
        let r = _mm512_fnmadd_ps(n, set(0.693_359_4), clamped);
        let r = _mm512_fnmadd_ps(n, set(-2.121_944_4e-4), r);
        let mut p = set(1.987_569_1e-4);
        for c in [
            1.398_199_9e-3,
            8.333_452e-3,
            4.166_579_6e-2,
            1.666_666_5e-1,
            0.5,
        ] {
            p = _mm512_fmadd_ps(p, r, set(c));
        }
        let y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), set(1.0));
        let exponent = _mm512_add_epi32(
            _mm512_sub_epi32(_mm512_castps_si512(shifted), _mm512_castps_si512(shifter)),
            _mm512_set1_epi32(127),
        );
        let scale = _mm512_castsi512_ps(_mm512_slli_epi32::<23>(exponent));
        let below = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, set(-87.0));
        _mm512_maskz_mul_ps(!below, y, scale)
    }

    /// `super::exp_in_place` on a CPU with AVX-512F.
    #[target_feature(enable = "avx512f,fma")]
    pub unsafe fn exp_in_place(xs: &mut [f32]) -> (f32, f32) {
        let len = xs.len();
        let at = xs.as_mut_ptr();
        // `max(x, m)` returns `m` where `x` is NaN, as `f32::max` ignores NaN.
        let mut m = [_mm512_set1_ps(f32::NEG_INFINITY); 4];
        let mut i = 0;
        while i + 64 <= len {
            for (a, m) in m.iter_mut().enumerate() {
                *m = _mm512_max_ps(_mm512_loadu_ps(at.add(i + 16 * a)), *m);
            }
            i += 64;
        }
        while i + 16 <= len {
            m[0] = _mm512_max_ps(_mm512_loadu_ps(at.add(i)), m[0]);
            i += 16;
        }
        let tail = (1u32 << (len - i)) as u16 - 1;
        let rest = _mm512_mask_loadu_ps(_mm512_set1_ps(f32::NEG_INFINITY), tail, at.add(i));
        m[1] = _mm512_max_ps(rest, m[1]);
        let max = _mm512_reduce_max_ps(_mm512_max_ps(
            _mm512_max_ps(m[0], m[1]),
            _mm512_max_ps(m[2], m[3]),
        ));
        let shift = _mm512_set1_ps(max);
        let mut sums = _mm256_setzero_ps();
        let mut i = 0;
        while i + 16 <= len {
            let e = exp16(_mm512_sub_ps(_mm512_loadu_ps(at.add(i)), shift));
            _mm512_storeu_ps(at.add(i), e);
            sums = _mm256_add_ps(sums, _mm512_castps512_ps256(e));
            sums = _mm256_add_ps(
                sums,
                _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(e))),
            );
            i += 16;
        }
        let tail = (1u32 << (len - i)) as u16 - 1;
        let e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, at.add(i)), shift));
        _mm512_mask_storeu_ps(at.add(i), tail, e);
        if len - i >= 8 {
            sums = _mm256_add_ps(sums, _mm512_castps512_ps256(e));
            i += 8;
        }
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), sums);
        let mut sum = crate::cpu::reduce::combine8(&lanes);
        for x in &xs[i..] {
            sum += x;
        }
        (max, sum)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Distance in units in the last place between two positive floats.
    fn ulps(a: f32, b: f32) -> u32 {
        a.to_bits().abs_diff(b.to_bits())
    }

    #[test]
    fn exp_is_within_two_ulp_from_its_floor_to_88() {
        let mut worst = 0;
        for i in 0..=4_000_000u32 {
            let x = -87.0 + 175.0 * i as f32 / 4_000_000.0;
            let exact = (x as f64).exp() as f32;
            let u = ulps(exp(x), exact);
            assert!(u <= 2, "exp({x}) = {} vs {exact}: {u} ulp", exp(x));
            worst = worst.max(u);
        }
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(-100.0), 0.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        eprintln!("worst {worst} ulp");
    }

    #[test]
    fn softmax_sums_to_one_and_matches_the_definition() {
        let xs: Vec<f32> = (0..37)
            .map(|i| ((i * 7919) % 101) as f32 / 9.0 - 5.0)
            .collect();
        let mut got = xs.clone();
        softmax_in_place(&mut got);
        let max = xs.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let z: f64 = xs.iter().map(|&x| (x as f64 - max).exp()).sum();
        for (g, &x) in got.iter().zip(&xs) {
            let want = (x as f64 - max).exp() / z;
            assert!(
                (*g as f64 - want).abs() <= 1e-6 * want.max(1e-3),
                "{g} vs {want}"
            );
        }
        let total: f32 = got.iter().sum();
        assert!((total - 1.0).abs() < 1e-5, "{total}");
    }

    #[test]
    fn every_cpu_computes_the_portable_bits() {
        #[cfg(target_arch = "x86_64")]
        if !avx512() {
            eprintln!("no AVX-512 here: only the portable pass runs");
        }
        let mut seed = 7u32;
        let mut next = move || {
            seed = seed.wrapping_mul(1664525).wrapping_add(1013904223);
            (seed >> 8) as f32 / (1u32 << 24) as f32
        };
        for len in (0..=80).chain([527, 528, 1000]) {
            let mut xs: Vec<f32> = (0..len).map(|_| next() * 200.0 - 150.0).collect();
            if len > 5 {
                // Below the floor, at it, and NaN, which the maximum ignores.
                xs[1] = -1000.0;
                xs[2] = f32::NEG_INFINITY;
                xs[len / 2] = f32::NAN;
            }
            let mut want = xs.clone();
            let mut got = xs.clone();
            let (want_max, want_sum) = portable_exp_in_place(&mut want);
            let (max, sum) = exp_in_place(&mut got);
            assert_eq!(max.to_bits(), want_max.to_bits(), "len {len}: max");
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "len {len}: exponentials");
            assert_eq!(sum.to_bits(), want_sum.to_bits(), "len {len}: sum");
        }
    }
}
