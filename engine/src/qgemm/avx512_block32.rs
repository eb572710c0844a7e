//! The AVX-512 kernel for the 32-value formats (Q4_0, Q4_1, Q5_0, Q8_0), straight from the GGUF
//! blocks with no decode pass: for a tile of 8 weight rows, each block of all 8 rows is
//! gathered into registers as four 512-bit chunks of "8 values of each row" (nibbles split,
//! fifth bits merged, Q8_0 moved to unsigned by +128), then shared by up to four activation
//! rows, each meeting it with four VNNI `dpbusd` against broadcast activations. Lane pair
//! `2c, 2c + 1` holds row `c`'s partial sums; the per-block offset (`w = d * q + offset`) is
//! accumulated on the side against the activations' block sums. A row's arithmetic is the
//! same whichever rows share its group, so results are batch invariant.

use std::arch::x86_64::*;

use super::activations::QuantizedRows;
use super::formats::QuantFormat;

/// Weight rows per tile.
pub const COLUMNS: usize = 8;

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
    // Rows past `columns` re-read row 0 (in bounds); their results are dropped.
    let offsets: [usize; COLUMNS] =
        std::array::from_fn(|c| if c < columns { c * row_bytes } else { 0 });
    let mut group = 0;
    while group < m {
        let n = (m - group).min(ROW_GROUP);
        let results = match n {
            4 => group_of::<4>(format, tile.as_ptr(), &offsets, rows, group),
            3 => pad(group_of::<3>(format, tile.as_ptr(), &offsets, rows, group)),
            2 => pad(group_of::<2>(format, tile.as_ptr(), &offsets, rows, group)),
            _ => pad(group_of::<1>(format, tile.as_ptr(), &offsets, rows, group)),
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

/// Rows `first..first + R` against the tile.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi,avx512vnni,avx2,fma,f16c")]
unsafe fn group_of<const R: usize>(
    format: QuantFormat,
    tile: *const u8,
    offsets: &[usize; COLUMNS],
    rows: &QuantizedRows,
    first: usize,
) -> [[f32; COLUMNS]; R] {
    let k = rows.k;
    let blocks = k / 32;
    let bytes = format.block_bytes();
    let nibble = _mm512_set1_epi8(0x0f);
    // [d0, d0, d1, d1, ...]: each row's block scale for its two lanes.
    let pairs = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
    // Byte 8j + c of the fifth-bit word gathers byte j of row c's 32 bits.
    let fifth_bytes = _mm256_set_epi8(
        31, 27, 23, 19, 15, 11, 7, 3, 30, 26, 22, 18, 14, 10, 6, 2, 29, 25, 21, 17, 13, 9, 5, 1,
        28, 24, 20, 16, 12, 8, 4, 0,
    );
    let even = _mm512_set_epi64(14, 12, 10, 8, 6, 4, 2, 0);
    let odd = _mm512_set_epi64(15, 13, 11, 9, 7, 5, 3, 1);
    let mut acc = [_mm512_setzero_ps(); R];
    let mut off = [_mm256_setzero_ps(); R];
    for b in 0..blocks {
        let at = |c: usize| tile.add(offsets[c] + b * bytes);
        let word = |c: usize, i: usize| (at(c).add(i) as *const i32).read_unaligned();
        let head = _mm256_set_epi32(
            word(7, 0),
            word(6, 0),
            word(5, 0),
            word(4, 0),
            word(3, 0),
            word(2, 0),
            word(1, 0),
            word(0, 0),
        );
        let d = _mm256_cvtph_ps(_mm256_cvtepi32_epi16(head));
        let chunks: [__m512i; 4] = match format {
            QuantFormat::Q8_0 => {
                // Rows in pairs, [row a: 4 qwords | row b: 4 qwords], then transposed to
                // chunk j = qword j of every row.
                let pair = |c: usize| {
                    let a = _mm256_loadu_si256(at(c).add(2) as *const __m256i);
                    let b = _mm256_loadu_si256(at(c + 1).add(2) as *const __m256i);
                    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(a), b)
                };
                let (p01, p23, p45, p67) = (pair(0), pair(2), pair(4), pair(6));
                let first = _mm512_set_epi64(13, 9, 5, 1, 12, 8, 4, 0);
                let second = _mm512_set_epi64(15, 11, 7, 3, 14, 10, 6, 2);
                let t0 = _mm512_permutex2var_epi64(p01, first, p23);
                let t1 = _mm512_permutex2var_epi64(p01, second, p23);
                let u0 = _mm512_permutex2var_epi64(p45, first, p67);
                let u1 = _mm512_permutex2var_epi64(p45, second, p67);
                let low = _mm512_set_epi64(11, 10, 9, 8, 3, 2, 1, 0);
                let high = _mm512_set_epi64(15, 14, 13, 12, 7, 6, 5, 4);
                [
                    _mm512_permutex2var_epi64(t0, low, u0),
                    _mm512_permutex2var_epi64(t0, high, u0),
                    _mm512_permutex2var_epi64(t1, low, u1),
                    _mm512_permutex2var_epi64(t1, high, u1),
                ]
                .map(|signed| _mm512_xor_si512(signed, _mm512_set1_epi8(-128)))
            }
            _ => {
                let start = match format {
                    QuantFormat::Q4_0 => 2,
                    QuantFormat::Q4_1 => 4,
                    _ => 6,
                };
                // Four rows' 16 nibble bytes per register, then qword 0 (values 0-7 and
                // 16-23) and qword 1 (8-15, 24-31) of every row.
                let quad = |c: usize| {
                    let q = |i: usize| _mm_loadu_si128(at(c + i).add(start) as *const __m128i);
                    let low = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(q(0)), q(1));
                    let high = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(q(2)), q(3));
                    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(low), high)
                };
                let (q0123, q4567) = (quad(0), quad(4));
                let low = _mm512_permutex2var_epi64(q0123, even, q4567);
                let high = _mm512_permutex2var_epi64(q0123, odd, q4567);
                let mut chunks = [
                    _mm512_and_si512(low, nibble),
                    _mm512_and_si512(high, nibble),
                    _mm512_and_si512(_mm512_srli_epi16::<4>(low), nibble),
                    _mm512_and_si512(_mm512_srli_epi16::<4>(high), nibble),
                ];
                if format == QuantFormat::Q5_0 {
                    let bits = _mm256_set_epi32(
                        word(7, 2),
                        word(6, 2),
                        word(5, 2),
                        word(4, 2),
                        word(3, 2),
                        word(2, 2),
                        word(1, 2),
                        word(0, 2),
                    );
                    let bits = _mm256_permutexvar_epi8(fifth_bytes, bits);
                    let words = [
                        _mm256_extract_epi64::<0>(bits),
                        _mm256_extract_epi64::<1>(bits),
                        _mm256_extract_epi64::<2>(bits),
                        _mm256_extract_epi64::<3>(bits),
                    ];
                    for (chunk, word) in chunks.iter_mut().zip(words) {
                        let fifth = _mm512_maskz_set1_epi8(word as u64, 0x10);
                        *chunk = _mm512_or_si512(*chunk, fifth);
                    }
                }
                chunks
            }
        };
        let offset = match format {
            QuantFormat::Q4_0 => _mm256_mul_ps(d, _mm256_set1_ps(-8.0)),
            QuantFormat::Q4_1 => {
                _mm256_cvtph_ps(_mm256_cvtepi32_epi16(_mm256_srli_epi32::<16>(head)))
            }
            QuantFormat::Q5_0 => _mm256_mul_ps(d, _mm256_set1_ps(-16.0)),
            _ => _mm256_mul_ps(d, _mm256_set1_ps(-128.0)),
        };
        let d = _mm512_permutexvar_ps(pairs, _mm512_castps256_ps512(d));
        for r in 0..R {
            let row = first + r;
            let x = rows.q.as_ptr().add(row * k + b * 32) as *const i64;
            let mut p = _mm512_setzero_si512();
            for (j, chunk) in chunks.iter().enumerate() {
                p = _mm512_dpbusd_epi32(p, *chunk, _mm512_set1_epi64(x.add(j).read_unaligned()));
            }
            let scale = _mm512_mul_ps(d, _mm512_set1_ps(*rows.d.get_unchecked(row * blocks + b)));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), scale, acc[r]);
            let sum = _mm256_set1_ps(*rows.sums.get_unchecked(row * blocks + b));
            off[r] = _mm256_fmadd_ps(offset, sum, off[r]);
        }
    }
    std::array::from_fn(|r| {
        let mut lanes = [0f32; 16];
        let mut offs = [0f32; COLUMNS];
        _mm512_storeu_ps(lanes.as_mut_ptr(), acc[r]);
        _mm256_storeu_ps(offs.as_mut_ptr(), off[r]);
        std::array::from_fn(|c| (lanes[2 * c] + lanes[2 * c + 1]) + offs[c])
    })
}
