//! One token through a head's matrix state, as the recurrent layers step it: the gated delta
//! rule (Gated DeltaNet) and Mamba-2's selective state space (`Rule`), and a chain of tokens
//! whose inputs are all known (a prefill chunk, a kept chain, an accepted path folded in)
//! stepped with one pass over the state per token (`Chain`).
//!
//! The state is `dk x dv` f32, row `i` for key dimension `i`, and lives in L2 for the shapes
//! that matter (64 KiB at 128 x 128): what a step costs is how often it walks it. The gated
//! delta rule needs `u = S^T k` before it can move the state, so a lone token walks it twice
//! (read `u`; then update each row and add its share of the output `S^T q`), and in a chain
//! the update of token `t` also reads `S_t^T k_{t+1}`, the next token's `u`: one walk per
//! token. The expressions and their order of summation are the same either way, so a chain
//! gives what its tokens stepped one by one give, bit for bit (tested), and a draft tree's
//! nodes (stepped one by one from their parents' states) what a chain gives. Mamba-2 needs no
//! `u`: one walk per token either way.
//!
//! For the gated delta rule, with `d = exp(g)`: `u = S^T k`, `delta = beta (v - d u)`,
//! `S <- d S + k delta^T`, `o = S^T q`. For Mamba-2 (`q` its `C`, `k` its `B`, `v` its `x`,
//! `beta` its step `dt`, `g = dt A`): `S <- d S + k (dt v)^T`, `o = S^T q + D v`.

use super::delta_rule::HeadDims;

/// Which update a head's state takes per token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Rule {
    /// The gated delta rule (`step`).
    GatedDelta,
    /// Mamba-2's selective state space (`ssd_step`), with the head's skip factor `D`.
    Ssd {
        /// The factor on the input added to the output.
        skip: f32,
    },
}

impl Rule {
    /// One token through the recurrence under this rule.
    #[allow(clippy::too_many_arguments)]
    pub fn step(
        self,
        state: &mut [f32],
        dims: HeadDims,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        beta: f32,
        g: f32,
        out: &mut [f32],
    ) {
        match self {
            Rule::GatedDelta => step(state, dims, q, k, v, beta, g, out),
            Rule::Ssd { skip } => ssd_step(state, dims, q, k, v, beta, g, skip, out),
        }
    }
}

/// Widest value head the steps keep their per-token vectors on the stack for.
const STACK_DV: usize = 256;

/// `f` with a zeroed scratch vector of `n` floats (on the stack where it fits).
fn with_scratch<R>(n: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    if n <= STACK_DV {
        let mut buf = [0f32; STACK_DV];
        f(&mut buf[..n])
    } else {
        f(&mut vec![0f32; n])
    }
}

/// `u = S^T k` (`u`: `dv`), the state only read, a block of columns at a time.
fn read(state: &[f32], dims: HeadDims, k: &[f32], u: &mut [f32]) {
    let dv = dims.dv;
    let mut start = 0;
    while start < dv {
        let w = LANES.min(dv - start);
        let mut acc = [0f32; LANES];
        for (row, &ki) in state.chunks_exact(dv).take(dims.dk).zip(k) {
            let row = &row[start..start + w];
            match <&[f32; LANES]>::try_from(row) {
                Ok(row) => {
                    for t in 0..LANES {
                        acc[t] += row[t] * ki;
                    }
                }
                Err(_) => {
                    for t in 0..w {
                        acc[t] += row[t] * ki;
                    }
                }
            }
        }
        u[start..start + w].copy_from_slice(&acc[..w]);
        start += w;
    }
}

/// One token of the gated delta rule: `state` (`dk x dv`) updated in place, the output (`dv`)
/// written to `out`.
#[allow(clippy::too_many_arguments)]
pub fn step(
    state: &mut [f32],
    dims: HeadDims,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    beta: f32,
    g: f32,
    out: &mut [f32],
) {
    with_scratch(dims.dv, |u| {
        read(state, dims, k, u);
        delta_walk(state, dims, [q, k, v], (beta, g), u, None, out);
    })
}

/// The gated delta rule's walk over the state for one token whose `u = S^T k` is in `u`:
/// the update, the output into `out` and, where the next token's key is given, its `u` into
/// `u` (read from the updated state).
fn delta_walk(
    state: &mut [f32],
    dims: HeadDims,
    [q, k, v]: [&[f32]; 3],
    (beta, g): (f32, f32),
    u: &mut [f32],
    next_k: Option<&[f32]>,
    out: &mut [f32],
) {
    let HeadDims { dk, dv } = dims;
    let decay = g.exp();
    let out = &mut out[..dv];
    // delta = beta (v - d u), kept in `u` until the next token's `u` replaces it.
    for (u, x) in u.iter_mut().zip(v) {
        *u = beta * (*x - decay * *u);
    }
    // Column blocks of `LANES` outer, rows inner: the block's `delta`, output and next `u`
    // stay in registers while the rows stream through.
    out.fill(0.0);
    let mut start = 0;
    while start < dv {
        let w = LANES.min(dv - start);
        let cols = start..start + w;
        let mut d = [0f32; LANES];
        d[..w].copy_from_slice(&u[cols.clone()]);
        let (mut o, mut n) = ([0f32; LANES], [0f32; LANES]);
        for (i, row) in state.chunks_exact_mut(dv).take(dk).enumerate() {
            let (ki, qi) = (k[i], q[i]);
            let ni = next_k.map_or(0.0, |nk| nk[i]);
            let row = &mut row[cols.clone()];
            match <&mut [f32; LANES]>::try_from(&mut *row) {
                // A whole block: fixed width, so the compiler keeps it in vector registers.
                Ok(row) => {
                    for t in 0..LANES {
                        let s = decay * row[t] + ki * d[t];
                        row[t] = s;
                        o[t] += s * qi;
                        n[t] += s * ni;
                    }
                }
                Err(_) => {
                    for t in 0..w {
                        let s = decay * row[t] + ki * d[t];
                        row[t] = s;
                        o[t] += s * qi;
                        n[t] += s * ni;
                    }
                }
            }
        }
        out[cols.clone()].copy_from_slice(&o[..w]);
        if next_k.is_some() {
            u[cols].copy_from_slice(&n[..w]);
        }
        start += w;
    }
}

/// Columns of a state block the walks keep in registers.
const LANES: usize = 16;

/// One token through Mamba-2's selective state space: `state` (`dk x dv`, `dk` the state
/// size) decays by `exp(g)` and takes `k (dt v)^T`; the output is `S^T q + skip v`.
#[allow(clippy::too_many_arguments)]
pub fn ssd_step(
    state: &mut [f32],
    dims: HeadDims,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    dt: f32,
    g: f32,
    skip: f32,
    out: &mut [f32],
) {
    let HeadDims { dk, dv } = dims;
    let decay = g.exp();
    let out = &mut out[..dv];
    let mut start = 0;
    while start < dv {
        let w = LANES.min(dv - start);
        let mut xdt = [0f32; LANES];
        for (d, x) in xdt.iter_mut().zip(&v[start..start + w]) {
            *d = x * dt;
        }
        let mut o = [0f32; LANES];
        for (row, (&ki, &qi)) in state.chunks_exact_mut(dv).take(dk).zip(k.iter().zip(q)) {
            let row = &mut row[start..start + w];
            match <&mut [f32; LANES]>::try_from(&mut *row) {
                Ok(row) => {
                    for t in 0..LANES {
                        let s = row[t] * decay + ki * xdt[t];
                        row[t] = s;
                        o[t] += s * qi;
                    }
                }
                Err(_) => {
                    for t in 0..w {
                        let s = row[t] * decay + ki * xdt[t];
                        row[t] = s;
                        o[t] += s * qi;
                    }
                }
            }
        }
        out[start..start + w].copy_from_slice(&o[..w]);
        start += w;
    }
    for (o, x) in out.iter_mut().zip(v) {
        *o += x * skip;
    }
}

/// A run of tokens through one head, each token's inputs known before the first is stepped:
/// the gated delta rule walks the state once per token (the next token's `u` read in the
/// same walk), Mamba-2 as `ssd_step`. Gives `Rule::step`'s bits token by token.
#[derive(Debug)]
pub struct Chain {
    rule: Rule,
    dims: HeadDims,
    /// The next token's `u`, where the previous walk read it.
    u: Vec<f32>,
    primed: bool,
}

impl Chain {
    /// A chain under `rule` for heads of `dims`.
    pub fn new(rule: Rule, dims: HeadDims) -> Self {
        Self {
            rule,
            dims,
            u: vec![0.0; dims.dv],
            primed: false,
        }
    }

    /// The next token (`q`, `k`, `v`, `beta`, `g`) through `state`, its output into `out`;
    /// `next_k` is the key of the token after it, where there is one.
    #[allow(clippy::too_many_arguments)]
    pub fn step(
        &mut self,
        state: &mut [f32],
        [q, k, v]: [&[f32]; 3],
        beta: f32,
        g: f32,
        next_k: Option<&[f32]>,
        out: &mut [f32],
    ) {
        match self.rule {
            Rule::Ssd { skip } => ssd_step(state, self.dims, q, k, v, beta, g, skip, out),
            Rule::GatedDelta => {
                if !self.primed {
                    read(state, self.dims, k, &mut self.u);
                }
                delta_walk(
                    state,
                    self.dims,
                    [q, k, v],
                    (beta, g),
                    &mut self.u,
                    next_k,
                    out,
                );
                self.primed = next_k.is_some();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` seeded values in [-1, 1).
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut x = seed;
        (0..n)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn a_chain_gives_its_tokens_stepped_one_by_one_bit_for_bit() {
        let dims = HeadDims { dk: 16, dv: 24 };
        let t = 23;
        let (q, k, v) = (
            values(t * dims.dk, 1),
            values(t * dims.dk, 2),
            values(t * dims.dv, 3),
        );
        let beta: Vec<f32> = values(t, 4).iter().map(|x| 0.5 + 0.4 * x).collect();
        let g: Vec<f32> = values(t, 5).iter().map(|x| -0.6 - 0.5 * x).collect();
        let start: Vec<f32> = values(dims.dk * dims.dv, 6)
            .iter()
            .map(|x| 0.3 * x)
            .collect();
        let at = |x: &[f32], i: usize, w: usize| x[i * w..(i + 1) * w].to_vec();
        for rule in [Rule::GatedDelta, Rule::Ssd { skip: 0.4 }] {
            let (mut one, mut chained) = (start.clone(), start.clone());
            let mut chain = Chain::new(rule, dims);
            let (mut a, mut b) = (vec![0f32; dims.dv], vec![0f32; dims.dv]);
            let mut moved = 0f32;
            for i in 0..t {
                let (qi, ki, vi) = (at(&q, i, dims.dk), at(&k, i, dims.dk), at(&v, i, dims.dv));
                rule.step(&mut one, dims, &qi, &ki, &vi, beta[i], g[i], &mut a);
                // The chain is told the next key except at its end and once in the middle
                // (where a caller stops knowing what comes next).
                let next = (i + 1 < t && i != 11).then(|| at(&k, i + 1, dims.dk));
                chain.step(
                    &mut chained,
                    [&qi, &ki, &vi],
                    beta[i],
                    g[i],
                    next.as_deref(),
                    &mut b,
                );
                assert_eq!(a, b, "{rule:?}, token {i}");
                moved = a.iter().fold(moved, |m, x| m.max(x.abs()));
            }
            assert_eq!(one, chained, "{rule:?}: the states");
            assert!(moved > 0.05, "outputs of {moved} say nothing");
        }
    }
}
