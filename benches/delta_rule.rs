//! Criterion bench of the gated delta rule (`engine::cpu::delta_rule`, `delta_step`), one head
//! of Qwen3.5 / Qwen3-Next's shape (keys and values of 128): a decoding token (`step`), a
//! prefill chunk of 64 tokens one by one, as a `Chain` (one walk over the state per token) and
//! in the parallel form (`chunked`), against the three-walk step the layers ran before
//! (`three_walk_step`, kept here as the baseline), and a draft tree of 16 nodes from a
//! committed state (`tree`). A layer runs this per value head (32 in
//! Qwen3.6-35B-A3B, whose 30 DeltaNet layers make 960 head-steps per decoded token).
//! `cargo bench --bench delta_rule`; numbers in benches/README.md ("The gated delta rule").

use criterion::{criterion_group, criterion_main, Criterion};
use engine::cpu::delta_rule::{chunked, step, tree, Chain, HeadDims, Inputs, Rule, TreeTokens};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const DIMS: HeadDims = HeadDims { dk: 128, dv: 128 };

/// A head's inputs for some tokens, owned.
struct Owned {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    beta: Vec<f32>,
    g: Vec<f32>,
}

/// `t` tokens of random inputs: unit keys, scaled queries, beta in (0, 1), g in [-1, 0].
fn inputs(t: usize) -> Owned {
    let mut rng = StdRng::seed_from_u64(7);
    let mut unit = |scale: f32| -> Vec<f32> {
        let mut all = Vec::new();
        for _ in 0..t {
            let x: Vec<f32> = (0..DIMS.dk).map(|_| rng.random_range(-1.0..1.0)).collect();
            let n = x.iter().map(|a| a * a).sum::<f32>().sqrt();
            all.extend(x.iter().map(|a| a / n * scale));
        }
        all
    };
    let q = unit(1.0 / (DIMS.dk as f32).sqrt());
    let k = unit(1.0);
    let mut rng = StdRng::seed_from_u64(8);
    let v = (0..t * DIMS.dv)
        .map(|_| rng.random_range(-1.0..1.0))
        .collect();
    let beta = (0..t).map(|_| rng.random_range(0.1..0.9)).collect();
    let g = (0..t).map(|_| rng.random_range(-1.0..0.0)).collect();
    Owned { q, k, v, beta, g }
}

/// The step as the layers ran it before `delta_step`: three walks over the state per token
/// (decay and read `u`, update, read the output).
#[allow(clippy::too_many_arguments)]
fn three_walk_step(
    state: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    beta: f32,
    g: f32,
    out: &mut [f32],
) {
    let (dk, dv) = (DIMS.dk, DIMS.dv);
    let decay = g.exp();
    let out = &mut out[..dv];
    out.fill(0.0);
    for (row, &ki) in state.chunks_exact_mut(dv).take(dk).zip(k) {
        for (o, s) in out.iter_mut().zip(row.iter_mut()) {
            *s *= decay;
            *o += *s * ki;
        }
    }
    for (o, x) in out.iter_mut().zip(v) {
        *o = beta * (*x - *o);
    }
    for (row, &ki) in state.chunks_exact_mut(dv).take(dk).zip(k) {
        for (s, d) in row.iter_mut().zip(out.iter()) {
            *s += ki * *d;
        }
    }
    out.fill(0.0);
    for (row, &qi) in state.chunks_exact(dv).take(dk).zip(q) {
        for (o, s) in out.iter_mut().zip(row) {
            *o += s * qi;
        }
    }
}

fn delta_rule(c: &mut Criterion) {
    let size = DIMS.dk * DIMS.dv;
    let Owned { q, k, v, beta, g } = inputs(64);
    let all = Inputs {
        q: &q,
        k: &k,
        v: &v,
        beta: &beta,
        g: &g,
    };
    let mut group = c.benchmark_group("delta_rule_128x128");
    let mut state = vec![0.01f32; size];
    let mut out = vec![0f32; 64 * DIMS.dv];
    group.bench_function("step, one token", |b| {
        b.iter(|| {
            step(
                &mut state,
                DIMS,
                &q[..128],
                &k[..128],
                &v[..128],
                beta[0],
                g[0],
                &mut out[..128],
            )
        })
    });
    group.bench_function("64 tokens one by one", |b| {
        b.iter(|| {
            for i in 0..64 {
                let (a, o) = (i * DIMS.dk, i * DIMS.dv);
                step(
                    &mut state,
                    DIMS,
                    &q[a..a + 128],
                    &k[a..a + 128],
                    &v[o..o + 128],
                    beta[i],
                    g[i],
                    &mut out[o..o + 128],
                );
            }
        })
    });
    group.bench_function("64 tokens one by one, three walks each (before)", |b| {
        b.iter(|| {
            for i in 0..64 {
                let (a, o) = (i * DIMS.dk, i * DIMS.dv);
                three_walk_step(
                    &mut state,
                    &q[a..a + 128],
                    &k[a..a + 128],
                    &v[o..o + 128],
                    beta[i],
                    g[i],
                    &mut out[o..o + 128],
                );
            }
        })
    });
    group.bench_function("64 tokens as a chain", |b| {
        b.iter(|| {
            let mut chain = Chain::new(Rule::GatedDelta, DIMS);
            for i in 0..64 {
                let (a, o) = (i * DIMS.dk, i * DIMS.dv);
                let next = (i < 63).then(|| &k[a + 128..a + 256]);
                chain.step(
                    &mut state,
                    [&q[a..a + 128], &k[a..a + 128], &v[o..o + 128]],
                    beta[i],
                    g[i],
                    next,
                    &mut out[o..o + 128],
                );
            }
        })
    });
    group.bench_function("64 tokens, one chunk", |b| {
        b.iter(|| chunked(&mut state, DIMS, &all, 64, &mut out))
    });
    // A tree of 16 nodes, depth about 4, laid out breadth first.
    let parents: Vec<Option<usize>> = (0..16).map(|i| (i > 0).then(|| (i - 1) / 3)).collect();
    let nodes = TreeTokens {
        parents: &parents,
        inputs: Inputs {
            q: &q[..16 * 128],
            k: &k[..16 * 128],
            v: &v[..16 * 128],
            beta: &beta[..16],
            g: &g[..16],
        },
        rule: Rule::GatedDelta,
    };
    let committed = vec![0.01f32; size];
    let mut stack = Vec::new();
    group.bench_function("tree of 16 nodes", |b| {
        b.iter(|| tree(&committed, DIMS, &nodes, &mut stack, &mut out[..16 * 128]))
    });
    group.finish();
}

criterion_group!(benches, delta_rule);
criterion_main!(benches);
