//! The AVX-512 kernel for the 32-value formats (Q4_0, Q4_1, Q5_0, Q8_0), straight from the GGUF
//! blocks with no decode pass: for a tile of 16 weight rows, each block of all 16 rows is
//! loaded into registers as eight 512-bit chunks of "4 values of each row" (one row per 32-bit
//! lane: nibbles split, fifth bits merged, Q8_0 moved to unsigned by +128), then shared by up
//! to four activation rows, each meeting it with eight VNNI `dpbusd` against broadcast
//! activations. Lane `c` holds row `c`'s sum; the per-block offset (`w = d * q + offset`) is
//! accumulated on the side against the activations' block sums. A row's arithmetic is the
//! same whichever rows share its group, so results are batch invariant.

use std::arch::x86_64::*;

use super::activations::QuantizedRows;
use super::formats::QuantFormat;

/// Weight rows per tile.
pub const COLUMNS: usize = 16;

/// Activation rows sharing one decoded block.
const ROW_GROUP: usize = 4;

/// `out[c * m + r]` for the tile of `columns` (1..=8) weight rows starting at `tile`, each
/// `row_bytes` long, against every row of `rows`.
///
/// # Safety
/// The CPU must have AVX-512 F/BW/VL/DQ/VBMI, VNNI, AVX2, FMA and F16C. `tile` must point at
/// `columns` rows of `row_bytes` bytes of `format` blocks covering `rows.k` values, and
/// `out` must hold `COLUMNS * m` values.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi,avx512vnni,avx2,fma,f16c")]
pub unsafe fn tile(
    format: QuantFormat,
    tile: &[u8],
    row_bytes: usize,
    columns: usize,
    rows: &QuantizedRows,
    out: &mut [f32],
) {
    let k = rows.k;
    let m = rows.q.len() / k;
    assert!((1..=COLUMNS).contains(&columns) && tile.len() >= columns * row_bytes);
    assert!(out.len() >= COLUMNS * m && row_bytes == k / 32 * format.block_bytes());
    // A ragged last tile is copied after zeros (all-zero blocks: scale 0), so every column is
    // at `row_bytes` stride from the first.
    let padded;
    let tile = if columns < COLUMNS {
        let mut copy = vec![0u8; COLUMNS * row_bytes];
        copy[..columns * row_bytes].copy_from_slice(&tile[..columns * row_bytes]);
        padded = copy;
        padded.as_slice()
    } else {
        tile
    };
    let mut group = 0;
    while group < m {
        let n = (m - group).min(ROW_GROUP);
        let results = match n {
            4 => group_of::<4>(format, tile.as_ptr(), row_bytes, rows, group),
            3 => pad(group_of::<3>(format, tile.as_ptr(), row_bytes, rows, group)),
            2 => pad(group_of::<2>(format, tile.as_ptr(), row_bytes, rows, group)),
            _ => pad(group_of::<1>(format, tile.as_ptr(), row_bytes, rows, group)),
        };
        for (i, result) in results.iter().take(n).enumerate() {
            for (c, v) in result.iter().enumerate() {
                out[c * m + group + i] = *v;
            }
        }
        group += n;
    }
}

fn pad<const R: usize>(results: [[f32; COLUMNS]; R]) -> [[f32; COLUMNS]; ROW_GROUP] {
    std::array::from_fn(|i| if i < R { results[i] } else { [0.0; COLUMNS] })
}

/// Dword `j` of every column into dwords 0-7 of the result and dword `j + 1` into 8-15,
/// from two registers holding four columns each (column `i` in 128-bit lane `i`).
#[inline(always)]
unsafe fn pair_index(j: i32) -> __m512i {
    _mm512_set_epi32(
        29 + j,
        25 + j,
        21 + j,
        17 + j,
        13 + j,
        9 + j,
        5 + j,
        1 + j,
        28 + j,
        24 + j,
        20 + j,
        16 + j,
        12 + j,
        8 + j,
        4 + j,
        j,
    )
}

/// The columns of one block: column `c` at `base + c * stride`.
#[derive(Clone, Copy)]
struct Columns {
    base: *const u8,
    stride: usize,
    stride3: usize,
}

/// 16 bytes at `offset` of four columns (`first..first + 4`), one column per 128-bit lane.
#[inline(always)]
unsafe fn quad(cols: Columns, first: usize, offset: usize) -> __m512i {
    let p = cols.base.add(first * cols.stride + offset);
    let load = |at: *const u8| _mm_loadu_si128(at as *const __m128i);
    let z = _mm512_castsi128_si512(load(p));
    let z = _mm512_inserti32x4::<1>(z, load(p.add(cols.stride)));
    let z = _mm512_inserti32x4::<2>(z, load(p.add(2 * cols.stride)));
    _mm512_inserti32x4::<3>(z, load(p.add(cols.stride3)))
}

/// Dwords `j` and `j + 1` of 16 bytes at `offset` of every column: one lane per column.
#[inline(always)]
unsafe fn dwords(cols: Columns, offset: usize, j: i32) -> [__m512i; 2] {
    let index = pair_index(j);
    let low = _mm512_permutex2var_epi32(quad(cols, 0, offset), index, quad(cols, 4, offset));
    let high = _mm512_permutex2var_epi32(quad(cols, 8, offset), index, quad(cols, 12, offset));
    [
        _mm512_shuffle_i64x2::<0x44>(low, high),
        _mm512_shuffle_i64x2::<0xee>(low, high),
    ]
}

/// Rows `first..first + R` against the tile.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi,avx512vnni,avx2,fma,f16c")]
unsafe fn group_of<const R: usize>(
    format: QuantFormat,
    tile: *const u8,
    row_bytes: usize,
    rows: &QuantizedRows,
    first: usize,
) -> [[f32; COLUMNS]; R] {
    let k = rows.k;
    let blocks = k / 32;
    let bytes = format.block_bytes();
    let nibble = _mm512_set1_epi8(0x0f);
    let mut acc = [_mm512_setzero_ps(); R];
    let mut off = [_mm512_setzero_ps(); R];
    for b in 0..blocks {
        let at = Columns {
            base: tile.add(b * bytes),
            stride: row_bytes,
            stride3: 3 * row_bytes,
        };
        // Dwords 0 and 1 of each column's block: its f16 scale in the low half of dword 0.
        let [head, next] = dwords(at, 0, 0);
        let d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(head));
        // Chunk i holds values 4i..4i + 4 of every column (one column per lane).
        let mut chunks = [_mm512_setzero_si512(); 8];
        match format {
            QuantFormat::Q8_0 => {
                for half in 0..2 {
                    for j in [0, 2] {
                        let [a, b] = dwords(at, 2 + 16 * half, j as i32);
                        chunks[4 * half + j] = _mm512_xor_si512(a, _mm512_set1_epi8(-128));
                        chunks[4 * half + j + 1] = _mm512_xor_si512(b, _mm512_set1_epi8(-128));
                    }
                }
            }
            _ => {
                let start = match format {
                    QuantFormat::Q4_0 => 2,
                    QuantFormat::Q4_1 => 4,
                    _ => 6,
                };
                for j in [0, 2] {
                    for (i, packed) in dwords(at, start, j as i32).into_iter().enumerate() {
                        chunks[j + i] = _mm512_and_si512(packed, nibble);
                        chunks[4 + j + i] =
                            _mm512_and_si512(_mm512_srli_epi16::<4>(packed), nibble);
                    }
                }
                if format == QuantFormat::Q5_0 {
                    // The 32 fifth bits sit in bytes 2..6: the high half of dword 0 and the low
                    // half of dword 1. Bit v becomes bit 4 of the byte holding value v: four
                    // bits at a time, spread to four bytes by one multiply.
                    let high = _mm512_or_si512(
                        _mm512_srli_epi32::<16>(head),
                        _mm512_slli_epi32::<16>(next),
                    );
                    for (i, chunk) in chunks.iter_mut().enumerate() {
                        let bits = _mm512_srlv_epi32(high, _mm512_set1_epi32(4 * i as i32));
                        let bits = _mm512_and_si512(bits, _mm512_set1_epi32(0x0f));
                        let spread = _mm512_mullo_epi32(bits, _mm512_set1_epi32(0x0204_0810));
                        let fifth = _mm512_and_si512(spread, _mm512_set1_epi32(0x1010_1010));
                        *chunk = _mm512_or_si512(*chunk, fifth);
                    }
                }
            }
        }
        let offset = match format {
            QuantFormat::Q4_0 => _mm512_mul_ps(d, _mm512_set1_ps(-8.0)),
            QuantFormat::Q4_1 => {
                _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(head)))
            }
            QuantFormat::Q5_0 => _mm512_mul_ps(d, _mm512_set1_ps(-16.0)),
            _ => _mm512_mul_ps(d, _mm512_set1_ps(-128.0)),
        };
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
    std::array::from_fn(|r| {
        let mut lanes = [0f32; COLUMNS];
        _mm512_storeu_ps(lanes.as_mut_ptr(), _mm512_add_ps(acc[r], off[r]));
        lanes
    })
}
