//! The row-wise steps of the fused CPU pass (`fused_pass`), each repeating the arithmetic of
//! the candle op it replaces: RMSNorm (over the residual, or per head for
//! QK norm), the residual add, and RoPE at each row's position from either of the model's
//! tables.

use crate::model::config::{RopeStyle, Rotary};

/// Rows whose RMSNorm sums run side by side.
const NORM_ROWS: usize = 8;

/// candle's RMSNorm, row by row: `x / sqrt(mean(x^2) + eps) * alpha`. Each row's sum of
/// squares adds its values in order, as candle's does, but up to eight rows' sums advance
/// together, so their chains of dependent adds overlap instead of waiting on each other.
pub(crate) fn rms_norm(x: &[f32], alpha: &[f32], eps: f32, out: &mut [f32]) {
    let n = alpha.len();
    for (src, dst) in x.chunks(NORM_ROWS * n).zip(out.chunks_mut(NORM_ROWS * n)) {
        let mut sums = [0f32; NORM_ROWS];
        if src.len() == NORM_ROWS * n {
            for i in 0..n {
                for (r, sum) in sums.iter_mut().enumerate() {
                    let v = src[r * n + i];
                    *sum += v * v;
                }
            }
        } else {
            for (sum, row) in sums.iter_mut().zip(src.chunks_exact(n)) {
                *sum = row.iter().map(|&v| v * v).sum::<f32>();
            }
        }
        for ((src, dst), sum2) in src.chunks_exact(n).zip(dst.chunks_exact_mut(n)).zip(sums) {
            let m = (sum2 / n as f32 + eps).sqrt();
            for ((d, s), a) in dst.iter_mut().zip(src).zip(alpha) {
                *d = *s / m * *a;
            }
        }
    }
}

/// `x = y + x`, the residual add (float addition commutes, so this is candle's `y + x`).
pub(crate) fn add_into(y: &[f32], x: &mut [f32]) {
    for (x, y) in x.iter_mut().zip(y) {
        *x += *y;
    }
}

/// RoPE at each row's position, as candle's `rope` / `rope_i` compute it, on the pairs
/// `rotary` turns (every other dimension copied as it is). Rotates the `[rows][heads][dim]`
/// rows of `src` into `dst` laid out `[heads][rows][dim]` (`head_major`), or `dst`'s own rows
/// in place (`src` empty, layout kept).
pub(crate) fn rotate(
    rotary: Rotary,
    (rope_cos, rope_sin): (&[f32], &[f32]),
    positions: &[u32],
    src: &[f32],
    heads: usize,
    dst: &mut Vec<f32>,
    head_major: bool,
) {
    let d = rotary.head_dim;
    let (pairs, offset) = (rotary.pairs, rotary.offset);
    let rows = positions.len();
    if head_major {
        dst.resize(rows * heads * d, 0.0);
    }
    for (r, &pos) in positions.iter().enumerate() {
        let cos = &rope_cos[pos as usize * pairs..][..pairs];
        let sin = &rope_sin[pos as usize * pairs..][..pairs];
        for h in 0..heads {
            let from = (r * heads + h) * d;
            let to = if head_major { (h * rows + r) * d } else { from };
            let out = &mut dst[to..to + d];
            if !src.is_empty() {
                out.copy_from_slice(&src[from..from + d]);
            }
            // Each pair `(a, b)` becomes `(a cos - b sin, a sin + b cos)`, in place.
            let turn = |a: &mut f32, b: &mut f32, (cos, sin): (&f32, &f32)| {
                let (x, y) = (*a, *b);
                *a = x * cos - y * sin;
                *b = x * sin + y * cos;
            };
            let angles = cos.iter().zip(sin);
            match rotary.style {
                RopeStyle::Halves => {
                    let (lo, hi) = out.split_at_mut(offset);
                    for ((a, b), angle) in lo[..pairs].iter_mut().zip(hi.iter_mut()).zip(angles) {
                        turn(a, b, angle);
                    }
                }
                RopeStyle::Interleaved => {
                    for (two, angle) in out[..2 * pairs].chunks_exact_mut(2).zip(angles) {
                        let [a, b] = two else { continue };
                        turn(a, b, angle);
                    }
                }
            }
        }
    }
}
