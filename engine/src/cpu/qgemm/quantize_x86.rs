//! Activation quantization for the 32-value formats in AVX-512: a row's blocks take their
//! largest magnitude, scale and rounded 8-bit values in sixteen lanes, with the same
//! operations in the same order as the portable `quantize_q8_0` (maximum is exact; the values
//! are `x * (1 / d)` rounded half away from zero through an exact `v - trunc(v)`), so both give
//! the same bits. The per-block scale and sum stay scalar, once per 32 values.

use std::arch::x86_64::*;

/// Quantizes `x` (a multiple of 32 values) into `q`; `scales[b]` gets block `b`'s
/// unrounded scale `amax / 127` and `sums[b]` the sum of its 8-bit values.
///
/// # Safety
/// The CPU must have AVX-512 F/BW/DQ; `q` holds `x.len()` values and `scales` and `sums`
/// `x.len() / 32` each.
#[target_feature(enable = "avx512f,avx512bw,avx512dq")]
pub unsafe fn quantize_blocks32(x: &[f32], q: &mut [i8], scales: &mut [f32], sums: &mut [i32]) {
    let blocks = x.len() / 32;
    assert!(q.len() >= blocks * 32 && scales.len() >= blocks && sums.len() >= blocks);
    let magnitude = _mm512_set1_ps(f32::from_bits(0x7fff_ffff));
    let sign = _mm512_set1_ps(-0.0);
    let one = _mm512_set1_ps(1.0);
    let half = _mm512_set1_ps(0.5);
    let low_high = (_mm512_set1_ps(-128.0), _mm512_set1_ps(127.0));
    for b in 0..blocks {
        let at = x.as_ptr().add(32 * b);
        let xs = [_mm512_loadu_ps(at), _mm512_loadu_ps(at.add(16))];
        // `max(|x|, lane)` keeps the lane where `x` is NaN, as `f32::max` does.
        let lanes = _mm512_max_ps(
            _mm512_and_ps(xs[1], magnitude),
            _mm512_max_ps(_mm512_and_ps(xs[0], magnitude), _mm512_setzero_ps()),
        );
        let amax = _mm512_reduce_max_ps(lanes);
        let d = amax / 127.0;
        let id = _mm512_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
        let mut total = _mm512_setzero_si512();
        for (h, &x) in xs.iter().enumerate() {
            let v = _mm512_mul_ps(x, id);
            let t = _mm512_roundscale_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(v);
            let frac = _mm512_and_ps(_mm512_sub_ps(v, t), magnitude);
            let up = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(frac, half);
            let step = _mm512_or_ps(_mm512_and_ps(v, sign), one);
            let rounded = _mm512_mask_add_ps(t, up, t, step);
            // The portable clamp: `max`/`min` return their second operand when either is
            // NaN, so NaN passes through both and converts to i32::MIN, whose low byte is 0
            // (`NaN as i32 as i8` is 0 too).
            let clamped = _mm512_min_ps(low_high.1, _mm512_max_ps(low_high.0, rounded));
            let ints = _mm512_cvtepi8_epi32(_mm512_cvtepi32_epi8(_mm512_cvttps_epi32(clamped)));
            total = _mm512_add_epi32(total, ints);
            _mm_storeu_si128(
                q.as_mut_ptr().add(32 * b + 16 * h) as *mut __m128i,
                _mm512_cvtepi32_epi8(ints),
            );
        }
        *scales.get_unchecked_mut(b) = d;
        *sums.get_unchecked_mut(b) = _mm512_reduce_add_epi32(total);
    }
}
