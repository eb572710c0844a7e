//! `KvValue`: how a stored key or value (f32, or f16 rounded to nearest and clamped to its
//! range) is written from f32 and read back as f32, one at a time or sixteen lanes at once.

use half::f16;

use super::half_rows::to_f16;

/// A stored key or value: how it is written from f32 and read back (exactly) as f32.
/// Zero is `bytemuck::Zeroable`'s all-zero bits (0.0 in both types).
pub trait KvValue: Copy + Send + Sync + bytemuck::Zeroable {
    /// The value as f32 (exact).
    fn to_f32(self) -> f32;

    /// `dst[i] = src[i]`, as this type stores it.
    fn store(src: &[f32], dst: &mut [Self]);

    /// Sixteen values from `at`, as f32 lanes.
    ///
    /// # Safety
    /// The CPU must have AVX-512F, and sixteen values must be readable from `at`.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load16(at: *const Self) -> std::arch::x86_64::__m512;
}

impl KvValue for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }

    fn store(src: &[f32], dst: &mut [Self]) {
        dst.copy_from_slice(src);
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(at: *const Self) -> std::arch::x86_64::__m512 {
        std::arch::x86_64::_mm512_loadu_ps(at)
    }
}

impl KvValue for f16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }

    fn store(src: &[f32], dst: &mut [Self]) {
        to_f16(src, dst);
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(at: *const Self) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        _mm512_cvtph_ps(_mm256_loadu_si256(at as *const __m256i))
    }
}
