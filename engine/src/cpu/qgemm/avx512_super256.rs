//! The AVX-512 kernel for the 256-value formats (Q4_K, Q6_K), reading weights in the `tiles16`
//! layout (`tiles16::super_block`): for a tile of 16 weight rows, each super-block of all 16
//! rows is loaded as 512-bit registers of "4 values of each row" (one row per 32-bit lane;
//! nibbles split, Q6_K's two high bits merged) and shared by up to four activation rows, each
//! meeting it with VNNI `dpbusd` against broadcast activations, as the 32-value kernel does.
//! Each sub-block's integer sum is multiplied by its integer sub-scale and the products summed
//! exactly per super-block; the float super-block scale, and the sub-blocks' offsets (Q4_K's
//! minimums, Q6_K's -32) against the activations' 16-value sums, are applied once per
//! super-block. A row's arithmetic is the same whichever rows share its group, so results are
//! batch invariant.

use std::arch::x86_64::*;

use super::activations::QuantizedRows;
use super::avx512_block32::{finish, in_groups, COLUMNS, ROW_GROUP};
use super::formats::QuantFormat;
use super::tiles16;

/// How many tile super-blocks ahead the first group of rows prefetches.
const PREFETCH_BLOCKS: usize = 2;

/// One tile of 16 weight rows, given as its `k / 256` tile super-blocks, against every row `r`
/// of `rows` (in groups of up to four): `store(r, values)` receives the row's 16 results.
///
/// # Safety
/// The CPU must have AVX-512 F/BW/VL/DQ, VNNI, AVX2, FMA and F16C. `tile` must hold the tile's
/// super-blocks for `rows.k` values, and `rows` must be quantized for a 256-value format.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
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
    in_groups(m, |group, n| match (format, n) {
        (QuantFormat::Q4K, 4) => q4k::<4>(t, rows, group, store),
        (QuantFormat::Q4K, 3) => q4k::<3>(t, rows, group, store),
        (QuantFormat::Q4K, 2) => q4k::<2>(t, rows, group, store),
        (QuantFormat::Q4K, _) => q4k::<1>(t, rows, group, store),
        (_, 4) => q6k::<4>(t, rows, group, store),
        (_, 3) => q6k::<3>(t, rows, group, store),
        (_, 2) => q6k::<2>(t, rows, group, store),
        (_, _) => q6k::<1>(t, rows, group, store),
    });
}

/// Asks for quarter `part` of a super-block for the rows from `first`, as the one at `base`
/// is read (a quarter at a time, so that the requests in flight stay few; a prefetch never
/// faults). The first group of rows streams the tile from memory and asks for the
/// super-block `PREFETCH_BLOCKS` ahead (past the tile's end, the next tile's); the second
/// finds the tile in cache and asks for the same super-block of the next tile (`tile_bytes`
/// ahead), so that memory keeps streaming while the later groups compute; the others ask
/// for nothing.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn prefetch(first: usize, base: *const u8, bytes: usize, tile_bytes: usize, part: usize) {
    let ahead = match first {
        0 => base.wrapping_add(PREFETCH_BLOCKS * bytes),
        ROW_GROUP => base.wrapping_add(tile_bytes),
        _ => return,
    };
    let lines = bytes.div_ceil(64);
    for line in (part * lines).div_ceil(4)..((part + 1) * lines).div_ceil(4) {
        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * line) as *const i8);
    }
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn load(at: *const u8) -> __m512i {
    _mm512_loadu_si512(at as *const __m512i)
}

/// Sixteen bytes at `at` (one per row), zero- or sign-extended to 32-bit lanes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn bytes16(at: *const u8, signed: bool) -> __m512i {
    let b = _mm_loadu_si128(at as *const __m128i);
    if signed {
        _mm512_cvtepi8_epi32(b)
    } else {
        _mm512_cvtepu8_epi32(b)
    }
}

/// The 16 rows' f16 values at `at` as floats.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn halves(at: *const u8) -> __m512 {
    _mm512_cvtph_ps(_mm256_loadu_si256(at as *const __m256i))
}

/// The sum of `chunks[i] . x[i]` over the chunks (two chains; integer sums are exact).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn dots<const N: usize>(chunks: &[__m512i; N], x: *const i32) -> __m512i {
    let mut p = [_mm512_setzero_si512(); 2];
    for (i, chunk) in chunks.iter().enumerate() {
        let xi = _mm512_set1_epi32(x.add(i).read_unaligned());
        p[i % 2] = _mm512_dpbusd_epi32(p[i % 2], *chunk, xi);
    }
    _mm512_add_epi32(p[0], p[1])
}

/// Q4_K rows `first..first + R` against the tile: `w = d * sc * q - dmin * m` per 32-value
/// sub-block.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn q4k<const R: usize>(
    tile: *const u8,
    rows: &QuantizedRows,
    first: usize,
    store: &mut impl FnMut(usize, &[f32; COLUMNS]),
) {
    let k = rows.k;
    let blocks = k / 256;
    let layout = tiles16::super_block(QuantFormat::Q4K);
    let nibble = _mm512_set1_epi8(0x0f);
    let mut acc = [_mm512_setzero_ps(); R];
    let mut off = [_mm512_setzero_ps(); R];
    for b in 0..blocks {
        let base = tile.add(b * layout.bytes);
        let mut isum = [_mm512_setzero_si512(); R];
        // Packed bytes 32c..32c + 32: low nibbles are sub-block 2c, high nibbles 2c + 1.
        for c in 0..4 {
            prefetch(first, base, layout.bytes, blocks * layout.bytes, c);
            let mut low = [_mm512_setzero_si512(); 8];
            let mut high = [_mm512_setzero_si512(); 8];
            for i in 0..8 {
                let packed = load(base.add(64 * (8 * c + i)));
                low[i] = _mm512_and_si512(packed, nibble);
                high[i] = _mm512_and_si512(_mm512_srli_epi16::<4>(packed), nibble);
            }
            let sc_low = bytes16(base.add(layout.scales + 16 * (2 * c)), false);
            let sc_high = bytes16(base.add(layout.scales + 16 * (2 * c + 1)), false);
            for (r, isum) in isum.iter_mut().enumerate() {
                let x = rows.q.as_ptr().add((first + r) * k + b * 256 + 64 * c) as *const i32;
                let p_low = _mm512_mullo_epi32(dots(&low, x), sc_low);
                let p_high = _mm512_mullo_epi32(dots(&high, x.add(8)), sc_high);
                *isum = _mm512_add_epi32(*isum, _mm512_add_epi32(p_low, p_high));
            }
        }
        let d = halves(base.add(layout.d));
        let dmin = halves(base.add(layout.dmin));
        // Each row's `sum_j m_j * (its sums over sub-block j)`, the minimums converted once.
        let mut t = [_mm512_setzero_ps(); R];
        for j in 0..8 {
            let m = _mm512_cvtepi32_ps(bytes16(base.add(layout.mins + 16 * j), false));
            for (r, t) in t.iter_mut().enumerate() {
                let sums = rows.sums.as_ptr().add(((first + r) * blocks + b) * 16);
                let s = *sums.add(2 * j) + *sums.add(2 * j + 1);
                *t = _mm512_fmadd_ps(m, _mm512_set1_ps(s), *t);
            }
        }
        for r in 0..R {
            let dx = *rows.d.get_unchecked((first + r) * blocks + b);
            let scale = _mm512_mul_ps(d, _mm512_set1_ps(dx));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r]), scale, acc[r]);
            off[r] = _mm512_fnmadd_ps(dmin, t[r], off[r]);
        }
    }
    finish(acc, off, first, store)
}

/// Q6_K rows `first..first + R` against the tile: `w = d * sc * (q - 32)` per 16-value
/// sub-block, `q` six bits (four from `ql`, two from `qh`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn q6k<const R: usize>(
    tile: *const u8,
    rows: &QuantizedRows,
    first: usize,
    store: &mut impl FnMut(usize, &[f32; COLUMNS]),
) {
    let k = rows.k;
    let blocks = k / 256;
    let layout = tiles16::super_block(QuantFormat::Q6K);
    let nibble = _mm512_set1_epi8(0x0f);
    let two_bits = _mm512_set1_epi8(0x30);
    let mut acc = [_mm512_setzero_ps(); R];
    let mut off = [_mm512_setzero_ps(); R];
    for b in 0..blocks {
        let base = tile.add(b * layout.bytes);
        let mut isum = [_mm512_setzero_si512(); R];
        // Half h of the super-block (128 values), values 4j..4j + 4 of each of its four
        // 32-value quarters for j in 4jh..4jh + 4: quarter q is then sub-block 8h + 2q + jh.
        for h in 0..2 {
            for jh in 0..2 {
                prefetch(first, base, layout.bytes, blocks * layout.bytes, 2 * h + jh);
                // `parts[i][q]`: values 4(4jh + i)..4(4jh + i) + 4 of quarter q.
                let parts: [[__m512i; 4]; 4] = std::array::from_fn(|i| {
                    let j = 4 * jh + i;
                    let a = load(base.add(64 * (16 * h + j)));
                    let c = load(base.add(64 * (16 * h + 8 + j)));
                    let hb = load(base.add(layout.high + 64 * (8 * h + j)));
                    let bits = |shifted: __m512i| _mm512_and_si512(shifted, two_bits);
                    [
                        _mm512_or_si512(
                            _mm512_and_si512(a, nibble),
                            bits(_mm512_slli_epi16::<4>(hb)),
                        ),
                        _mm512_or_si512(
                            _mm512_and_si512(c, nibble),
                            bits(_mm512_slli_epi16::<2>(hb)),
                        ),
                        _mm512_or_si512(
                            _mm512_and_si512(_mm512_srli_epi16::<4>(a), nibble),
                            bits(hb),
                        ),
                        _mm512_or_si512(
                            _mm512_and_si512(_mm512_srli_epi16::<4>(c), nibble),
                            bits(_mm512_srli_epi16::<2>(hb)),
                        ),
                    ]
                });
                let v: [[__m512i; 4]; 4] = std::array::from_fn(|q| parts.map(|p| p[q]));
                let sc: [__m512i; 4] = std::array::from_fn(|q| {
                    bytes16(base.add(layout.scales + 16 * (8 * h + 2 * q + jh)), true)
                });
                for (r, isum) in isum.iter_mut().enumerate() {
                    let x = rows
                        .q
                        .as_ptr()
                        .add((first + r) * k + b * 256 + 128 * h + 16 * jh)
                        as *const i32;
                    for q in 0..4 {
                        let p = _mm512_mullo_epi32(dots(&v[q], x.add(8 * q)), sc[q]);
                        *isum = _mm512_add_epi32(*isum, p);
                    }
                }
            }
        }
        let d = halves(base.add(layout.d));
        let d32 = _mm512_mul_ps(d, _mm512_set1_ps(32.0));
        // Each row's `sum_g sc_g * (its sum over sub-block g)`, the scales converted once.
        let mut t = [_mm512_setzero_ps(); R];
        for g in 0..16 {
            let sc = _mm512_cvtepi32_ps(bytes16(base.add(layout.scales + 16 * g), true));
            for (r, t) in t.iter_mut().enumerate() {
                let sums = rows.sums.as_ptr().add(((first + r) * blocks + b) * 16);
                *t = _mm512_fmadd_ps(sc, _mm512_set1_ps(*sums.add(g)), *t);
            }
        }
        for r in 0..R {
            let dx = *rows.d.get_unchecked((first + r) * blocks + b);
            let scale = _mm512_mul_ps(d, _mm512_set1_ps(dx));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r]), scale, acc[r]);
            off[r] = _mm512_fnmadd_ps(d32, t[r], off[r]);
        }
    }
    finish(acc, off, first, store)
}
