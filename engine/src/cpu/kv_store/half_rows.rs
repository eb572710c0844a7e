//! Rounding f32 keys and values to the f16 the store keeps: clamped to f16's range so that an
//! outlier stays finite, nearest-even, with F16C where the CPU has it (the same bits either
//! way).

use half::f16;

/// f16's largest finite value: writes clamp to it, so an outlier stays finite.
pub(crate) const F16_MAX: f32 = 65504.0;

/// `dst[i] = src[i]` clamped to f16's range and rounded to the nearest f16 (ties to even);
/// NaN stays NaN. The F16C conversion and the portable one give the same bits.
pub(crate) fn to_f16(src: &[f32], dst: &mut [f16]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("f16c") && std::arch::is_x86_feature_detected!("avx") {
        // SAFETY: F16C and AVX were detected.
        unsafe { x86_to_f16(src, dst) };
        return;
    }
    for (d, s) in dst.iter_mut().zip(src) {
        *d = f16::from_f32(s.clamp(-F16_MAX, F16_MAX));
    }
}

/// `to_f16` eight values at a time.
///
/// # Safety
/// The CPU must have F16C and AVX.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,f16c")]
unsafe fn x86_to_f16(src: &[f32], dst: &mut [f16]) {
    use std::arch::x86_64::*;
    let n = src.len().min(dst.len());
    let (hi, lo) = (_mm256_set1_ps(F16_MAX), _mm256_set1_ps(-F16_MAX));
    let mut i = 0;
    while i + 8 <= n {
        let x = _mm256_loadu_ps(src.as_ptr().add(i));
        // The bound first: `min`/`max` return their second operand when one is NaN.
        let x = _mm256_max_ps(lo, _mm256_min_ps(hi, x));
        let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x);
        _mm_storeu_si128(dst.as_mut_ptr().add(i) as *mut __m128i, h);
        i += 8;
    }
    for (d, s) in dst[i..n].iter_mut().zip(&src[i..n]) {
        *d = f16::from_f32(s.clamp(-F16_MAX, F16_MAX));
    }
}
