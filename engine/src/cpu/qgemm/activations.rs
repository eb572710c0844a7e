//! Activation rows quantized to 8 bits once per matmul, the way ggml (and candle) quantize them
//! for their integer dot products, so our products round exactly where candle's do: 32-value
//! blocks with an f16-rounded scale (Q8_0, and Q8_1's f16 block sums for Q4_1), or 256-value
//! blocks with an f32 scale and 16-value sums (Q8_K) for the K formats.

use crate::cpu::team::Disjoint;

use super::formats::{QuantFormat, Shape};

/// `m` rows of `k` activations, quantized.
#[derive(Debug, Default)]
pub struct QuantizedRows {
    /// Values per row.
    pub k: usize,
    /// `[m][k]` 8-bit values.
    pub q: Vec<i8>,
    /// Per block (`[m][k / 32]` or `[m][k / 256]`): the scale.
    pub d: Vec<f32>,
    /// `Block32`: per block, `d * sum(q)`. `Super256`: per 16 values, `d * sum(q)`.
    pub sums: Vec<f32>,
}

impl QuantizedRows {
    /// Quantizes `x` (`[m][k]`, row-major) for weights of `format`.
    pub fn quantize(format: QuantFormat, x: &[f32], k: usize) -> Self {
        let mut rows = Self::default();
        rows.fill(format, x, k);
        rows
    }

    /// Quantizes into the existing buffers.
    pub fn fill(&mut self, format: QuantFormat, x: &[f32], k: usize) {
        let m = x.len() / k;
        self.fill_with(format, k, m, |r, q, d, sums| {
            quantize_row(format, &x[r * k..(r + 1) * k], q, d, sums)
        });
    }

    /// Quantizes `m` rows of `k` values that `row(r, values)` writes, each into a buffer of
    /// the thread that quantizes it: an elementwise step before a product (SwiGLU's gate)
    /// then runs row-parallel with the quantization, in one pass.
    pub fn fill_rows(
        &mut self,
        format: QuantFormat,
        k: usize,
        m: usize,
        row: impl Fn(usize, &mut [f32]) + Sync,
    ) {
        self.fill_with(format, k, m, |r, q, d, sums| {
            ROW.with(|values| {
                let mut values = values.borrow_mut();
                values.resize(k, 0.0);
                row(r, &mut values);
                quantize_row(format, &values, q, d, sums);
            })
        });
    }

    /// Sizes the buffers for `m` rows of `k` values, then has `quantize(r, values, scales,
    /// sums)` fill row `r`'s parts, row-parallel from `PARALLEL_ROWS` rows.
    fn fill_with(
        &mut self,
        format: QuantFormat,
        k: usize,
        m: usize,
        quantize: impl Fn(usize, &mut [i8], &mut [f32], &mut [f32]) + Sync,
    ) {
        self.k = k;
        self.q.resize(m * k, 0);
        let block = format.block_values();
        self.d.resize(m * k / block, 0.0);
        self.sums.resize(
            match format.shape() {
                Shape::Block32 => m * k / 32,
                Shape::Super256 => m * k / 16,
            },
            0.0,
        );
        let per_row = (k / block, self.sums.len() / m.max(1));
        // Rows are quantized independently (the same bits whichever thread takes them).
        if m >= PARALLEL_ROWS {
            let q = Disjoint::new(&mut self.q);
            let d = Disjoint::new(&mut self.d);
            let sums = Disjoint::new(&mut self.sums);
            crate::cpu::team::for_each(m, |r| {
                // SAFETY: row `r` alone reaches its runs, which the buffers sized above hold,
                // and the buffers stay borrowed for the whole loop.
                let (q, d, sums) = unsafe {
                    (
                        q.run(r * k, k),
                        d.run(r * per_row.0, per_row.0),
                        sums.run(r * per_row.1, per_row.1),
                    )
                };
                quantize(r, q, d, sums)
            });
        } else {
            self.q
                .chunks_exact_mut(k)
                .zip(self.d.chunks_exact_mut(per_row.0))
                .zip(self.sums.chunks_exact_mut(per_row.1))
                .enumerate()
                .for_each(|(r, ((q, d), sums))| quantize(r, q, d, sums));
        }
    }

    /// Row `r`'s values.
    pub fn row_q(&self, r: usize) -> &[i8] {
        &self.q[r * self.k..(r + 1) * self.k]
    }
}

thread_local! {
    /// The row `fill_rows` is quantizing on this thread.
    static ROW: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Rows from which quantizing spreads over the thread pool.
const PARALLEL_ROWS: usize = 4;

/// One row of `k` activations into its values, block scales and sums.
fn quantize_row(format: QuantFormat, x: &[f32], q: &mut [i8], d: &mut [f32], sums: &mut [f32]) {
    match format.shape() {
        Shape::Block32 => {
            let block_sum = |scale: f32, sum: i32| {
                if format.q8_1_sums() {
                    round_to_f16(round_to_f16(sum as f32) * scale)
                } else {
                    scale * sum as f32
                }
            };
            #[cfg(target_arch = "x86_64")]
            if super::process_isa().has_avx512() {
                const CHUNK: usize = 64;
                let (mut scales, mut ints) = ([0f32; CHUNK], [0i32; CHUNK]);
                for (c, (xs, qs)) in x
                    .chunks(32 * CHUNK)
                    .zip(q.chunks_mut(32 * CHUNK))
                    .enumerate()
                {
                    // SAFETY: AVX-512 F/BW/DQ come with every CPU `has_avx512` is detected
                    // on; `qs` is as long as `xs`, a multiple of 32 values, and the buffers
                    // hold `CHUNK` blocks.
                    unsafe {
                        super::quantize_x86::quantize_blocks32(xs, qs, &mut scales, &mut ints)
                    };
                    for (b, (&scale, &sum)) in
                        scales.iter().zip(&ints).take(xs.len() / 32).enumerate()
                    {
                        let scale = round_to_f16(scale);
                        d[c * CHUNK + b] = scale;
                        sums[c * CHUNK + b] = block_sum(scale, sum);
                    }
                }
                return;
            }
            for (b, (xs, qs)) in x.chunks_exact(32).zip(q.chunks_exact_mut(32)).enumerate() {
                let (scale, sum) = quantize_q8_0(xs, qs);
                d[b] = scale;
                sums[b] = block_sum(scale, sum);
            }
        }
        Shape::Super256 => {
            for (b, (xs, qs)) in x.chunks_exact(256).zip(q.chunks_exact_mut(256)).enumerate() {
                let scale = quantize_q8_k(xs, qs);
                d[b] = scale;
                for (g, group) in qs.chunks_exact(16).enumerate() {
                    let sum: i32 = group.iter().map(|&v| v as i32).sum();
                    sums[b * 16 + g] = scale * sum as f32;
                }
            }
        }
    }
}

/// The largest magnitude among `xs`: eight running maxima combined at the end (maximum is
/// exact and order-free, so this is the sequential fold's value, in vector instructions).
#[inline(always)]
fn amax(xs: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let chunks = xs.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for l in 0..8 {
            lanes[l] = lanes[l].max(c[l].abs());
        }
    }
    let lanes = lanes.iter().fold(0f32, |a, &x| a.max(x));
    rest.iter().fold(lanes, |a, x| a.max(x.abs()))
}

/// ggml's `quantize_row_q8_0` (and `_q8_1`): scale `amax / 127` rounded to f16, values
/// `round(x / scale)` with the unrounded scale. Returns the f16-rounded scale and `sum(q)`.
fn quantize_q8_0(xs: &[f32], qs: &mut [i8]) -> (f32, i32) {
    let amax = amax(xs);
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut sum = 0i32;
    for (q, &x) in qs.iter_mut().zip(xs) {
        // |x * id| <= 127 for finite rows (the clamp only decides the degenerate cases: a
        // block of values so small that `1 / d` overflows, or NaN, which becomes 0); through
        // i32 the conversion vectorises.
        *q = round_half_away(x * id).clamp(-128.0, 127.0) as i32 as i8;
        sum += *q as i32;
    }
    (round_to_f16(d), sum)
}

/// ggml's `quantize_row_q8_K`: the scale is set by the value of largest magnitude (sign
/// included) so that it maps to -127. Returns the f32 scale.
fn quantize_q8_k(xs: &[f32], qs: &mut [i8]) -> f32 {
    let (mut amax, mut max) = (0f32, 0f32);
    for &x in xs {
        if amax < x.abs() {
            amax = x.abs();
            max = x;
        }
    }
    if amax == 0.0 {
        qs.fill(0);
        return 0.0;
    }
    let iscale = -127.0 / max;
    for (q, &x) in qs.iter_mut().zip(xs) {
        *q = round_half_away(iscale * x).clamp(-128.0, 127.0) as i32 as i8;
    }
    1.0 / iscale
}

/// `v` rounded to the nearest f16 value (ties to even), returned as f32: what
/// `half::f16::from_f32(v).to_f32()` gives, inlined (that conversion is a runtime-dispatched
/// call per value). Finite inputs only; magnitudes from 65520 up become infinity.
#[inline(always)]
fn round_to_f16(v: f32) -> f32 {
    let bits = v.to_bits();
    let sign = bits & 0x8000_0000;
    let magnitude = bits & 0x7fff_ffff;
    let abs = f32::from_bits(magnitude);
    let rounded = if abs >= 65520.0 {
        f32::INFINITY
    } else if abs < 6.103_515_6e-5 {
        // f16 subnormals are multiples of 2^-24; scaling by 2^24 is exact.
        (abs * 16_777_216.0).round_ties_even() / 16_777_216.0
    } else {
        // Keep 10 of the 23 mantissa bits, rounding the other 13 to nearest, ties to even.
        let lsb = (magnitude >> 13) & 1;
        f32::from_bits((magnitude + 0x0fff + lsb) & !0x1fff)
    };
    f32::from_bits(sign | rounded.to_bits())
}

/// `f32::round` (halves away from zero), exactly, in operations that vectorise (`round` itself
/// becomes a library call per value): `v - trunc(v)` is exact, so comparing it with one half
/// decides the rounding as `round` does.
#[inline(always)]
fn round_half_away(v: f32) -> f32 {
    let t = v.trunc();
    if (v - t).abs() >= 0.5 {
        t + 1f32.copysign(v)
    } else {
        t
    }
}

#[cfg(test)]
mod tests {
    use super::{quantize_q8_0, round_half_away, round_to_f16};
    use half::f16;

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn vector_quantization_gives_the_portable_bits() {
        if !(is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512dq"))
        {
            eprintln!("skipped: this CPU has no AVX-512 F/BW/DQ");
            return;
        }
        let mut s = 7u32;
        let mut next = || {
            s = s.wrapping_mul(1664525).wrapping_add(1013904223);
            (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        };
        // Random rows at many magnitudes, halves that round away, exact zeros, values too
        // small for `1 / d`, infinities and NaN.
        let mut blocks: Vec<Vec<f32>> = (0..4000)
            .map(|i| {
                let scale = 10f32.powi(i % 12 - 6);
                (0..32).map(|_| next() * scale).collect()
            })
            .collect();
        blocks.push((0..32).map(|i| (i as f32 - 15.5) * 127.0 / 16.0).collect());
        blocks.push((0..32).map(|i| i as f32 * 0.5 - 8.0).collect());
        blocks.push(vec![0.0; 32]);
        blocks.push(
            (0..32)
                .map(|i| f32::from_bits(i + 1) * if i % 2 == 0 { 1.0 } else { -1.0 })
                .collect(),
        );
        blocks.push(
            (0..32)
                .map(|i| if i == 3 { f32::NAN } else { i as f32 })
                .collect(),
        );
        blocks.push(
            (0..32)
                .map(|i| if i == 9 { f32::INFINITY } else { -(i as f32) })
                .collect(),
        );
        let x: Vec<f32> = blocks.concat();
        let n = blocks.len();
        let (mut q, mut scales, mut sums) = (vec![0i8; x.len()], vec![0f32; n], vec![0i32; n]);
        // SAFETY: the features were detected above; the buffers have the sizes asked for.
        unsafe {
            super::super::quantize_x86::quantize_blocks32(&x, &mut q, &mut scales, &mut sums)
        };
        for (b, xs) in x.chunks(32).enumerate() {
            let mut want = [0i8; 32];
            let (scale, sum) = quantize_q8_0(xs, &mut want);
            assert_eq!(&q[32 * b..32 * b + 32], &want, "block {b}: values");
            assert_eq!(
                round_to_f16(scales[b]).to_bits(),
                scale.to_bits(),
                "block {b}: scale"
            );
            assert_eq!(sums[b], sum, "block {b}: sum");
        }
    }

    #[test]
    fn f16_rounding_matches_half() {
        let special = [
            0.0f32,
            -0.0,
            1.0,
            65504.0,
            65519.99,
            65520.0,
            6.1035156e-5,
            6.1035e-5,
            5.96e-8,
            2.98e-8,
            2.99e-8,
            1.0009766,
            1.0004883,
            1.0014648,
            -3.25,
        ];
        let sweep = (0..2_000_000u32).map(|i| f32::from_bits(0x3000_0000 + i * 997));
        for v in special.into_iter().chain(sweep).filter(|v| v.is_finite()) {
            for v in [v, -v] {
                assert_eq!(
                    round_to_f16(v).to_bits(),
                    f16::from_f32(v).to_f32().to_bits(),
                    "{v:e}"
                );
            }
        }
    }

    #[test]
    fn rounding_matches_std_round() {
        let special = [
            0.5f32,
            -0.5,
            1.5,
            -1.5,
            2.5,
            0.49999997,
            -0.49999997,
            126.5,
            -127.5,
            0.0,
            -0.0,
        ];
        let sweep = (-300_000..300_000).map(|i| i as f32 * 0.000_431);
        for v in special.into_iter().chain(sweep) {
            assert_eq!(round_half_away(v).to_bits(), v.round().to_bits(), "{v}");
        }
    }
}
