//! `QuantMatrix` against candle's `QMatMul` (the reference), for every format, every
//! instruction set this CPU has, every row count 1..=128 and ragged output counts. MXFP4,
//! which candle lacks, is held to a scalar product written as ggml's (`vec_dot_mxfp4_q8_0`:
//! activations in candle's Q8_0 blocks, each block's integer sum of doubled E2M1 values times
//! its two scales).
//!
//! Stated tolerance: `|ours - candle| <= 2e-6 * sum_i |w_i x_i| + 1e-6` per output, where
//! `sum_i |w_i x_i|` (dequantized weights, f32 inputs) is the natural scale of a dot product's
//! rounding. Both sides quantize activations identically and sum integer block products
//! exactly; they differ only in the order of the float accumulation across blocks. Where
//! candle itself takes another activation quantization (its repacked AVX-512 paths use 256-
//! value activation blocks for Q8_0 when n is a multiple of 16), the comparison would measure
//! candle's choice, not ours, so the shapes here keep n ragged.

use candle_core::quantized::{QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};

use super::formats::QuantFormat;
use super::kernels::Isa;
use super::{BlockLayout, QuantMatrix};

const REL_TOL: f32 = 2e-6;

/// Deterministic pseudo-random values in about [-1, 1], with some larger outliers.
fn values(count: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2654435761).wrapping_add(1);
    (0..count)
        .map(|i| {
            s = s.wrapping_mul(1664525).wrapping_add(1013904223);
            let v = (s >> 8) as f32 / (1u32 << 23) as f32 - 1.0;
            if i % 97 == 0 {
                v * 8.0
            } else {
                v
            }
        })
        .collect()
}

struct Case {
    format: QuantFormat,
    n: usize,
    k: usize,
    ours: QuantMatrix,
    reference: Reference,
    dense: Vec<f32>,
}

/// What a case's products are held to.
enum Reference {
    Candle(QMatMul),
    /// MXFP4's blocks, multiplied by `mxfp4_reference`.
    Mxfp4(Vec<u8>),
}

/// ggml's MXFP4 quantization of `w` (`quantize_row_mxfp4_ref`): per block of 32, the power
/// of two that puts the largest value's exponent two above the top code's, and each value
/// to its nearest code; a few blocks get the two smallest scale bytes (subnormal scales).
fn mxfp4_blocks(w: &[f32]) -> Vec<u8> {
    use super::formats::{e8m0_half, MXFP4_VALUES};
    let mut out = Vec::new();
    for (b, block) in w.chunks_exact(32).enumerate() {
        let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
        let e = match b % 41 {
            5 => 0,
            6 => 1,
            _ if amax > 0.0 => (amax.log2().floor() - 2.0 + 127.0) as u8,
            _ => 0,
        };
        let d = e8m0_half(e);
        let code = |v: f32| -> u8 {
            let target = if d > 0.0 { v / d } else { 0.0 };
            (0..16u8)
                .min_by(|&a, &b| {
                    let da = (f32::from(MXFP4_VALUES[a as usize]) - target).abs();
                    let db = (f32::from(MXFP4_VALUES[b as usize]) - target).abs();
                    da.total_cmp(&db)
                })
                .unwrap_or(0)
        };
        out.push(e);
        for j in 0..16 {
            out.push(code(block[j]) | (code(block[j + 16]) << 4));
        }
    }
    out
}

/// MXFP4 blocks as floats.
fn mxfp4_dense(raw: &[u8]) -> Vec<f32> {
    use super::formats::{e8m0_half, MXFP4_VALUES};
    raw.chunks_exact(17)
        .flat_map(|block| {
            let d = e8m0_half(block[0]);
            let code = move |i: usize| (block[1 + i % 16] >> (4 * (i / 16))) & 15;
            (0..32).map(move |i| f32::from(MXFP4_VALUES[code(i) as usize]) * d)
        })
        .collect()
}

/// `x W^T` for MXFP4 blocks `raw` (`[n][k]`) as ggml's scalar `vec_dot_mxfp4_q8_0` computes
/// it, with `x` in candle's Q8_0 blocks.
fn mxfp4_reference(raw: &[u8], n: usize, k: usize, x: &[f32]) -> Vec<f32> {
    use super::formats::{e8m0_half, MXFP4_VALUES};
    let m = x.len() / k;
    let xt = Tensor::from_slice(x, (m, k), &Device::Cpu).unwrap();
    let xq = QTensor::quantize(&xt, candle_core::quantized::GgmlDType::Q8_0).unwrap();
    let xq = xq.data().unwrap();
    let blocks = k / 32;
    let mut out = vec![0f32; m * n];
    for r in 0..m {
        for c in 0..n {
            let mut sum = 0f32;
            for b in 0..blocks {
                let w = &raw[(c * blocks + b) * 17..][..17];
                let xb = &xq[(r * blocks + b) * 34..][..34];
                let dx = half::f16::from_le_bytes([xb[0], xb[1]]).to_f32();
                let dot: i32 = (0..32)
                    .map(|i| {
                        let code = (w[1 + i % 16] >> (4 * (i / 16))) & 15;
                        i32::from(MXFP4_VALUES[code as usize]) * i32::from(xb[2 + i] as i8)
                    })
                    .sum();
                sum += e8m0_half(w[0]) * dx * dot as f32;
            }
            out[r * n + c] = sum;
        }
    }
    out
}

/// A case of MXFP4 blocks `raw` (`[n][k]`).
fn mxfp4_case(n: usize, k: usize, raw: Vec<u8>) -> Case {
    Case {
        format: QuantFormat::Mxfp4,
        n,
        k,
        ours: QuantMatrix::new(QuantFormat::Mxfp4, n, k, raw.clone())
            .unwrap()
            .for_isa(super::process_isa()),
        dense: mxfp4_dense(&raw),
        reference: Reference::Mxfp4(raw),
    }
}

fn case(format: QuantFormat, n: usize, k: usize) -> Case {
    let raw_values = values(n * k, n as u32 ^ k as u32);
    let Some(dtype) = format.ggml() else {
        return mxfp4_case(n, k, mxfp4_blocks(&raw_values));
    };
    let w = Tensor::from_vec(raw_values, (n, k), &Device::Cpu).unwrap();
    let q = QTensor::quantize(&w, dtype).unwrap();
    let dense = q
        .dequantize(&Device::Cpu)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    let ours = QuantMatrix::from_qtensor(&q).unwrap().unwrap();
    Case {
        format,
        n,
        k,
        ours,
        reference: Reference::Candle(QMatMul::from_qtensor(q).unwrap()),
        dense,
    }
}

impl Case {
    fn candle(&self, x: &[f32]) -> Vec<f32> {
        let m = x.len() / self.k;
        let candle = match &self.reference {
            Reference::Candle(candle) => candle,
            Reference::Mxfp4(raw) => return mxfp4_reference(raw, self.n, self.k, x),
        };
        let x = Tensor::from_slice(x, (m, self.k), &Device::Cpu).unwrap();
        candle
            .forward(&x)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap()
    }

    /// Checks `ours` against candle for `x`, returning the largest error relative to the bound.
    /// Ours, laid out for `isa`.
    fn ours(&self, isa: Isa) -> QuantMatrix {
        self.ours.clone().for_isa(isa)
    }

    fn check(&self, ours: &QuantMatrix, isa: Isa, x: &[f32]) -> f32 {
        let m = x.len() / self.k;
        let got = ours.matmul_with(isa, x).unwrap();
        let want = self.candle(x);
        assert_eq!(got.len(), want.len());
        let mut worst = 0f32;
        for r in 0..m {
            for c in 0..self.n {
                let scale: f32 = (0..self.k)
                    .map(|i| (self.dense[c * self.k + i] * x[r * self.k + i]).abs())
                    .sum();
                let bound = REL_TOL * scale + 1e-6;
                let (a, b) = (got[r * self.n + c], want[r * self.n + c]);
                assert!(
                    (a - b).abs() <= bound,
                    "{:?} {} m={m} row {r} col {c}: ours {a}, candle {b}, bound {bound}",
                    self.format,
                    isa.name()
                );
                worst = worst.max((a - b).abs() / bound);
            }
        }
        worst
    }
}

fn shapes(format: QuantFormat) -> Vec<(usize, usize)> {
    match format.block_values() {
        // An odd block count (96 = 3 blocks) exercises the 512-bit kernels' tail.
        32 => vec![(37, 96), (6, 576)],
        _ => vec![(37, 256), (6, 768)],
    }
}

#[test]
fn agrees_with_candle_for_every_format_isa_and_row_count() {
    for format in QuantFormat::ALL {
        for (n, k) in shapes(format) {
            let case = case(format, n, k);
            let x = values(128 * k, 7);
            for isa in Isa::available() {
                let ours = case.ours(isa);
                let mut worst = 0f32;
                for m in 1..=128 {
                    worst = worst.max(case.check(&ours, isa, &x[..m * k]));
                }
                eprintln!(
                    "{format:?} [{n}, {k}] {}: worst error {worst:.3} of the bound",
                    isa.name()
                );
            }
        }
    }
}

#[test]
fn a_row_gives_the_same_bits_whatever_rows_share_the_product() {
    for format in QuantFormat::ALL {
        let (n, k) = shapes(format)[0];
        let case = case(format, n, k);
        let x = values(64 * k, 11);
        for isa in Isa::available() {
            let ours = case.ours(isa);
            let all = ours.matmul_with(isa, &x).unwrap();
            for (r, m) in [(0, 1), (6, 7), (40, 9), (32, 33), (63, 64)] {
                let some = ours
                    .matmul_with(isa, &x[(r + 1 - m) * k..(r + 1) * k])
                    .unwrap();
                assert_eq!(
                    &some[(m - 1) * n..m * n],
                    &all[r * n..(r + 1) * n],
                    "{format:?} {} row {r} alone among {m}",
                    isa.name()
                );
            }
        }
    }
}

#[test]
fn avx2_rows_give_their_own_bits_in_products_of_every_size() {
    if !Isa::available().contains(&Isa::Avx2) {
        eprintln!("skipped: this CPU has no AVX2, FMA and F16C");
        return;
    }
    for format in QuantFormat::ALL {
        for (n, k) in shapes(format) {
            let case = case(format, n, k);
            let ours = case.ours(Isa::Avx2);
            assert_eq!(ours.layout(), BlockLayout::Tiles16, "{format:?}");
            let x = values(24 * k, 13);
            let alone: Vec<Vec<f32>> = (0..24)
                .map(|r| ours.matmul_with(Isa::Avx2, &x[r * k..(r + 1) * k]).unwrap())
                .collect();
            for m in 1..=20 {
                // Windows starting at different rows: each row meets other neighbours.
                let start = m * 7 % 5;
                let got = ours
                    .matmul_with(Isa::Avx2, &x[start * k..(start + m) * k])
                    .unwrap();
                for r in 0..m {
                    let same = got[r * n..(r + 1) * n]
                        .iter()
                        .zip(&alone[start + r])
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(
                        same,
                        "{format:?} [{n}, {k}] m={m}: row {} differs from its product alone",
                        start + r
                    );
                }
            }
        }
    }
}

#[test]
fn instruction_sets_agree_within_the_tolerance() {
    for format in QuantFormat::ALL {
        let (n, k) = shapes(format)[1];
        let case = case(format, n, k);
        let x = values(9 * k, 3);
        let portable = case
            .ours(Isa::Portable)
            .matmul_with(Isa::Portable, &x)
            .unwrap();
        for isa in Isa::available() {
            let got = case.ours(isa).matmul_with(isa, &x).unwrap();
            for (i, (a, b)) in got.iter().zip(&portable).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-4 * b.abs().max(1.0),
                    "{format:?} {} output {i}: {a} vs portable {b}",
                    isa.name()
                );
            }
        }
    }
}

#[test]
fn layouts_convert_both_ways_and_guard_their_kernels() {
    for format in QuantFormat::ALL {
        let (n, k) = shapes(format)[0];
        let case = case(format, n, k);
        let gguf = case.ours.clone().for_isa(Isa::Portable);
        assert_eq!(gguf.layout(), BlockLayout::Gguf);
        let avx512 = gguf.clone().for_isa(Isa::Avx512);
        assert_eq!(avx512.layout(), BlockLayout::Tiles16, "{format:?}");
        assert_eq!(avx512.gguf(), gguf.gguf(), "{format:?}");
        assert_eq!(avx512.bytes(), gguf.bytes());
        assert!(avx512.matmul_with(Isa::Portable, &vec![0.0; k]).is_err());
        let avx2 = gguf.clone().for_isa(Isa::Avx2);
        assert_eq!(avx2.layout(), BlockLayout::Tiles16, "{format:?}");
        assert_eq!(avx2.gguf(), gguf.gguf(), "{format:?}");
    }
}

#[test]
fn every_mxfp4_scale_byte_scales_alike_in_every_kernel() {
    // Row `e` of one block has scale byte `e` (0 and 1 give subnormal scales; 254 would
    // overflow the products) and every code: the SIMD kernels' conversions of the scale
    // bytes against ggml's, in products of 1 to 9 rows.
    let (n, k) = (231, 32);
    let raw: Vec<u8> = (0..n)
        .flat_map(|e| {
            let codes = (0..16).map(move |j| (((j + e) % 16) | (((3 * j + e) % 16) << 4)) as u8);
            std::iter::once(e as u8).chain(codes)
        })
        .collect();
    let case = mxfp4_case(n, k, raw);
    let x = values(9 * k, 17);
    for isa in Isa::available() {
        let ours = case.ours(isa);
        for m in [1, 2, 5, 9] {
            case.check(&ours, isa, &x[..m * k]);
        }
    }
}

#[test]
fn rejects_malformed_shapes() {
    assert!(QuantMatrix::new(QuantFormat::Q4_0, 2, 48, vec![0; 2 * 18]).is_err());
    assert!(QuantMatrix::new(QuantFormat::Q4_0, 2, 64, vec![0; 3 * 18]).is_err());
    let m = QuantMatrix::new(QuantFormat::Q4_0, 2, 64, vec![0; 4 * 18]).unwrap();
    assert!(m.matmul(&[0.0; 65]).is_err());
    assert!(m.matmul(&[]).unwrap().is_empty());
}

#[test]
fn amx_tiles_give_the_vnni_kernels_bits_for_every_row_count() {
    if !Isa::available().contains(&Isa::Amx) {
        eprintln!("skipped: this CPU or its OS offers no AMX int8 tiles (VNNI runs instead)");
        return;
    }
    for format in QuantFormat::ALL {
        if format.block_values() != 32 {
            continue;
        }
        for (n, k) in shapes(format).into_iter().chain([(49, 576)]) {
            let case = case(format, n, k);
            let ours = case.ours(Isa::Amx);
            assert_eq!(ours.layout(), BlockLayout::Tiles16);
            let x = values(128 * k, 5);
            for m in 1..=128 {
                let amx = ours.matmul_with(Isa::Amx, &x[..m * k]).unwrap();
                let vnni = ours.matmul_with(Isa::Avx512, &x[..m * k]).unwrap();
                let same = amx
                    .iter()
                    .zip(&vnni)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{format:?} [{n}, {k}] m={m}: AMX differs from VNNI");
            }
        }
    }
}

#[test]
fn products_run_together_give_each_matrix_its_own_bits() {
    // Five matrices over the same activations (as q, k and v are), of different widths,
    // some ragged: run together (a loop of four, then one), each output equals its
    // matrix's own product.
    for format in [QuantFormat::Q4_1, QuantFormat::Q8_0, QuantFormat::Q4K] {
        let k = 256;
        let cases = [
            case(format, 72, k),
            case(format, 24, k),
            case(format, 37, k),
            case(format, 16, k),
            case(format, 9, k),
        ];
        for m in [1, 3, 9] {
            let x = values(m * k, m as u32 + 7);
            let mut acts = super::Activations::default();
            cases[0].ours.quantize(&x, &mut acts);
            let alone: Vec<Vec<f32>> = cases
                .iter()
                .map(|c| {
                    let mut out = Vec::new();
                    super::matmul_quantized_all(&acts, [(&c.ours, &mut out)]).unwrap();
                    out
                })
                .collect();
            let mut outs = vec![vec![f32::NAN; 5]; cases.len()];
            let products = cases.iter().map(|c| &c.ours).zip(outs.iter_mut());
            super::matmul_quantized_all(&acts, products).unwrap();
            for (i, (together, alone)) in outs.iter().zip(&alone).enumerate() {
                assert_eq!(
                    together.len(),
                    m * cases[i].n,
                    "{format:?} m {m} matrix {i}"
                );
                let same = together
                    .iter()
                    .zip(alone)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{format:?} m {m} matrix {i}: outputs differ");
            }
            // Activations quantized for another width are refused, not misread.
            let mut other = super::Activations::default();
            case(format, 8, 2 * k)
                .ours
                .quantize(&values(2 * k, 1), &mut other);
            let mut out = Vec::new();
            let products = [(&cases[0].ours, &mut out)];
            assert!(super::matmul_quantized_all(&other, products).is_err());
        }
    }
}

#[test]
fn every_task_of_a_product_holds_tiles() {
    let threads = rayon::current_num_threads();
    for n in [1, 16, 17, 192, 576, 1536, 49152] {
        let m = case(QuantFormat::Q8_0, n, 32).ours;
        let (tasks, per_task) = m.split();
        let tiles = n.div_ceil(super::TILE);
        assert!(tasks * per_task >= tiles, "n {n}: tiles left out");
        assert!((tasks - 1) * per_task < tiles, "n {n}: an empty task");
        assert!(
            tasks <= threads * 8,
            "n {n}: {tasks} tasks for {threads} threads"
        );
    }
}

#[test]
fn rows_written_by_a_closure_quantize_to_the_bits_of_rows_in_memory() {
    // The SwiGLU gate is quantized as the down projection's threads write it: the same bits
    // as quantizing the finished rows, serial (one row) or row-parallel (seven).
    for format in [QuantFormat::Q4_1, QuantFormat::Q8_0, QuantFormat::Q4K] {
        let k = 512;
        let c = case(format, 24, k);
        for m in [1, 7] {
            let x = values(m * k, m as u32 + 3);
            let (mut from_memory, mut written) =
                (super::Activations::default(), super::Activations::default());
            c.ours.quantize(&x, &mut from_memory);
            c.ours.quantize_rows(m, &mut written, |r, row| {
                row.copy_from_slice(&x[r * k..(r + 1) * k])
            });
            assert_eq!(written.0.q, from_memory.0.q, "{format:?} m {m}");
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&written.0.d),
                bits(&from_memory.0.d),
                "{format:?} m {m}"
            );
            assert_eq!(
                bits(&written.0.sums),
                bits(&from_memory.0.sums),
                "{format:?}"
            );
            let (mut a, mut b) = (Vec::new(), Vec::new());
            super::matmul_quantized_all(&written, [(&c.ours, &mut a)]).unwrap();
            super::matmul_quantized_all(&from_memory, [(&c.ours, &mut b)]).unwrap();
            assert_eq!(bits(&a), bits(&b), "{format:?} m {m}: products");
        }
    }
}
