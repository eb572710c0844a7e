//! The AVX2 kernel for the 32-value formats (Q4_0, Q4_1, Q5_0, Q8_0, MXFP4), reading weights in the
//! `tiles16` layout: the first 32 bytes of each 64-byte "dword j of every row" chunk are
//! rows 0..8 and the last 32 bytes rows 8..16, so a tile is multiplied as two halves of eight
//! weight rows, each block of a half loaded as 256-bit chunks of "4 values of each row" (one
//! row per 32-bit lane; nibbles split, fifth bits merged) and unpacked once in registers for
//! up to four activation rows. An activation row meets a chunk with `maddubs` against its
//! broadcast 4 values; the 16-bit pair sums of a block's chunks are added as 16-bit integers
//! (exact: 4-bit values fill eight chunks, 5-bit values four, below 2^15) and widened once.
//! Q8_0's signed values move their sign onto the activations first; MXFP4's codes are looked
//! up as their doubled values plus 12 (0 to 24), summed four chunks at a time like Q5_0's. Each block's scaled sum
//! and then its offset (`w = d * q + offset`) against the activations' block sum are added to
//! the row's accumulator. A row's arithmetic is the same whichever rows share its group, so
//! results are batch invariant.

use std::arch::x86_64::*;

use super::activations::QuantizedRows;
use super::avx512_block32::in_groups;
use super::formats::QuantFormat;
use super::tiles16::{self, TileBlock};

/// Weight rows per tile.
pub const COLUMNS: usize = tiles16::ROWS;

/// Weight rows per 256-bit register (one per 32-bit lane).
pub(super) const HALF: usize = 8;

/// How many tile blocks ahead the first group of rows prefetches.
const PREFETCH_BLOCKS: usize = 12;

/// Format codes for the const parameter of the kernels (each format's loop compiled apart,
/// with no branch on the format per block).
const Q4_0: u8 = 0;
const Q4_1: u8 = 1;
const Q5_0: u8 = 2;
const Q8_0: u8 = 3;
const MXFP4: u8 = 4;

/// The format of a code.
const fn format_of(code: u8) -> QuantFormat {
    match code {
        Q4_0 => QuantFormat::Q4_0,
        Q4_1 => QuantFormat::Q4_1,
        Q5_0 => QuantFormat::Q5_0,
        MXFP4 => QuantFormat::Mxfp4,
        _ => QuantFormat::Q8_0,
    }
}

/// One tile of 16 weight rows, given as its `k / 32` tile blocks (`tiles16` layout), against
/// every row `r` of `rows`: `store(r, values)` receives the row's 16 results.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C. `tile` must hold the tile's blocks for `rows.k`
/// values, and `rows` must be quantized for a 32-value format.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn tile(
    format: QuantFormat,
    tile: &[u8],
    rows: &QuantizedRows,
    store: &mut impl FnMut(usize, &[f32; COLUMNS]),
) {
    let k = rows.k;
    let m = rows.q.len() / k;
    let layout = tiles16::tile_block(format);
    assert!(tile.len() >= k / 32 * layout.bytes);
    assert!(rows.d.len() >= m * k / 32 && rows.sums.len() >= m * k / 32);
    let t = tile.as_ptr();
    match format {
        QuantFormat::Q4_0 => in_formats::<Q4_0>(t, rows, store),
        QuantFormat::Q4_1 => in_formats::<Q4_1>(t, rows, store),
        QuantFormat::Q5_0 => in_formats::<Q5_0>(t, rows, store),
        QuantFormat::Mxfp4 => in_formats::<MXFP4>(t, rows, store),
        // Q8_0, the only other 32-value format (the callers pass no other shape).
        _ => in_formats::<Q8_0>(t, rows, store),
    }
}

/// `tile` for the format of code `F`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn in_formats<const F: u8>(
    t: *const u8,
    rows: &QuantizedRows,
    store: &mut impl FnMut(usize, &[f32; COLUMNS]),
) {
    in_groups(rows.q.len() / rows.k, |first, n| match n {
        4 => in_halves::<4>(first, store, |half| {
            half_of::<4, F, 1>(t, rows, first, half)[0]
        }),
        3 => in_halves::<3>(first, store, |half| {
            half_of::<3, F, 1>(t, rows, first, half)[0]
        }),
        2 => in_halves::<2>(first, store, |half| {
            half_of::<2, F, 1>(t, rows, first, half)[0]
        }),
        _ => in_both(first, store, half_of::<1, F, 2>(t, rows, first, 0)),
    });
}

/// Rows `first..first + R` of the tile: `half(h)` gives each row's results for weight rows
/// `8h..8h + 8`; each row is stored with its 16 results.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn in_halves<const R: usize>(
    first: usize,
    store: &mut impl FnMut(usize, &[f32; COLUMNS]),
    mut half: impl FnMut(usize) -> [__m256; R],
) {
    let mut out = [[0f32; COLUMNS]; R];
    for h in 0..2 {
        for (out, values) in out.iter_mut().zip(half(h)) {
            // `out[HALF * h..]` holds the eight floats.
            _mm256_storeu_ps(out.as_mut_ptr().add(HALF * h), values);
        }
    }
    for (r, out) in out.iter().enumerate() {
        store(first + r, out);
    }
}

/// One row `first` of the tile, given both halves' results at once (a row that swept the
/// tile's lines once): stored with its 16 results.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn in_both(
    first: usize,
    store: &mut impl FnMut(usize, &[f32; COLUMNS]),
    both: [[__m256; 1]; 2],
) {
    in_halves::<1>(first, store, |h| both[h]);
}

/// Asks for part `part` of `parts` of the lines of a tile block, as the one at `base` is read
/// by the rows from `first` in half `half`: the first group's first half streams the tile
/// from memory and asks for the block `ahead` blocks on (past the tile's end, the next
/// tile's); its second half finds the tile in cache and asks for the same block of the next
/// tile (`tile_bytes` on), so memory keeps streaming while the rest of the tile computes. The
/// other groups ask for nothing. A prefetch never faults.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn prefetch(
    first: usize,
    half: usize,
    base: *const u8,
    bytes: usize,
    tile_bytes: usize,
    ahead: usize,
    part: usize,
    parts: usize,
) {
    if first != 0 {
        return;
    }
    let from = if half == 0 {
        base.wrapping_add(ahead * bytes)
    } else {
        base.wrapping_add(tile_bytes)
    };
    let lines = bytes.div_ceil(64);
    for line in (part * lines).div_ceil(parts)..((part + 1) * lines).div_ceil(parts) {
        _mm_prefetch::<_MM_HINT_T0>(from.wrapping_add(64 * line) as *const i8);
    }
}

/// Rows `first..first + R` against weight rows `8 half..8 half + 8` of the tile, and for
/// `H = 2` the next eight too (a single row sweeps the tile's lines once, both halves of each
/// line together): each row's results, one weight row per lane. A block's scaled sum and then
/// its offset term go into one accumulator per row (one register per row, so that four rows,
/// eight unpacked chunks and the temporaries fit AVX2's sixteen registers). Each half's
/// arithmetic is the same for either `H`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn half_of<const R: usize, const F: u8, const H: usize>(
    tile: *const u8,
    rows: &QuantizedRows,
    first: usize,
    half: usize,
) -> [[__m256; R]; H] {
    let format = format_of(F);
    let k = rows.k;
    let blocks = k / 32;
    let layout = tiles16::tile_block(format);
    let mut acc = [[_mm256_setzero_ps(); R]; H];
    for b in 0..blocks {
        let base = tile.add(b * layout.bytes);
        let tile_bytes = blocks * layout.bytes;
        prefetch(
            first,
            half,
            base,
            layout.bytes,
            tile_bytes,
            PREFETCH_BLOCKS * H,
            0,
            1,
        );
        for (hh, acc) in acc.iter_mut().enumerate() {
            let half = half + hh;
            let d = scales::<F>(base, layout, half);
            let (chunks, signs) = unpack::<F>(base, layout, half);
            let offset = offsets::<F>(base, layout, half, d);
            for (r, acc) in acc.iter_mut().enumerate() {
                let row = first + r;
                let x = rows.q.as_ptr().add(row * k + b * 32) as *const i32;
                let p = dot::<F>(&chunks, &signs, x);
                let scale =
                    _mm256_mul_ps(d, _mm256_set1_ps(*rows.d.get_unchecked(row * blocks + b)));
                *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), scale, *acc);
                if F != Q8_0 {
                    let sum = _mm256_set1_ps(*rows.sums.get_unchecked(row * blocks + b));
                    *acc = _mm256_fmadd_ps(offset, sum, *acc);
                }
            }
        }
    }
    acc
}

/// Half `half`'s eight scales of the tile block at `base`: f16, or MXFP4's E8M0 bytes as half
/// their power of two (`formats::e8m0_half`, bit for bit).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scales<const F: u8>(base: *const u8, layout: TileBlock, half: usize) -> __m256 {
    if F == MXFP4 {
        let e = _mm256_cvtepu8_epi32(_mm_loadl_epi64(
            base.add(layout.scales + HALF * half) as *const __m128i
        ));
        let normal = _mm256_slli_epi32::<23>(_mm256_sub_epi32(e, _mm256_set1_epi32(1)));
        let small = _mm256_sllv_epi32(_mm256_set1_epi32(0x0020_0000), e);
        let tiny = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
        return _mm256_castsi256_ps(_mm256_blendv_epi8(normal, small, tiny));
    }
    _mm256_cvtph_ps(_mm_loadu_si128(
        base.add(layout.scales + 2 * HALF * half) as *const __m128i
    ))
}

/// The 4 activations at `x` (dword `i`) in every lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn broadcast(x: *const i32, i: usize) -> __m256i {
    _mm256_set1_epi32(x.add(i).read_unaligned())
}

/// One row's block sums for the eight weight rows: `sum_i chunks[i] . x[i]` per lane (for
/// Q8_0, with the signs of `signs[i]` moved onto the activations).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot<const F: u8>(chunks: &[__m256i; 8], signs: &[__m256i; 8], x: *const i32) -> __m256i {
    let ones = _mm256_set1_epi16(1);
    let pairs = |i: usize| _mm256_maddubs_epi16(chunks[i], broadcast(x, i));
    // Chunks i..i + 4's pair sums added as 16-bit integers.
    let quad = |i: usize| {
        _mm256_add_epi16(
            _mm256_add_epi16(pairs(i), pairs(i + 1)),
            _mm256_add_epi16(pairs(i + 2), pairs(i + 3)),
        )
    };
    match F {
        Q8_0 => {
            // Magnitudes times sign-moved activations (pair sums reach 2 * 128 * 127, so each
            // is widened alone).
            let mut s = [_mm256_setzero_si256(); 2];
            for (i, (w, sign)) in chunks.iter().zip(signs).enumerate() {
                let xs = _mm256_sign_epi8(broadcast(x, i), *sign);
                let p = _mm256_maddubs_epi16(*w, xs);
                s[i % 2] = _mm256_add_epi32(s[i % 2], _mm256_madd_epi16(p, ones));
            }
            _mm256_add_epi32(s[0], s[1])
        }
        Q5_0 | MXFP4 => {
            // Four 5-bit chunks' pair sums stay below 4 * 2 * 31 * 128 < 2^15, and four of
            // MXFP4's (at most 24) below 4 * 2 * 24 * 128.
            _mm256_add_epi32(
                _mm256_madd_epi16(quad(0), ones),
                _mm256_madd_epi16(quad(4), ones),
            )
        }
        _ => {
            // Eight 4-bit chunks' pair sums stay below 8 * 2 * 15 * 128 < 2^15.
            _mm256_madd_epi16(_mm256_add_epi16(quad(0), quad(4)), ones)
        }
    }
}

/// Half `half` of the tile block at `base` as eight chunks: chunk `i` holds values
/// `4i..4i + 4` of each of its eight rows (one row per 32-bit lane), as unsigned bytes
/// (nibbles split, fifth bits merged, MXFP4's codes looked up as their doubled values plus
/// 12) or, for Q8_0, as magnitudes, the signed values following as the second array (all zero
/// for the other formats).
///
/// # Safety
/// As `tile`; `base` must point at a whole tile block of `layout`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn unpack<const F: u8>(
    base: *const u8,
    layout: TileBlock,
    half: usize,
) -> ([__m256i; 8], [__m256i; 8]) {
    let load = |at: usize| _mm256_loadu_si256(base.add(at + 32 * half) as *const __m256i);
    let mut chunks = [_mm256_setzero_si256(); 8];
    let mut signs = [_mm256_setzero_si256(); 8];
    if F == Q8_0 {
        // Stored moved to unsigned by +128.
        let flip = _mm256_set1_epi8(-128);
        for (j, (chunk, sign)) in chunks.iter_mut().zip(&mut signs).enumerate() {
            *sign = _mm256_xor_si256(load(64 * j), flip);
            *chunk = _mm256_abs_epi8(*sign);
        }
        return (chunks, signs);
    }
    let nibble = _mm256_set1_epi8(0x0f);
    for j in 0..4 {
        let packed = load(64 * j);
        chunks[j] = _mm256_and_si256(packed, nibble);
        chunks[4 + j] = _mm256_and_si256(_mm256_srli_epi16::<4>(packed), nibble);
    }
    if F == Q5_0 {
        // Bit v of a row's word becomes bit 4 of the byte holding value v: four bits at a
        // time, spread to four bytes by one multiply.
        let high = load(layout.extra);
        for (i, chunk) in chunks.iter_mut().enumerate() {
            let bits = _mm256_srlv_epi32(high, _mm256_set1_epi32(4 * i as i32));
            let bits = _mm256_and_si256(bits, _mm256_set1_epi32(0x0f));
            let spread = _mm256_mullo_epi32(bits, _mm256_set1_epi32(0x0204_0810));
            let fifth = _mm256_and_si256(spread, _mm256_set1_epi32(0x1010_1010));
            *chunk = _mm256_or_si256(*chunk, fifth);
        }
    }
    if F == MXFP4 {
        let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(
            super::avx512_block32::MXFP4_BIASED.as_ptr() as *const __m128i,
        ));
        for chunk in chunks.iter_mut() {
            *chunk = _mm256_shuffle_epi8(table, *chunk);
        }
    }
    (chunks, signs)
}

/// The eight rows' block offsets (`w = d * q + offset`), given their scales `d` (none for
/// Q8_0, whose values keep their sign).
///
/// # Safety
/// As `unpack`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn offsets<const F: u8>(
    base: *const u8,
    layout: TileBlock,
    half: usize,
    d: __m256,
) -> __m256 {
    match F {
        Q4_0 => _mm256_mul_ps(d, _mm256_set1_ps(-8.0)),
        Q4_1 => _mm256_cvtph_ps(_mm_loadu_si128(
            base.add(layout.extra + 2 * HALF * half) as *const __m128i
        )),
        Q5_0 => _mm256_mul_ps(d, _mm256_set1_ps(-16.0)),
        MXFP4 => _mm256_mul_ps(d, _mm256_set1_ps(-12.0)),
        _ => _mm256_setzero_ps(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::qgemm::formats::e8m0_half;
    use crate::cpu::qgemm::kernels::Isa;

    #[test]
    fn mxfp4_scale_bytes_convert_as_ggml_converts_them() {
        if !Isa::available().contains(&Isa::Avx2) {
            eprintln!("skipped: this CPU has no AVX2, FMA and F16C");
            return;
        }
        let layout = tiles16::tile_block(QuantFormat::Mxfp4);
        for first in (0..256).step_by(COLUMNS) {
            let mut block = vec![0u8; layout.bytes];
            for c in 0..COLUMNS {
                block[layout.scales + c] = (first + c) as u8;
            }
            for half in 0..2 {
                let mut lanes = [0f32; HALF];
                // SAFETY: the CPU has AVX2 (checked above); `block` is a whole tile block.
                unsafe {
                    let d = scales::<MXFP4>(block.as_ptr(), layout, half);
                    _mm256_storeu_ps(lanes.as_mut_ptr(), d);
                }
                for (c, got) in lanes.iter().enumerate() {
                    let e = (first + HALF * half + c) as u8;
                    assert_eq!(got.to_bits(), e8m0_half(e).to_bits(), "scale byte {e}");
                }
            }
        }
    }
}
