//! The AVX2 kernel for the 256-value formats (Q4_K, Q6_K), reading weights in the `tiles16`
//! layout (`tiles16::super_block`) as two halves of eight weight rows, as `avx2_block32`
//! does: each sub-block of a half is loaded as 256-bit chunks of "4 values of each row" (one
//! row per 32-bit lane; nibbles split, Q6_K's two high bits merged), unpacked once in
//! registers for up to four activation rows, and met with `maddubs` against broadcast
//! activations. The 16-bit pair sums of a sub-block are added as 16-bit integers (exact:
//! eight 4-bit chunks, or two 6-bit ones, stay below 2^15) and multiplied by the rows'
//! integer sub-scales in one 16-bit multiply-add, so each super-block's sum is exact; the
//! float super-block scale, and the sub-blocks' offsets (Q4_K's minimums, Q6_K's -32)
//! against the activations' 16-value sums, are applied once per super-block, in the order
//! `avx512_super256` applies them. A row's arithmetic is the same whichever rows share its
//! group, so results are batch invariant.

use std::arch::x86_64::*;

use super::activations::QuantizedRows;
use super::avx2_block32::{broadcast, in_both, in_halves, prefetch, COLUMNS, HALF};
use super::avx512_block32::in_groups;
use super::formats::QuantFormat;
use super::tiles16;

/// How many tile super-blocks ahead the first group of rows prefetches.
const PREFETCH_BLOCKS: usize = 2;

/// One tile of 16 weight rows, given as its `k / 256` tile super-blocks, against every row `r`
/// of `rows` (in groups of up to four): `store(r, values)` receives the row's 16 results.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C. `tile` must hold the tile's super-blocks for `rows.k`
/// values, and `rows` must be quantized for a 256-value format.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn tile(
    format: QuantFormat,
    tile: &[u8],
    rows: &QuantizedRows,
    store: &mut impl FnMut(usize, &[f32; COLUMNS]),
) {
    let k = rows.k;
    let m = rows.q.len() / k;
    assert!(tile.len() >= k / 256 * tiles16::super_block(format).bytes);
    assert!(rows.d.len() >= m * k / 256 && rows.sums.len() >= m * k / 16);
    let t = tile.as_ptr();
    in_groups(m, |first, n| match (format, n) {
        (QuantFormat::Q4K, 4) => {
            in_halves::<4>(first, store, |h| q4k::<4, 1>(t, rows, first, h)[0])
        }
        (QuantFormat::Q4K, 3) => {
            in_halves::<3>(first, store, |h| q4k::<3, 1>(t, rows, first, h)[0])
        }
        (QuantFormat::Q4K, 2) => {
            in_halves::<2>(first, store, |h| q4k::<2, 1>(t, rows, first, h)[0])
        }
        (QuantFormat::Q4K, _) => in_both(first, store, q4k::<1, 2>(t, rows, first, 0)),
        (_, 4) => in_halves::<4>(first, store, |h| q6k::<4, 1>(t, rows, first, h)[0]),
        (_, 3) => in_halves::<3>(first, store, |h| q6k::<3, 1>(t, rows, first, h)[0]),
        (_, 2) => in_halves::<2>(first, store, |h| q6k::<2, 1>(t, rows, first, h)[0]),
        (_, _) => in_both(first, store, q6k::<1, 2>(t, rows, first, 0)),
    });
}

/// 32 bytes at `at` (plus half `half`'s 32-byte step).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load(at: *const u8, half: usize) -> __m256i {
    _mm256_loadu_si256(at.add(32 * half) as *const __m256i)
}

/// Eight bytes at `at` (one per row of half `half`), zero- or sign-extended to 32-bit lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bytes8(at: *const u8, half: usize, signed: bool) -> __m256i {
    let b = _mm_loadl_epi64(at.add(HALF * half) as *const __m128i);
    if signed {
        _mm256_cvtepi8_epi32(b)
    } else {
        _mm256_cvtepu8_epi32(b)
    }
}

/// `bytes8` repeated in both 16-bit halves of each lane: the multiplier `madd` takes to scale
/// a lane's two 16-bit sums by the lane's sub-scale.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scale_pairs(at: *const u8, half: usize, signed: bool) -> __m256i {
    let v = bytes8(at, half, signed);
    let low = _mm256_and_si256(v, _mm256_set1_epi32(0xffff));
    _mm256_or_si256(low, _mm256_slli_epi32::<16>(v))
}

/// The eight rows' f16 values at `at` (half `half`'s) as floats.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn halves(at: *const u8, half: usize) -> __m256 {
    _mm256_cvtph_ps(_mm_loadu_si128(at.add(2 * HALF * half) as *const __m128i))
}

/// Closes a super-block for each row `r` of a group against eight weight rows: its exact
/// integer sum `isum[r]` times the block scale `d` and the row's activation scale `dx(r)` into
/// `acc[r]`, and its offset term (`offset_scale` times the row's `t[r]`) out of `off[r]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn close_block<const R: usize>(
    acc: &mut [__m256; R],
    off: &mut [__m256; R],
    isum: &[__m256i; R],
    d: __m256,
    offset_scale: __m256,
    t: &[__m256; R],
    dx: impl Fn(usize) -> f32,
) {
    for r in 0..R {
        let scale = _mm256_mul_ps(d, _mm256_set1_ps(dx(r)));
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), scale, acc[r]);
        off[r] = _mm256_fnmadd_ps(offset_scale, t[r], off[r]);
    }
}

/// Each row's results: its scaled sums plus its offset terms, added once at the end.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn with_offsets<const R: usize, const H: usize>(
    mut acc: [[__m256; R]; H],
    off: [[__m256; R]; H],
) -> [[__m256; R]; H] {
    for (acc, off) in acc.iter_mut().zip(off) {
        for (acc, off) in acc.iter_mut().zip(off) {
            *acc = _mm256_add_ps(*acc, off);
        }
    }
    acc
}

/// Q4_K rows `first..first + R` against weight rows `8 half..8 half + 8` of the tile, and for
/// `H = 2` the next eight too (a single row sweeps the tile's lines once, both halves of each
/// line together): `w = d * sc * q - dmin * m` per 32-value sub-block. Each half's arithmetic
/// is the same for either `H`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4k<const R: usize, const H: usize>(
    tile: *const u8,
    rows: &QuantizedRows,
    first: usize,
    half: usize,
) -> [[__m256; R]; H] {
    let k = rows.k;
    let blocks = k / 256;
    let layout = tiles16::super_block(QuantFormat::Q4K);
    let nibble = _mm256_set1_epi8(0x0f);
    let mut acc = [[_mm256_setzero_ps(); R]; H];
    let mut off = [[_mm256_setzero_ps(); R]; H];
    for b in 0..blocks {
        let base = tile.add(b * layout.bytes);
        let mut isum = [[_mm256_setzero_si256(); R]; H];
        // Packed bytes 32c..32c + 32: low nibbles are sub-block 2c, high nibbles 2c + 1.
        for c in 0..4 {
            prefetch(
                first,
                half,
                base,
                layout.bytes,
                blocks * layout.bytes,
                PREFETCH_BLOCKS * H,
                c,
                4,
            );
            for (hh, isum) in isum.iter_mut().enumerate() {
                let half = half + hh;
                for nib in 0..2 {
                    let mut chunks = [_mm256_setzero_si256(); 8];
                    for (i, chunk) in chunks.iter_mut().enumerate() {
                        let packed = load(base.add(64 * (8 * c + i)), half);
                        let packed = if nib == 0 {
                            packed
                        } else {
                            _mm256_srli_epi16::<4>(packed)
                        };
                        *chunk = _mm256_and_si256(packed, nibble);
                    }
                    let sc = scale_pairs(base.add(layout.scales + 16 * (2 * c + nib)), half, false);
                    for (r, isum) in isum.iter_mut().enumerate() {
                        let x = rows
                            .q
                            .as_ptr()
                            .add((first + r) * k + b * 256 + 64 * c + 32 * nib)
                            as *const i32;
                        // Eight 4-bit chunks' pair sums stay below 8 * 2 * 15 * 128 < 2^15.
                        let mut s = _mm256_setzero_si256();
                        for (i, chunk) in chunks.iter().enumerate() {
                            s = _mm256_add_epi16(s, _mm256_maddubs_epi16(*chunk, broadcast(x, i)));
                        }
                        *isum = _mm256_add_epi32(*isum, _mm256_madd_epi16(s, sc));
                    }
                }
            }
        }
        for hh in 0..H {
            let half = half + hh;
            let d = halves(base.add(layout.d), half);
            let dmin = halves(base.add(layout.dmin), half);
            // Each row's `sum_j m_j * (its sums over sub-block j)`, the minimums converted once.
            let mut t = [_mm256_setzero_ps(); R];
            for j in 0..8 {
                let m = _mm256_cvtepi32_ps(bytes8(base.add(layout.mins + 16 * j), half, false));
                for (r, t) in t.iter_mut().enumerate() {
                    let sums = rows.sums.as_ptr().add(((first + r) * blocks + b) * 16);
                    let s = *sums.add(2 * j) + *sums.add(2 * j + 1);
                    *t = _mm256_fmadd_ps(m, _mm256_set1_ps(s), *t);
                }
            }
            let dx = |r: usize| *rows.d.get_unchecked((first + r) * blocks + b);
            close_block(&mut acc[hh], &mut off[hh], &isum[hh], d, dmin, &t, dx);
        }
    }
    with_offsets(acc, off)
}

/// Q6_K rows `first..first + R` against weight rows `8 half..8 half + 8` of the tile, and for
/// `H = 2` the next eight too (as `q4k`): `w = d * sc * (q - 32)` per 16-value sub-block, `q`
/// six bits (four from `ql`, two from `qh`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6k<const R: usize, const H: usize>(
    tile: *const u8,
    rows: &QuantizedRows,
    first: usize,
    half: usize,
) -> [[__m256; R]; H] {
    let k = rows.k;
    let blocks = k / 256;
    let layout = tiles16::super_block(QuantFormat::Q6K);
    let nibble = _mm256_set1_epi8(0x0f);
    let two_bits = _mm256_set1_epi8(0x30);
    let mut acc = [[_mm256_setzero_ps(); R]; H];
    let mut off = [[_mm256_setzero_ps(); R]; H];
    for b in 0..blocks {
        let base = tile.add(b * layout.bytes);
        let mut isum = [[_mm256_setzero_si256(); R]; H];
        // Half h of the super-block (128 values), values 4j..4j + 4 of each of its four
        // 32-value quarters for j in 4jh..4jh + 4: quarter q is then sub-block 8h + 2q + jh.
        for h in 0..2 {
            for jh in 0..2 {
                let part = 2 * h + jh;
                prefetch(
                    first,
                    half,
                    base,
                    layout.bytes,
                    blocks * layout.bytes,
                    PREFETCH_BLOCKS * H,
                    part,
                    4,
                );
                for (hh, isum) in isum.iter_mut().enumerate() {
                    q6k_part::<R>(
                        rows,
                        first,
                        base,
                        b,
                        half + hh,
                        h,
                        jh,
                        isum,
                        nibble,
                        two_bits,
                    );
                }
            }
        }
        for hh in 0..H {
            let half = half + hh;
            let d = halves(base.add(layout.d), half);
            let d32 = _mm256_mul_ps(d, _mm256_set1_ps(32.0));
            // Each row's `sum_g sc_g * (its sum over sub-block g)`, the scales converted once.
            let mut t = [_mm256_setzero_ps(); R];
            for g in 0..16 {
                let sc = _mm256_cvtepi32_ps(bytes8(base.add(layout.scales + 16 * g), half, true));
                for (r, t) in t.iter_mut().enumerate() {
                    let sums = rows.sums.as_ptr().add(((first + r) * blocks + b) * 16);
                    *t = _mm256_fmadd_ps(sc, _mm256_set1_ps(*sums.add(g)), *t);
                }
            }
            let dx = |r: usize| *rows.d.get_unchecked((first + r) * blocks + b);
            close_block(&mut acc[hh], &mut off[hh], &isum[hh], d, d32, &t, dx);
        }
    }
    with_offsets(acc, off)
}

/// One part `(h, jh)` of a Q6_K super-block (see `q6k`) of weight rows `8 half..8 half + 8`,
/// added to each row's integer sum.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn q6k_part<const R: usize>(
    rows: &QuantizedRows,
    first: usize,
    base: *const u8,
    b: usize,
    half: usize,
    h: usize,
    jh: usize,
    isum: &mut [__m256i; R],
    nibble: __m256i,
    two_bits: __m256i,
) {
    let k = rows.k;
    let layout = tiles16::super_block(QuantFormat::Q6K);
    for q in 0..4 {
        // Values 4(4jh + i)..4(4jh + i) + 4 of quarter q: low bits from `ql` bytes 0..32
        // (quarters 0, 2) or 32..64 (1, 3) of the half, low nibbles (quarters 0, 1) or high;
        // two high bits from `qh`'s bit pair q.
        let mut v = [_mm256_setzero_si256(); 4];
        for (i, v) in v.iter_mut().enumerate() {
            let j = 4 * jh + i;
            let low = load(base.add(64 * (16 * h + 8 * (q % 2) + j)), half);
            let low = if q < 2 {
                low
            } else {
                _mm256_srli_epi16::<4>(low)
            };
            let hb = load(base.add(layout.high + 64 * (8 * h + j)), half);
            let hb = match q {
                0 => _mm256_slli_epi16::<4>(hb),
                1 => _mm256_slli_epi16::<2>(hb),
                2 => hb,
                _ => _mm256_srli_epi16::<2>(hb),
            };
            *v = _mm256_or_si256(
                _mm256_and_si256(low, nibble),
                _mm256_and_si256(hb, two_bits),
            );
        }
        let sc = scale_pairs(
            base.add(layout.scales + 16 * (8 * h + 2 * q + jh)),
            half,
            true,
        );
        for (r, isum) in isum.iter_mut().enumerate() {
            let x = rows
                .q
                .as_ptr()
                .add((first + r) * k + b * 256 + 128 * h + 32 * q + 16 * jh)
                as *const i32;
            // Two 6-bit chunks' pair sums stay below 2 * 2 * 63 * 128 < 2^15.
            let s0 = _mm256_add_epi16(
                _mm256_maddubs_epi16(v[0], broadcast(x, 0)),
                _mm256_maddubs_epi16(v[1], broadcast(x, 1)),
            );
            let s1 = _mm256_add_epi16(
                _mm256_maddubs_epi16(v[2], broadcast(x, 2)),
                _mm256_maddubs_epi16(v[3], broadcast(x, 3)),
            );
            let p = _mm256_add_epi32(_mm256_madd_epi16(s0, sc), _mm256_madd_epi16(s1, sc));
            *isum = _mm256_add_epi32(*isum, p);
        }
    }
}
