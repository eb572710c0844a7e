//! x86-64 versions of the tile kernels. Unsigned weights meet signed activations in
//! `maddubs` (AVX2) or `dpbusd` (VNNI); signed Q8_0 weights move their sign onto the
//! activation first. Block sums go to float once per block (`Block32`) or per super-block
//! (`Super256`, after the integer sub-scales are applied with a 16-bit multiply-add).

use std::arch::x86_64::*;

use super::formats::{
    decode, Block32Row, Block32Tile, DecodedRow, QuantFormat, Super256Tile, TILE,
};

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn hsum256(v: __m256) -> f32 {
    let pair = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let pair = _mm_add_ps(pair, _mm_movehl_ps(pair, pair));
    _mm_cvtss_f32(_mm_add_ss(pair, _mm_shuffle_ps(pair, pair, 1)))
}

/// Signed or unsigned bytes times signed bytes, pairwise summed to 16 bits.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn maddubs256<const SIGNED: bool>(w: __m256i, x: __m256i) -> __m256i {
    if SIGNED {
        _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w))
    } else {
        _mm256_maddubs_epi16(w, x)
    }
}

/// See `kernels::block32_dot4`.
///
/// # Safety
/// The CPU must have AVX2 and FMA; `tile` must hold four rows of `xq.len()` values.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn block32_dot4_avx2<const SIGNED: bool>(
    tile: Block32Tile<'_>,
    xq: &[i8],
    xd: &[f32],
) -> [f32; TILE] {
    let k = xq.len();
    let nb = k / 32;
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); TILE];
    let wq = tile.q.as_ptr();
    for b in 0..nb {
        let x = _mm256_loadu_si256(xq.as_ptr().add(b * 32) as *const __m256i);
        let dx = *xd.get_unchecked(b);
        for (c, acc) in acc.iter_mut().enumerate() {
            let w = _mm256_loadu_si256(wq.add(c * k + b * 32) as *const __m256i);
            let p = _mm256_madd_epi16(maddubs256::<SIGNED>(w, x), ones);
            let s = _mm256_set1_ps(*tile.scale.get_unchecked(c * nb + b) * dx);
            *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), s, *acc);
        }
    }
    let mut out = [0f32; TILE];
    for (o, a) in out.iter_mut().zip(acc) {
        *o = hsum256(a);
    }
    out
}

/// See `kernels::super256_dot4`.
///
/// # Safety
/// The CPU must have AVX2 and FMA; `tile` must hold four rows of `xq.len()` values.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn super256_dot4_avx2(tile: Super256Tile<'_>, xq: &[i8], xd: &[f32]) -> [f32; TILE] {
    let k = xq.len();
    let ns = k / 256;
    let mut acc = [_mm256_setzero_ps(); TILE];
    let wq = tile.q.as_ptr();
    let sp = tile.sub_pairs.as_ptr();
    for s in 0..ns {
        let mut iacc = [_mm256_setzero_si256(); TILE];
        for j in 0..8 {
            let at = s * 256 + j * 32;
            let x = _mm256_loadu_si256(xq.as_ptr().add(at) as *const __m256i);
            for (c, iacc) in iacc.iter_mut().enumerate() {
                let w = _mm256_loadu_si256(wq.add(c * k + at) as *const __m256i);
                let sub = _mm256_loadu_si256(sp.add(c * k / 2 + at / 2) as *const __m256i);
                let p = _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), sub);
                *iacc = _mm256_add_epi32(*iacc, p);
            }
        }
        let dx = *xd.get_unchecked(s);
        for c in 0..TILE {
            let scale = _mm256_set1_ps(*tile.d.get_unchecked(c * ns + s) * dx);
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc[c]), scale, acc[c]);
        }
    }
    let mut out = [0f32; TILE];
    for (o, a) in out.iter_mut().zip(acc) {
        *o = hsum256(a);
    }
    out
}

/// See `kernels::super256_dot4`: 64 values per step.
///
/// # Safety
/// The CPU must have AVX-512 F/BW/VL/DQ and VNNI; `tile` must hold four rows of `xq.len()`
/// values.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")]
pub unsafe fn super256_dot4_avx512(tile: Super256Tile<'_>, xq: &[i8], xd: &[f32]) -> [f32; TILE] {
    let k = xq.len();
    let ns = k / 256;
    let mut acc = [_mm512_setzero_ps(); TILE];
    let wq = tile.q.as_ptr();
    let sp = tile.sub_pairs.as_ptr();
    for s in 0..ns {
        let mut iacc = [_mm512_setzero_si512(); TILE];
        for j in 0..4 {
            let at = s * 256 + j * 64;
            let x = _mm512_loadu_si512(xq.as_ptr().add(at) as *const __m512i);
            for (c, iacc) in iacc.iter_mut().enumerate() {
                let w = _mm512_loadu_si512(wq.add(c * k + at) as *const __m512i);
                let sub = _mm512_loadu_si512(sp.add(c * k / 2 + at / 2) as *const __m512i);
                let p = _mm512_madd_epi16(_mm512_maddubs_epi16(w, x), sub);
                *iacc = _mm512_add_epi32(*iacc, p);
            }
        }
        let dx = *xd.get_unchecked(s);
        for c in 0..TILE {
            let scale = _mm512_set1_ps(*tile.d.get_unchecked(c * ns + s) * dx);
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iacc[c]), scale, acc[c]);
        }
    }
    let mut out = [0f32; TILE];
    for (o, a) in out.iter_mut().zip(acc) {
        *o = _mm512_reduce_add_ps(a);
    }
    out
}

/// f16 bits at `at` to f32 with F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16_at(block: &[u8], at: usize) -> f32 {
    let bits = u16::from_le_bytes([block[at], block[at + 1]]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

/// 16 packed bytes to 32 values: low nibbles first, then high nibbles (ggml's order).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn nibbles(packed: *const u8) -> __m256i {
    let p = _mm_loadu_si128(packed as *const __m128i);
    let mask = _mm_set1_epi8(0x0f);
    let low = _mm_and_si128(p, mask);
    let high = _mm_and_si128(_mm_srli_epi16(p, 4), mask);
    _mm256_set_m128i(high, low)
}

/// 32 bits to 32 bytes, 0xff where the bit is set.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn bits_to_bytes(bits: u32) -> __m256i {
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(bits as i32),
        _mm256_set_epi64x(
            0x0303_0303_0303_0303,
            0x0202_0202_0202_0202,
            0x0101_0101_0101_0101,
            0,
        ),
    );
    let select = _mm256_or_si256(spread, _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe));
    _mm256_cmpeq_epi8(select, _mm256_set1_epi64x(-1))
}

/// A `Block32` row decoded with SIMD unpacking (every 32-value format).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn decode_block32_simd(format: QuantFormat, raw: &[u8], row: Block32Row<'_>) {
    if format == QuantFormat::Mxfp4 {
        // Its table lookup vectorises as it is.
        return super::formats::decode_block32(format, raw, row);
    }
    let bytes = format.block_bytes();
    let blocks = raw.len() / bytes;
    assert!(row.q.len() >= blocks * 32 && row.scale.len() >= blocks && row.offset.len() >= blocks);
    let q = row.q.as_mut_ptr();
    for b in 0..blocks {
        let block = &raw[b * bytes..(b + 1) * bytes];
        let d = f16_at(block, 0);
        let (values, offset) = match format {
            QuantFormat::Q4_0 => (nibbles(block.as_ptr().add(2)), -8.0 * d),
            QuantFormat::Q4_1 => (nibbles(block.as_ptr().add(4)), f16_at(block, 2)),
            QuantFormat::Q5_0 => {
                let high = u32::from_le_bytes([block[2], block[3], block[4], block[5]]);
                let fifth = _mm256_and_si256(bits_to_bytes(high), _mm256_set1_epi8(0x10));
                (
                    _mm256_or_si256(nibbles(block.as_ptr().add(6)), fifth),
                    -16.0 * d,
                )
            }
            _ => (
                _mm256_loadu_si256(block.as_ptr().add(2) as *const __m256i),
                0.0,
            ),
        };
        _mm256_storeu_si256(q.add(b * 32) as *mut __m256i, values);
        *row.scale.get_unchecked_mut(b) = d;
        *row.offset.get_unchecked_mut(b) = offset;
    }
}

/// The decoders compiled for AVX2, so their unpacking loops vectorise.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn decode_avx2(format: QuantFormat, raw: &[u8], row: DecodedRow<'_>) {
    match row {
        DecodedRow::Block32(row) => decode_block32_simd(format, raw, row),
        row => decode(format, raw, row),
    }
}

/// The decoders compiled for AVX-512.
///
/// # Safety
/// The CPU must have AVX-512 F/BW/VL/DQ.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
pub unsafe fn decode_avx512(format: QuantFormat, raw: &[u8], row: DecodedRow<'_>) {
    match row {
        DecodedRow::Block32(row) => decode_block32_simd(format, raw, row),
        row => decode(format, raw, row),
    }
}
