//! Criterion micro-bench of the block manager's hot operations: block allocate + free, a
//! sequence's admission and release, fork of a long sequence (sharing every block), and a
//! prefix-cache admission that hits a cached 512-token prompt. No model, no tensors.

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use kvcache::{BlockManager, BlockPool, ManagerConfig, SeqId};

const BLOCK_SIZE: usize = 16;

fn manager(num_blocks: usize) -> BlockManager {
    BlockManager::new(ManagerConfig {
        num_blocks,
        block_size: BLOCK_SIZE,
        prefix_caching: true,
        watermark: 0.0,
        window: None,
    })
}

fn block_manager(c: &mut Criterion) {
    let mut group = c.benchmark_group("kvcache");

    group.throughput(Throughput::Elements(1024));
    group.bench_function("pool_allocate_free_1024_blocks", |b| {
        let mut pool = BlockPool::new(4096, BLOCK_SIZE);
        let mut held = Vec::with_capacity(1024);
        b.iter(|| {
            for _ in 0..1024 {
                held.push(pool.allocate().expect("pool sized for the bench"));
            }
            for block in held.drain(..) {
                pool.release(block);
            }
        });
    });

    let prompt: Vec<u32> = (0..512).map(|i| (i * 7919) % 49_152).collect();
    group.throughput(Throughput::Elements(1));
    group.bench_function("admit_commit_release_512_tokens", |b| {
        let mut m = manager(4096);
        let mut id = 0;
        b.iter(|| {
            id += 1;
            // Distinct first token so every admission misses and computes 32 block hashes.
            let mut tokens = prompt.clone();
            tokens[0] = id;
            let seq = SeqId(u64::from(id));
            m.admit(seq, &tokens, tokens.len(), None)
                .expect("new id")
                .expect("room");
            m.commit(seq, &tokens).expect("fits");
            m.release(seq).expect("live");
        });
    });

    group.bench_function("prefix_hit_admit_release_512_tokens", |b| {
        let mut m = manager(4096);
        m.admit(SeqId(0), &prompt, prompt.len(), None)
            .expect("new")
            .expect("room");
        m.commit(SeqId(0), &prompt).expect("fits");
        m.release(SeqId(0)).expect("live");
        let mut id = 0;
        b.iter(|| {
            id += 1;
            let seq = SeqId(id);
            let hit = m
                .admit(seq, &prompt, prompt.len(), None)
                .expect("new")
                .expect("room");
            assert_eq!(hit, 496);
            m.release(seq).expect("live");
        });
    });

    group.bench_function("fork_and_release_512_tokens", |b| {
        let mut m = manager(4096);
        m.admit(SeqId(0), &prompt, prompt.len(), None)
            .expect("new")
            .expect("room");
        m.commit(SeqId(0), &prompt).expect("fits");
        let mut id = 0;
        b.iter_batched(
            || {
                id += 1;
                SeqId(id)
            },
            |child| {
                m.fork(SeqId(0), child).expect("live parent");
                m.release(child).expect("live child");
            },
            BatchSize::SmallInput,
        );
    });

    group.bench_function("decode_step_ensure_commit", |b| {
        // One decode step's bookkeeping for one sequence: room for one more token, commit.
        let mut m = manager(1 << 16);
        let mut tokens: Vec<u32> = prompt.clone();
        m.admit(SeqId(0), &tokens, tokens.len(), None)
            .expect("new")
            .expect("room");
        m.commit(SeqId(0), &tokens).expect("fits");
        b.iter(|| {
            if tokens.len() >= 60_000 {
                m.truncate(SeqId(0), 512).expect("live");
                tokens.truncate(512);
            }
            let moves = m.ensure_capacity(SeqId(0), tokens.len() + 1).expect("live");
            assert!(moves.is_some_and(|m| m.is_empty()));
            tokens.push(tokens.len() as u32);
            m.commit(SeqId(0), &tokens).expect("fits");
        });
    });
    group.finish();
}

criterion_group!(benches, block_manager);
criterion_main!(benches);
