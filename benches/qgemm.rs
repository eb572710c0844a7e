//! Criterion bench of the quantized CPU matmul against candle's `QMatMul` on the linear layers
//! of a whole SmolLM2-135M-shaped model (30 layers of q, k, v, o, gate, up, down in Q4_1;
//! 75 MB, far larger than the caches, so every product streams its weights from memory as a
//! real forward does), for M = 1..128 activation rows. Set `QGEMM_BENCH_FORMAT` (q4_0, q4_1,
//! q5_0, q8_0, mxfp4, q4k, q6k) to bench another format; K formats use 768-wide inputs.
//! Candle has no MXFP4: that format is measured against thicket's own Q4_0 of the same
//! shapes (about the same bytes: 17 per 32 values against 18), as `thicket_q4_0`. Set
//! `QGEMM_BENCH_ROWS` (say `1,16`) to bench only those row counts, and `THICKET_ISA` (say
//! `avx2`) to bench another instruction set's kernels.

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use engine::cpu::qgemm::formats::QuantFormat;
use engine::cpu::qgemm::QuantMatrix;

fn format() -> QuantFormat {
    let name = std::env::var("QGEMM_BENCH_FORMAT").unwrap_or_else(|_| "q4_1".into());
    QuantFormat::ALL
        .into_iter()
        .find(|f| {
            format!("{f:?}").eq_ignore_ascii_case(&name.replace('_', ""))
                || format!("{f:?}").eq_ignore_ascii_case(&name)
        })
        .expect("QGEMM_BENCH_FORMAT: one of q4_0 q4_1 q5_0 q8_0 mxfp4 q4k q6k")
}

/// The row counts to bench: `QGEMM_BENCH_ROWS`, or 1 to 128.
fn row_counts() -> Vec<usize> {
    match std::env::var("QGEMM_BENCH_ROWS") {
        Ok(list) => list
            .split(',')
            .map(|m| {
                m.trim()
                    .parse()
                    .expect("QGEMM_BENCH_ROWS: row counts, comma-separated")
            })
            .collect(),
        Err(_) => vec![1, 4, 8, 16, 32, 64, 128],
    }
}

fn layer_shapes(hidden: usize) -> Vec<(usize, usize)> {
    let (kv, ffn) = (hidden / 3, hidden * 8 / 3);
    vec![
        (hidden, hidden),
        (kv, hidden),
        (kv, hidden),
        (hidden, hidden),
        (ffn, hidden),
        (ffn, hidden),
        (hidden, ffn),
    ]
}

fn qgemm(c: &mut Criterion) {
    let format = format();
    let hidden = if format.block_values() == 256 {
        768
    } else {
        576
    };
    let mut ours = Vec::new();
    let mut theirs = Vec::new();
    let mut same_size = Vec::new();
    let mut bytes = 0;
    for layer in 0..30 {
        for (i, &(n, k)) in layer_shapes(hidden).iter().enumerate() {
            let values: Vec<f32> = (0..n * k)
                .map(|j| ((j * 7919 + layer * 31 + i) % 2003) as f32 / 1001.0 - 1.0)
                .collect();
            let w = Tensor::from_vec(values, (n, k), &Device::Cpu).expect("weights");
            let Some(dtype) = format.ggml() else {
                // MXFP4 blocks: scale bytes about 2^-6, codes from a hash.
                let blocks = n * k / 32;
                let raw: Vec<u8> = (0..blocks * 17)
                    .map(|j| match j % 17 {
                        0 => 120 + (j / 17 % 5) as u8,
                        _ => ((j * 2654435761usize + layer) >> 7) as u8,
                    })
                    .collect();
                let m = QuantMatrix::new(format, n, k, raw)
                    .expect("ours")
                    .for_isa(engine::cpu::qgemm::process_isa());
                bytes += m.bytes();
                ours.push(m);
                let q4 = QTensor::quantize(&w, GgmlDType::Q4_0).expect("quantize");
                same_size.push(
                    QuantMatrix::from_qtensor(&q4)
                        .expect("q4_0")
                        .expect("format"),
                );
                continue;
            };
            let q = QTensor::quantize(&w, dtype).expect("quantize");
            let m = QuantMatrix::from_qtensor(&q)
                .expect("ours")
                .expect("format");
            bytes += m.bytes();
            ours.push(m);
            theirs.push(QMatMul::from_qtensor(q).expect("candle"));
        }
    }
    let mut group = c.benchmark_group(format!("linears_30_layers_{format:?}"));
    group.sample_size(10);
    group.throughput(Throughput::Bytes(bytes as u64));
    for m in row_counts() {
        let xs: Vec<Vec<f32>> = [hidden, hidden * 8 / 3]
            .iter()
            .map(|&k| {
                (0..m * k)
                    .map(|j| ((j % 101) as f32 - 50.0) / 50.0)
                    .collect()
            })
            .collect();
        let input = |k: usize| if k == hidden { &xs[0] } else { &xs[1] };
        // On a pool worker, as `Model::forward` runs them.
        group.bench_with_input(BenchmarkId::new("thicket", m), &m, |b, _| {
            b.iter(|| {
                rayon::scope(|_| {
                    for w in &ours {
                        std::hint::black_box(w.matmul(input(w.cols())).expect("matmul"));
                    }
                })
            })
        });
        if !same_size.is_empty() {
            group.bench_with_input(BenchmarkId::new("thicket_q4_0", m), &m, |b, _| {
                b.iter(|| {
                    rayon::scope(|_| {
                        for w in &same_size {
                            std::hint::black_box(w.matmul(input(w.cols())).expect("matmul"));
                        }
                    })
                })
            });
            continue;
        }
        let tensors: Vec<Tensor> = xs
            .iter()
            .map(|x| Tensor::from_slice(x, (m, x.len() / m), &Device::Cpu).expect("x"))
            .collect();
        group.bench_with_input(BenchmarkId::new("candle", m), &m, |b, _| {
            b.iter(|| {
                for (w, o) in theirs.iter().zip(&ours) {
                    let x = if o.cols() == hidden {
                        &tensors[0]
                    } else {
                        &tensors[1]
                    };
                    std::hint::black_box(w.forward(x).expect("matmul"));
                }
            })
        });
    }
    group.finish();
}

criterion_group!(benches, qgemm);
criterion_main!(benches);
