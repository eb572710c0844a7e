//! Criterion micro-bench of the two attention kernels on synthetic data (no model needed):
//! one sequence, 512 or 2048 cached positions (the latter's rows take their softmax in key
//! runs), a chain of N new rows, SmolLM2's head shape; the
//! fused kernel over an f16 and an f32 store, the reference over f32. The
//! end-to-end forward-cost curve on the real model is `thicket bench forward`.

use candle_core::{Device, Tensor};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use engine::cpu::attention::{gathered_tree_attention, paged_tree_attention, HeadShape};
use engine::cpu::kv_store::KvDtype;
use engine::{LogitRows, PagedKvStore, TokenTree, TreeBatch};
use kvcache::{BlockPool, BlockTable, Slot};

fn attention(c: &mut Criterion) {
    let shape = HeadShape::plain(9, 3, 64);
    let bs = 16;
    for context in [512usize, 2048] {
        let mut group = c.benchmark_group(format!("attention_{context}_context"));
        for n in [1usize, 16, 64] {
            let mut pool = BlockPool::new((context + n).div_ceil(bs), bs);
            let mut table = BlockTable::new();
            assert!(table.ensure_capacity(context + n, &mut pool));
            let width = shape.num_kv_heads * shape.head_dim;
            let slots: Vec<Slot> = (0..pool.num_slots() as u32).map(Slot).collect();
            let fill: Vec<f32> = (0..slots.len() * width)
                .map(|i| ((i % 97) as f32 - 48.0) / 97.0)
                .collect();
            let store = |dtype| {
                let heads = (shape.num_kv_heads, shape.head_dim);
                let mut store = PagedKvStore::new(1, pool.num_slots(), heads, dtype);
                store.write(0, &slots, &fill, &fill).expect("fill store");
                store
            };
            let (halves, singles) = (store(KvDtype::F16), store(KvDtype::F32));
            let mut batch = TreeBatch::new(bs);
            let tokens: Vec<u32> = (0..n as u32).collect();
            batch
                .push(context, &table, &TokenTree::chain(&tokens), LogitRows::All)
                .expect("batch");
            let q: Vec<f32> = (0..shape.num_heads * n * shape.head_dim)
                .map(|i| ((i % 13) as f32) / 13.0)
                .collect();
            let q_tensor = Tensor::from_vec(
                q.clone(),
                (1, shape.num_heads, n, shape.head_dim),
                &Device::Cpu,
            )
            .expect("q");
            group.bench_with_input(BenchmarkId::new("fused f16", n), &n, |b, _| {
                b.iter(|| paged_tree_attention(&q, halves.layer(0), &batch, shape))
            });
            group.bench_with_input(BenchmarkId::new("fused f32", n), &n, |b, _| {
                b.iter(|| paged_tree_attention(&q, singles.layer(0), &batch, shape))
            });
            group.bench_with_input(BenchmarkId::new("reference", n), &n, |b, _| {
                b.iter(|| {
                    gathered_tree_attention(
                        &q_tensor,
                        singles.layer(0),
                        &batch,
                        shape,
                        &Device::Cpu,
                    )
                    .expect("attention")
                })
            });
        }
        group.finish();
    }
}

criterion_group!(benches, attention);
criterion_main!(benches);
