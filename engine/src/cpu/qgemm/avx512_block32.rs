//! The AVX-512 kernel for the 32-value formats (Q4_0, Q4_1, Q5_0, Q8_0, MXFP4), reading weights in the
//! `tiles16` layout: for a tile of 16 weight rows, each block of all 16 rows is loaded as eight
//! 512-bit chunks of "4 values of each row" (one row per 32-bit lane; nibbles split, fifth
//! bits merged, MXFP4's codes looked up as their doubled values plus 12), then shared by up to four activation rows, each meeting it with eight VNNI
//! `dpbusd` against broadcast activations. Lane `c` holds row `c`'s sum; the per-block offset
//! (`w = d * q + offset`) is accumulated on the side against the activations' block sums. The
//! first group of rows prefetches the blocks a few ahead: with few rows the product waits on
//! memory, not on arithmetic (measured: 4 rows went from 1.5x to 1.3x one row's forward). The
//! second group, which finds the tile in cache, asks for the next tile meanwhile, so memory
//! keeps streaming while the later groups compute (16 rows of the Q8_0 head: 1.31 -> 1.09 ms
//! on two cores of an AMD EPYC of family 26). A
//! row's arithmetic is the same whichever rows share its group, so results are batch
//! invariant.

use std::arch::x86_64::*;

use super::activations::QuantizedRows;
use super::formats::QuantFormat;
use super::tiles16::{self, TileBlock};

/// Weight rows per tile.
pub const COLUMNS: usize = tiles16::ROWS;

/// Activation rows sharing one decoded block.
pub(super) const ROW_GROUP: usize = 4;

/// How many tile blocks ahead the first group of rows prefetches.
const PREFETCH_BLOCKS: usize = 16;

/// One tile of 16 weight rows, given as its `k / 32` tile blocks (`tiles16` layout), against
/// every row `r` of `rows`: `store(r, values)` receives the row's 16 results.
///
/// # Safety
/// The CPU must have AVX-512 F/BW/VL/DQ, VNNI, AVX2, FMA and F16C. `tile` must hold the tile's
/// blocks for `rows.k` values.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub unsafe fn tile(
    format: QuantFormat,
    tile: &[u8],
    rows: &QuantizedRows,
    store: &mut impl FnMut(usize, &[f32; COLUMNS]),
) {
    let k = rows.k;
    let layout = tiles16::tile_block(format);
    assert!(tile.len() >= k / 32 * layout.bytes);
    let t = tile.as_ptr();
    // Each format's loop compiled apart: no branch on the format per block (measured on an
    // AMD EPYC of family 26, one core, a 1536 x 576 Q4_1 product of 16 rows: 57 -> 53 us).
    match format {
        QuantFormat::Q4_0 => in_formats::<Q4_0>(t, rows, store),
        QuantFormat::Q4_1 => in_formats::<Q4_1>(t, rows, store),
        QuantFormat::Q5_0 => in_formats::<Q5_0>(t, rows, store),
        QuantFormat::Mxfp4 => in_formats::<MXFP4>(t, rows, store),
        // Q8_0, the only other 32-value format (the callers pass no other shape).
        _ => in_formats::<Q8_0>(t, rows, store),
    }
}

/// Format codes for the const parameter of `group_of` (each format's kernel compiled apart,
/// with no branch on the format inside its loop).
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

/// MXFP4's doubled values plus 12 (unsigned, for `dpbusd`), by code, in each 128-bit lane.
pub(super) const MXFP4_BIASED: [i8; 16] = {
    let mut table = [0i8; 16];
    let mut i = 0;
    while i < 16 {
        table[i] = super::formats::MXFP4_VALUES[i] + 12;
        i += 1;
    }
    table
};

/// `tile` for the format of code `F`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn in_formats<const F: u8>(
    t: *const u8,
    rows: &QuantizedRows,
    store: &mut impl FnMut(usize, &[f32; COLUMNS]),
) {
    in_groups(rows.q.len() / rows.k, |group, n| match n {
        4 => group_of::<4, F>(t, rows, group, store),
        3 => group_of::<3, F>(t, rows, group, store),
        2 => group_of::<2, F>(t, rows, group, store),
        _ => group_of::<1, F>(t, rows, group, store),
    });
}

/// Runs `group(first, n)` over the `m` activation rows in groups of up to `ROW_GROUP` (`n`
/// rows from `first`).
#[inline(always)]
pub(super) fn in_groups(m: usize, mut group: impl FnMut(usize, usize)) {
    let mut first = 0;
    while first < m {
        let n = (m - first).min(ROW_GROUP);
        group(first, n);
        first += n;
    }
}

/// Rows `first..first + R` against the tile.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn group_of<const R: usize, const F: u8>(
    tile: *const u8,
    rows: &QuantizedRows,
    first: usize,
    store: &mut impl FnMut(usize, &[f32; COLUMNS]),
) {
    let format = format_of(F);
    let k = rows.k;
    let blocks = k / 32;
    let layout = tiles16::tile_block(format);
    let mut acc = [_mm512_setzero_ps(); R];
    let mut off = [_mm512_setzero_ps(); R];
    for b in 0..blocks {
        let base = tile.add(b * layout.bytes);
        if first == 0 {
            // The first group streams the tile from memory (the others find it in cache),
            // and for a few rows memory, not arithmetic, bounds the product: ask for the
            // blocks a few ahead (past the tile's end this reaches into the next tile of
            // the product, and a prefetch never faults).
            let ahead = base.wrapping_add(PREFETCH_BLOCKS * layout.bytes);
            for line in (0..layout.bytes).step_by(64) {
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line) as *const i8);
            }
        } else if first == ROW_GROUP {
            // The second group finds the tile in cache: it asks for the same block of the
            // next tile, so memory keeps streaming while the later groups compute.
            let next = base.wrapping_add(blocks * layout.bytes);
            for line in (0..layout.bytes).step_by(64) {
                _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(line) as *const i8);
            }
        }
        let d = scales(format, base, layout);
        let chunks = unpack(format, base, layout);
        let offset = offsets(format, base, layout, d);
        for r in 0..R {
            let row = first + r;
            let x = rows.q.as_ptr().add(row * k + b * 32) as *const i32;
            // Two independent chains (integer sums are exact, so the split changes nothing
            // but latency).
            let mut p = [_mm512_setzero_si512(); 2];
            for (i, chunk) in chunks.iter().enumerate() {
                let x = _mm512_set1_epi32(x.add(i).read_unaligned());
                p[i % 2] = _mm512_dpbusd_epi32(p[i % 2], *chunk, x);
            }
            let p = _mm512_add_epi32(p[0], p[1]);
            let scale = _mm512_mul_ps(d, _mm512_set1_ps(*rows.d.get_unchecked(row * blocks + b)));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), scale, acc[r]);
            let sum = _mm512_set1_ps(*rows.sums.get_unchecked(row * blocks + b));
            off[r] = _mm512_fmadd_ps(offset, sum, off[r]);
        }
    }
    finish(acc, off, first, store)
}

/// Gives each row `first + r` its 16 results: its scaled sums plus its offsets.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn finish<const R: usize>(
    acc: [__m512; R],
    off: [__m512; R],
    first: usize,
    store: &mut impl FnMut(usize, &[f32; COLUMNS]),
) {
    for r in 0..R {
        let mut lanes = [0f32; COLUMNS];
        _mm512_storeu_ps(lanes.as_mut_ptr(), _mm512_add_ps(acc[r], off[r]));
        store(first + r, &lanes);
    }
}

/// The 16 rows' scales of the tile block at `base`: f16, or MXFP4's E8M0 bytes as half
/// their power of two (`formats::e8m0_half`, bit for bit).
///
/// # Safety
/// As `tile`; `base` must point at a whole tile block of `layout`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn scales(format: QuantFormat, base: *const u8, layout: TileBlock) -> __m512 {
    if format == QuantFormat::Mxfp4 {
        let e = _mm512_cvtepu8_epi32(_mm_loadu_si128(base.add(layout.scales) as *const __m128i));
        let one = _mm512_set1_epi32(1);
        let normal = _mm512_slli_epi32::<23>(_mm512_sub_epi32(e, one));
        let small = _mm512_sllv_epi32(_mm512_set1_epi32(0x0020_0000), e);
        let tiny = _mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2));
        return _mm512_castsi512_ps(_mm512_mask_blend_epi32(tiny, normal, small));
    }
    _mm512_cvtph_ps(_mm256_loadu_si256(base.add(layout.scales) as *const __m256i))
}

/// The tile block's values as eight chunks: chunk `i` holds values `4i..4i + 4` of every row
/// (one row per 32-bit lane), as unsigned bytes (nibbles split, fifth bits merged; MXFP4's
/// codes looked up as their doubled values plus 12).
///
/// # Safety
/// As `scales`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn unpack(
    format: QuantFormat,
    base: *const u8,
    layout: TileBlock,
) -> [__m512i; 8] {
    let nibble = _mm512_set1_epi8(0x0f);
    let load = |at: *const u8| _mm512_loadu_si512(at as *const __m512i);
    let mut chunks = [_mm512_setzero_si512(); 8];
    if format == QuantFormat::Q8_0 {
        for (j, chunk) in chunks.iter_mut().enumerate() {
            *chunk = load(base.add(64 * j));
        }
        return chunks;
    }
    for j in 0..4 {
        let packed = load(base.add(64 * j));
        chunks[j] = _mm512_and_si512(packed, nibble);
        chunks[4 + j] = _mm512_and_si512(_mm512_srli_epi16::<4>(packed), nibble);
    }
    if format == QuantFormat::Q5_0 {
        // Bit v of a row's word becomes bit 4 of the byte holding value v: four bits at a
        // time, spread to four bytes by one multiply.
        let high = load(base.add(layout.extra));
        for (i, chunk) in chunks.iter_mut().enumerate() {
            let bits = _mm512_srlv_epi32(high, _mm512_set1_epi32(4 * i as i32));
            let bits = _mm512_and_si512(bits, _mm512_set1_epi32(0x0f));
            let spread = _mm512_mullo_epi32(bits, _mm512_set1_epi32(0x0204_0810));
            let fifth = _mm512_and_si512(spread, _mm512_set1_epi32(0x1010_1010));
            *chunk = _mm512_or_si512(*chunk, fifth);
        }
    }
    if format == QuantFormat::Mxfp4 {
        let table =
            _mm512_broadcast_i32x4(_mm_loadu_si128(MXFP4_BIASED.as_ptr() as *const __m128i));
        for chunk in chunks.iter_mut() {
            *chunk = _mm512_shuffle_epi8(table, *chunk);
        }
    }
    chunks
}

/// The 16 rows' block offsets (`w = d * q + offset`), given their scales `d`.
///
/// # Safety
/// As `scales`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn offsets(
    format: QuantFormat,
    base: *const u8,
    layout: TileBlock,
    d: __m512,
) -> __m512 {
    match format {
        QuantFormat::Q4_0 => _mm512_mul_ps(d, _mm512_set1_ps(-8.0)),
        QuantFormat::Q4_1 => {
            _mm512_cvtph_ps(_mm256_loadu_si256(base.add(layout.extra) as *const __m256i))
        }
        QuantFormat::Q5_0 => _mm512_mul_ps(d, _mm512_set1_ps(-16.0)),
        QuantFormat::Mxfp4 => _mm512_mul_ps(d, _mm512_set1_ps(-12.0)),
        _ => _mm512_mul_ps(d, _mm512_set1_ps(-128.0)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::qgemm::formats::e8m0_half;
    use crate::cpu::qgemm::kernels::Isa;

    #[test]
    fn mxfp4_scale_bytes_convert_as_ggml_converts_them() {
        if !Isa::available().contains(&Isa::Avx512) {
            eprintln!("skipped: this CPU has no AVX-512 VNNI");
            return;
        }
        let layout = tiles16::tile_block(QuantFormat::Mxfp4);
        for first in (0..256).step_by(COLUMNS) {
            let mut block = vec![0u8; layout.bytes];
            for c in 0..COLUMNS {
                block[layout.scales + c] = (first + c) as u8;
            }
            let mut lanes = [0f32; COLUMNS];
            // SAFETY: the CPU has AVX-512 VNNI (checked above); `block` is a whole tile block.
            unsafe {
                let d = scales(QuantFormat::Mxfp4, block.as_ptr(), layout);
                _mm512_storeu_ps(lanes.as_mut_ptr(), d);
            }
            for (c, got) in lanes.iter().enumerate() {
                let e = (first + c) as u8;
                assert_eq!(got.to_bits(), e8m0_half(e).to_bits(), "scale byte {e}");
            }
        }
    }
}
