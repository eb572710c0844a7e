//! The softmax of attention scores, in arithmetic that vectorises and gives the same bits on
//! every CPU: `exp` is computed in plain f32 multiplies and adds (Cody-Waite reduction by ln 2,
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
    let shifted = clamped * LOG2E + SHIFTER;
    let n = shifted - SHIFTER;
    let r = clamped - n * LN2_HI - n * LN2_LO;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let y = p * (r * r) + r + 1.0;
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

/// `xs[i] = e^(xs[i] - max) / sum_j e^(xs[j] - max)`.
pub fn softmax_in_place(xs: &mut [f32]) {
    let (_, sum) = exp_in_place(xs);
    for x in xs.iter_mut() {
        *x /= sum;
    }
}

/// `xs[i] = e^(xs[i] - max)`, unnormalised: returns `max` and the sum of the new values (the
/// part of a softmax that one run of a longer row's keys contributes).
pub fn exp_in_place(xs: &mut [f32]) -> (f32, f32) {
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
    let mut sum = crate::reduce::combine8(&sums);
    for x in chunks.remainder() {
        sum += x;
    }
    (max, sum)
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
}
