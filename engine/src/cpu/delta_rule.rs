//! The gated delta rule, one head at a time: the recurrence a Gated DeltaNet layer (Qwen3.5,
//! Qwen3-Next) runs in place of attention, in its two forms. A head's state `S` is `dk x dv`
//! f32 (row `i` is key dimension `i`). For each token, with the query already scaled, the key
//! L2-normalised, `beta` in (0, 1) and the log-decay `g <= 0`:
//!
//! ```text
//!   S <- exp(g) S;   delta = beta (v - S^T k);   S <- S + k delta^T;   o = S^T q
//! ```
//!
//! `step` (`delta_step`) is the recurrent form, one token (decoding, and a draft node from
//! its parent's state), and `Chain` the same over a run of known tokens; `tree` runs a draft tree from a committed state, each node from its parent's.
//! `chunked` is the parallel form a prefill chunk takes: over `c` tokens with
//! cumulative log-decays `G_t`, the corrections `delta` solve the unit lower-triangular system
//! `delta_s + beta_s sum_{r<s} exp(G_s - G_r) (k_s . k_r) delta_r = beta_s (v_s - exp(G_s)
//! S0^T k_s)` by forward substitution, each output is `exp(G_t) S0^T q_t + sum_{s<=t}
//! exp(G_t - G_s) (q_t . k_s) delta_s`, and the state moves once per chunk: `exp(G_c) S0 +
//! sum_s exp(G_c - G_s) k_s delta_s^T`. Both give the token-by-token result within float
//! rounding (tested, chunk boundaries anywhere); every exponent is of a non-positive number.
//! As its loops stand the parallel form costs more per token than stepping (benches/README.md,
//! "The gated delta rule"): it pays once it runs on matrix products.
//!
//! Mamba-2's selective state space (Granite 4.0-H) is the same shape of recurrence with
//! another update (`Rule::Ssd`): with `q` its `C`, `k` its `B`, `v` its `x`, `beta` its step
//! `dt` and `g = dt A`, `S <- exp(g) S + k (dt v)^T;  o = S^T q + D v`. `tree` runs either.

pub use super::delta_step::{ssd_step, step, Chain, Rule};

/// A head's shape: key and value dimensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadDims {
    /// Key (and query) dimensions.
    pub dk: usize,
    /// Value dimensions.
    pub dv: usize,
}

/// Some tokens' inputs to one head, laid out row by row.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    /// Scaled queries, `tokens x dk`.
    pub q: &'a [f32],
    /// Unit keys, `tokens x dk`.
    pub k: &'a [f32],
    /// Values, `tokens x dv`.
    pub v: &'a [f32],
    /// Each token's `beta`.
    pub beta: &'a [f32],
    /// Each token's log-decay.
    pub g: &'a [f32],
}

impl<'a> Inputs<'a> {
    /// How many tokens.
    pub fn len(&self) -> usize {
        self.beta.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.beta.is_empty()
    }

    /// The tokens in `rows`.
    fn rows(&self, dims: HeadDims, rows: std::ops::Range<usize>) -> Inputs<'a> {
        let (dk, dv) = (dims.dk, dims.dv);
        Inputs {
            q: &self.q[rows.start * dk..rows.end * dk],
            k: &self.k[rows.start * dk..rows.end * dk],
            v: &self.v[rows.start * dv..rows.end * dv],
            beta: &self.beta[rows.clone()],
            g: &self.g[rows],
        }
    }

    /// `rule`'s step for token `i`.
    fn step(&self, rule: Rule, state: &mut [f32], dims: HeadDims, i: usize, out: &mut [f32]) {
        let (a, b) = (i * dims.dk, i * dims.dv);
        let (q, k) = (&self.q[a..a + dims.dk], &self.k[a..a + dims.dk]);
        let v = &self.v[b..b + dims.dv];
        rule.step(state, dims, q, k, v, self.beta[i], self.g[i], out);
    }
}

/// The tokens of `x` (`out`: `tokens x dv`) in chunks of at most `chunk` tokens, the parallel
/// form within each: `state` moves from before the first token to after the last.
pub fn chunked(state: &mut [f32], dims: HeadDims, x: &Inputs<'_>, chunk: usize, out: &mut [f32]) {
    let (t, chunk) = (x.len(), chunk.max(1));
    let mut start = 0;
    while start < t {
        let rows = start..(start + chunk).min(t);
        let out = &mut out[rows.start * dims.dv..rows.end * dims.dv];
        one_chunk(state, dims, &x.rows(dims, rows.clone()), out);
        start = rows.end;
    }
}

/// A draft tree's tokens: each node's parent (an earlier node, or `None` for a child of the
/// committed position) and its inputs.
pub struct TreeTokens<'a> {
    /// Each node's parent.
    pub parents: &'a [Option<usize>],
    /// Each node's inputs, in node order.
    pub inputs: Inputs<'a>,
    /// The update each node's state takes.
    pub rule: Rule,
}

/// A draft tree from a committed `state` (left unchanged): each node's output (`out`, `nodes
/// x dv`) is what `step` gives along its root path, bit for bit, so a node never sees a
/// sibling's state. Nodes are visited in order with the states along the current path in
/// `stack` (reused between calls: at most the tree's depth of `dk x dv` states); a node whose
/// parent is no longer on the path (a tree laid out breadth first) has its root path replayed
/// first. Once verification accepts a path, `step` over its nodes' inputs moves the committed
/// state there without another model pass.
pub fn tree(
    state: &[f32],
    dims: HeadDims,
    nodes: &TreeTokens<'_>,
    stack: &mut Vec<(usize, Vec<f32>)>,
    out: &mut [f32],
) {
    let dv = dims.dv;
    let mut scratch = vec![0f32; dv];
    let mut depth = 0;
    for (i, &parent) in nodes.parents.iter().enumerate() {
        while depth > 0 && Some(stack[depth - 1].0) != parent {
            depth -= 1;
        }
        if depth == 0 {
            // The parent's root path, replayed from the committed state (none for a root).
            let mut path = Vec::new();
            let mut at = parent;
            while let Some(n) = at {
                path.push(n);
                at = nodes.parents[n];
            }
            for &n in path.iter().rev() {
                advance(state, dims, nodes, stack, depth, n, &mut scratch);
                depth += 1;
            }
        }
        advance(
            state,
            dims,
            nodes,
            stack,
            depth,
            i,
            &mut out[i * dv..(i + 1) * dv],
        );
        depth += 1;
    }
}

/// Node `node`'s state into `stack[depth]`, from `stack[depth - 1]`'s (or the committed
/// `state` at depth 0), its output into `out`.
fn advance(
    state: &[f32],
    dims: HeadDims,
    nodes: &TreeTokens<'_>,
    stack: &mut Vec<(usize, Vec<f32>)>,
    depth: usize,
    node: usize,
    out: &mut [f32],
) {
    let HeadDims { dk, dv } = dims;
    let size = dk * dv;
    if depth == stack.len() {
        stack.push((node, vec![0f32; size]));
    }
    let (before, after) = stack.split_at_mut(depth);
    let from: &[f32] = match before.last() {
        Some((_, parent_state)) => parent_state,
        None => state,
    };
    let entry = &mut after[0];
    entry.0 = node;
    entry.1[..size].copy_from_slice(&from[..size]);
    nodes.inputs.step(nodes.rule, &mut entry.1, dims, node, out);
}

/// `dot(a, b)`.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// `out[j] = sum_i state[i][j] x[i]` (`state^T x`).
fn state_t_times(state: &[f32], dims: HeadDims, x: &[f32], out: &mut [f32]) {
    out[..dims.dv].fill(0.0);
    for (row, &xi) in state.chunks_exact(dims.dv).take(dims.dk).zip(x) {
        for (o, s) in out.iter_mut().zip(row) {
            *o += s * xi;
        }
    }
}

/// One chunk of tokens in the parallel form.
fn one_chunk(state: &mut [f32], dims: HeadDims, x: &Inputs<'_>, out: &mut [f32]) {
    let HeadDims { dk, dv } = dims;
    let Inputs { q, k, v, beta, g } = *x;
    let c = beta.len();
    // Cumulative log-decays within the chunk.
    let mut cum = Vec::with_capacity(c);
    let mut acc = 0f32;
    for &x in g {
        acc += x;
        cum.push(acc);
    }
    let key = |s: usize| &k[s * dk..(s + 1) * dk];
    // delta_s by forward substitution.
    let mut delta = vec![0f32; c * dv];
    let mut read = vec![0f32; dv];
    for s in 0..c {
        state_t_times(state, dims, key(s), &mut read);
        let e = cum[s].exp();
        let (done, rest) = delta.split_at_mut(s * dv);
        let row = &mut rest[..dv];
        for ((d, x), r) in row.iter_mut().zip(&v[s * dv..(s + 1) * dv]).zip(&read) {
            *d = *x - e * r;
        }
        for r in 0..s {
            let w = (cum[s] - cum[r]).exp() * dot(key(s), key(r));
            for (d, p) in row.iter_mut().zip(&done[r * dv..(r + 1) * dv]) {
                *d -= w * *p;
            }
        }
        for d in row.iter_mut() {
            *d *= beta[s];
        }
    }
    // Outputs from the chunk's starting state and the corrections.
    for t in 0..c {
        let qt = &q[t * dk..(t + 1) * dk];
        let o = &mut out[t * dv..(t + 1) * dv];
        state_t_times(state, dims, qt, o);
        let e = cum[t].exp();
        for x in o.iter_mut() {
            *x *= e;
        }
        for s in 0..=t {
            let w = (cum[t] - cum[s]).exp() * dot(qt, key(s));
            for (x, d) in o.iter_mut().zip(&delta[s * dv..(s + 1) * dv]) {
                *x += w * d;
            }
        }
    }
    // The state after the chunk.
    let last = cum[c - 1];
    let e = last.exp();
    for x in state.iter_mut().take(dk * dv) {
        *x *= e;
    }
    for s in 0..c {
        let w = (last - cum[s]).exp();
        for (i, row) in state.chunks_exact_mut(dv).take(dk).enumerate() {
            let ki = w * k[s * dk + i];
            for (x, d) in row.iter_mut().zip(&delta[s * dv..(s + 1) * dv]) {
                *x += ki * d;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A seeded stream of values in [-1, 1).
    struct Values(u64);

    impl Values {
        fn next(&mut self) -> f32 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        }
    }

    /// `t` tokens of a head: unit keys, scaled queries, `beta` in (0, 1), `g` in [-1.5, 0].
    struct Tokens {
        q: Vec<f32>,
        k: Vec<f32>,
        v: Vec<f32>,
        beta: Vec<f32>,
        g: Vec<f32>,
    }

    fn tokens(t: usize, dims: HeadDims, seed: u64) -> Tokens {
        let mut r = Values(seed);
        let mut unit = |n: usize, scale: f32| -> Vec<f32> {
            let x: Vec<f32> = (0..n).map(|_| r.next()).collect();
            let norm = x.iter().map(|a| a * a).sum::<f32>().sqrt().max(1e-6);
            x.iter().map(|a| a / norm * scale).collect()
        };
        let (mut q, mut k) = (Vec::new(), Vec::new());
        for _ in 0..t {
            q.extend(unit(dims.dk, 1.0 / (dims.dk as f32).sqrt()));
            k.extend(unit(dims.dk, 1.0));
        }
        let mut r = Values(seed ^ 0x5eed);
        let v = (0..t * dims.dv).map(|_| r.next()).collect();
        let beta = (0..t).map(|_| 0.5 + 0.49 * r.next()).collect();
        let g = (0..t).map(|_| -0.75 - 0.75 * r.next()).collect();
        Tokens { q, k, v, beta, g }
    }

    impl Tokens {
        fn inputs(&self) -> Inputs<'_> {
            Inputs {
                q: &self.q,
                k: &self.k,
                v: &self.v,
                beta: &self.beta,
                g: &self.g,
            }
        }
    }

    /// The recurrence in f64, token by token: outputs and the final state.
    fn reference(x: &Tokens, dims: HeadDims, state: &[f32]) -> (Vec<f64>, Vec<f64>) {
        let HeadDims { dk, dv } = dims;
        let mut s: Vec<f64> = state.iter().map(|&a| a as f64).collect();
        let mut out = Vec::new();
        for t in 0..x.beta.len() {
            let decay = (x.g[t] as f64).exp();
            s.iter_mut().for_each(|a| *a *= decay);
            let k = &x.k[t * dk..(t + 1) * dk];
            let q = &x.q[t * dk..(t + 1) * dk];
            let delta: Vec<f64> = (0..dv)
                .map(|j| {
                    let u: f64 = (0..dk).map(|i| s[i * dv + j] * k[i] as f64).sum();
                    x.beta[t] as f64 * (x.v[t * dv + j] as f64 - u)
                })
                .collect();
            for i in 0..dk {
                for j in 0..dv {
                    s[i * dv + j] += k[i] as f64 * delta[j];
                }
            }
            out.extend((0..dv).map(|j| (0..dk).map(|i| s[i * dv + j] * q[i] as f64).sum::<f64>()));
        }
        (out, s)
    }

    fn worst(a: &[f32], b: &[f64]) -> f64 {
        a.iter()
            .zip(b)
            .map(|(x, y)| (*x as f64 - y).abs())
            .fold(0.0, f64::max)
    }

    #[test]
    fn both_forms_give_the_recurrence_token_by_token() {
        let dims = HeadDims { dk: 16, dv: 24 };
        for (t, seed) in [(1, 1), (7, 2), (64, 3), (133, 4)] {
            let x = tokens(t, dims, seed);
            // A state carried in from earlier tokens.
            let mut r = Values(seed + 100);
            let start: Vec<f32> = (0..dims.dk * dims.dv).map(|_| 0.3 * r.next()).collect();
            let (want, want_state) = reference(&x, dims, &start);
            let scale = want.iter().fold(0f64, |m, a| m.max(a.abs()));
            assert!(scale > 0.01, "outputs of {scale} say nothing");
            // Recurrent.
            let mut state = start.clone();
            let mut out = vec![0f32; t * dims.dv];
            for i in 0..t {
                x.inputs().step(
                    Rule::GatedDelta,
                    &mut state,
                    dims,
                    i,
                    &mut out[i * dims.dv..(i + 1) * dims.dv],
                );
            }
            // Measured: within 2e-8 of outputs up to 0.05 (f32 against f64), both forms.
            let tolerance = 1e-4 * scale;
            let (o, s) = (worst(&out, &want), worst(&state, &want_state));
            assert!(o < tolerance && s < tolerance, "step, {t} tokens: {o}, {s}");
            // Parallel, chunk boundaries anywhere.
            for chunk in [1, 3, 16, 64, 200] {
                let mut state = start.clone();
                let mut out = vec![0f32; t * dims.dv];
                chunked(&mut state, dims, &x.inputs(), chunk, &mut out);
                let (o, s) = (worst(&out, &want), worst(&state, &want_state));
                assert!(
                    o < tolerance && s < tolerance,
                    "chunks of {chunk}, {t} tokens: {o}, {s}"
                );
            }
        }
    }

    #[test]
    fn a_tree_node_gives_its_root_path_bit_for_bit() {
        for rule in [Rule::GatedDelta, Rule::Ssd { skip: 0.7 }] {
            tree_node_gives_its_root_path(rule);
        }
    }

    fn tree_node_gives_its_root_path(rule: Rule) {
        let dims = HeadDims { dk: 8, dv: 12 };
        // 0 -> 1 -> 2, 0 -> 3 -> 4, 1 -> 5, and 6 beside the root: siblings, depth 3.
        let parents = [None, Some(0), Some(1), Some(0), Some(3), Some(1), None];
        let x = tokens(parents.len(), dims, 17);
        let mut r = Values(5);
        let start: Vec<f32> = (0..dims.dk * dims.dv).map(|_| 0.3 * r.next()).collect();
        let mut out = vec![0f32; parents.len() * dims.dv];
        let mut stack = Vec::new();
        let nodes = TreeTokens {
            parents: &parents,
            inputs: x.inputs(),
            rule,
        };
        tree(&start, dims, &nodes, &mut stack, &mut out);
        assert!(
            stack.len() <= 3,
            "{} states for a tree of depth 3",
            stack.len()
        );
        for node in 0..parents.len() {
            let mut path = vec![node];
            while let Some(p) = parents[*path.last().unwrap()] {
                path.push(p);
            }
            path.reverse();
            let mut state = start.clone();
            let mut o = vec![0f32; dims.dv];
            for &n in &path {
                x.inputs().step(rule, &mut state, dims, n, &mut o);
            }
            assert_eq!(
                o,
                out[node * dims.dv..(node + 1) * dims.dv],
                "{rule:?}, node {node}"
            );
        }
    }

    #[test]
    fn the_forms_are_checked_against_a_recurrence_that_differs() {
        // The check can fail: with the decay left out, the outputs part from the reference.
        let dims = HeadDims { dk: 8, dv: 8 };
        let x = tokens(20, dims, 9);
        let start = vec![0f32; 64];
        let (want, _) = reference(&x, dims, &start);
        let mut state = start.clone();
        let mut out = vec![0f32; 20 * 8];
        let none = vec![0f32; 20];
        let undecayed = Inputs {
            g: &none,
            ..x.inputs()
        };
        chunked(&mut state, dims, &undecayed, 4, &mut out);
        assert!(worst(&out, &want) > 1e-3);
    }

    #[test]
    fn the_ssd_step_is_mamba2s_recurrence() {
        // S[n][p] <- exp(dt A) S[n][p] + B[n] dt x[p];  y[p] = sum_n C[n] S[n][p] + D x[p],
        // in f64 from its definition, over 40 tokens from a carried-in state.
        let dims = HeadDims { dk: 16, dv: 8 };
        let x = tokens(40, dims, 23);
        let skip = 0.37f32;
        let mut r = Values(41);
        let start: Vec<f32> = (0..dims.dk * dims.dv).map(|_| 0.3 * r.next()).collect();
        let mut want_state: Vec<f64> = start.iter().map(|&a| a as f64).collect();
        let mut state = start.clone();
        let mut o = vec![0f32; dims.dv];
        let mut last = 0f64;
        for t in 0..40 {
            let (dt, g) = (x.beta[t] as f64, x.g[t] as f64);
            let b = &x.k[t * dims.dk..(t + 1) * dims.dk];
            let c = &x.q[t * dims.dk..(t + 1) * dims.dk];
            let v = &x.v[t * dims.dv..(t + 1) * dims.dv];
            for n in 0..dims.dk {
                for p in 0..dims.dv {
                    let s = &mut want_state[n * dims.dv + p];
                    *s = *s * g.exp() + b[n] as f64 * dt * v[p] as f64;
                }
            }
            let want: Vec<f64> = (0..dims.dv)
                .map(|p| {
                    (0..dims.dk)
                        .map(|n| c[n] as f64 * want_state[n * dims.dv + p])
                        .sum::<f64>()
                        + skip as f64 * v[p] as f64
                })
                .collect();
            x.inputs()
                .step(Rule::Ssd { skip }, &mut state, dims, t, &mut o);
            assert!(worst(&o, &want) < 1e-5, "token {t}");
            last = want.iter().fold(last, |m, a| m.max(a.abs()));
        }
        assert!(worst(&state, &want_state) < 1e-5);
        assert!(last > 0.05, "outputs of {last} say nothing");
        // The gated delta rule on the same inputs is another recurrence.
        let mut other = start.clone();
        for t in 0..40 {
            x.inputs()
                .step(Rule::GatedDelta, &mut other, dims, t, &mut o);
        }
        assert!(worst(&other, &want_state) > 1e-3);
    }
}
