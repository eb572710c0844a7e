//! A layer's MLP, dense or a mixture of experts (`Mlp`), and the mixture's routing. The router
//! runs in f32 on the host in both forwards (the fused CPU pass and candle's ops): each row's
//! logits against every expert, a softmax, the `experts_per_token` most probable experts (ties
//! to the lower index), their probabilities divided by their sum where the family normalizes.
//! A row's route depends on its own values only, so a row routes alike whatever rows share
//! its step (what lossless tree verification needs). The experts' products are in `fused`
//! (thicket's kernels: each active expert's weights read once for all of its rows) and
//! `candle` (candle's ops, any device); loading them from GGUF's stacked tensors and HF's
//! per-expert ones is in `load`, and mapping them prepared for the SIMD kernels in `prepared`.

mod candle;
pub(crate) mod fused;
pub(crate) mod load;
pub mod prepared;

pub(crate) use candle::mlp as candle_mlp;

use crate::cpu::team::{self, Disjoint};
use crate::model::fused_rows::{add_into, rms_norm};
use crate::model::linear::Linear;

/// A gated MLP: `down(act(gate(x)) * up(x))`.
#[derive(Debug, Clone)]
pub struct DenseMlp {
    /// Gate projection.
    pub gate: Linear,
    /// Up projection.
    pub up: Linear,
    /// Down projection.
    pub down: Linear,
}

impl DenseMlp {
    /// The three projections.
    pub fn projections(&self) -> [&Linear; 3] {
        [&self.gate, &self.up, &self.down]
    }

    /// The three projections, to change their kernel.
    pub fn projections_mut(&mut self) -> [&mut Linear; 3] {
        [&mut self.gate, &mut self.up, &mut self.down]
    }

    /// Bytes of weights one row reads.
    pub fn weight_bytes(&self) -> usize {
        self.projections().iter().map(|l| l.weight_bytes()).sum()
    }
}

/// The shared expert every row runs: scaled by `sigmoid(gate . x)` (Qwen2-MoE, Qwen3.5), or
/// added as it is where the family has no gate (Granite 4.0-H).
#[derive(Debug, Clone)]
pub struct SharedExpert {
    /// Its MLP.
    pub mlp: DenseMlp,
    /// The gate's one row, `[hidden]`, where it has one.
    pub gate: Option<Vec<f32>>,
}

/// A mixture of experts.
#[derive(Debug, Clone)]
pub struct ExpertMlp {
    /// The router, `[num_experts][hidden]` row-major f32.
    pub router: Vec<f32>,
    /// The router's bias, `[num_experts]`, where it has one (gpt-oss).
    pub router_bias: Option<Vec<f32>>,
    /// The experts.
    pub experts: Vec<DenseMlp>,
    /// The shared expert, where the family has one.
    pub shared: Option<SharedExpert>,
    /// Experts each row runs.
    pub top_k: usize,
    /// Whether the chosen probabilities are divided by their sum.
    pub normalize: bool,
    /// Gemma 4's arrangement beside the layer's dense MLP (the shared expert), where the
    /// family has it.
    pub beside: Option<Box<Beside>>,
}

/// Gemma 4's mixture beside the layer's dense MLP (held as the shared expert, reading the
/// layer's MLP norm of the residual): the experts read the residual normed by `experts_in`,
/// their weighted sum is normed by `experts_out` and the dense MLP's output by `dense_out`,
/// and the two are added; the router reads the residual RMS-normed without a weight, times
/// `hidden^-1/2`, times `router_scale`, and each chosen expert's weight is times its
/// `expert_scales` entry (as llama.cpp and transformers compute them).
#[derive(Debug, Clone)]
pub struct Beside {
    /// RMSNorm weight of the experts' input.
    pub experts_in: Vec<f32>,
    /// RMSNorm weight of the experts' weighted sum.
    pub experts_out: Vec<f32>,
    /// RMSNorm weight of the dense MLP's output.
    pub dense_out: Vec<f32>,
    /// Per residual dimension, the router input's factor.
    pub router_scale: Vec<f32>,
    /// Per expert, a factor on its output, where the file has them.
    pub expert_scales: Option<Vec<f32>>,
    /// The model's RMSNorm epsilon.
    pub eps: f32,
}

impl Beside {
    /// The router's rows and the experts' rows from the residual rows `x`.
    pub(crate) fn inputs(&self, x: &[f32], router_rows: &mut Vec<f32>, expert_rows: &mut Vec<f32>) {
        let hidden = self.experts_in.len();
        expert_rows.resize(x.len(), 0.0);
        rms_norm(x, &self.experts_in, self.eps, expert_rows);
        router_rows.resize(x.len(), 0.0);
        rms_norm(x, &vec![1.0; hidden], self.eps, router_rows);
        let inverse = 1.0 / (hidden as f32).sqrt();
        for row in router_rows.chunks_exact_mut(hidden.max(1)) {
            for (v, s) in row.iter_mut().zip(&self.router_scale) {
                *v = *v * inverse * *s;
            }
        }
    }

    /// Each chosen expert's weight times its factor.
    pub(crate) fn scale_routes(&self, routes: &mut Routes) {
        if let Some(scales) = &self.expert_scales {
            for (w, &e) in routes.weights.iter_mut().zip(&routes.experts) {
                *w *= scales[e as usize];
            }
        }
    }

    /// `out = norm(out, experts_out) + norm(dense, dense_out)`, `normed` a buffer.
    pub(crate) fn outputs(&self, out: &mut [f32], dense: &[f32], normed: &mut Vec<f32>) {
        normed.resize(out.len(), 0.0);
        rms_norm(dense, &self.dense_out, self.eps, normed);
        let experts = out.to_vec();
        rms_norm(&experts, &self.experts_out, self.eps, out);
        add_into(normed, out);
    }
}

/// A layer's MLP.
#[derive(Debug, Clone)]
pub enum Mlp {
    /// One gated MLP.
    Dense(DenseMlp),
    /// A mixture of experts.
    Experts(Box<ExpertMlp>),
}

impl Mlp {
    /// The dense MLP, `None` for a mixture.
    pub fn dense(&self) -> Option<&DenseMlp> {
        match self {
            Self::Dense(mlp) => Some(mlp),
            Self::Experts(_) => None,
        }
    }

    /// Every projection (each expert's and the shared expert's included).
    pub fn projections_mut(&mut self) -> Vec<&mut Linear> {
        match self {
            Self::Dense(mlp) => mlp.projections_mut().into_iter().collect(),
            Self::Experts(moe) => {
                let ExpertMlp {
                    experts, shared, ..
                } = &mut **moe;
                experts
                    .iter_mut()
                    .chain(shared.iter_mut().map(|s| &mut s.mlp))
                    .flat_map(|mlp| mlp.projections_mut())
                    .collect()
            }
        }
    }

    /// Bytes of weights one decoding row reads: the dense MLP, or the router, its share of
    /// experts (`top_k` of the average expert) and the shared expert.
    pub fn weight_bytes(&self) -> usize {
        match self {
            Self::Dense(mlp) => mlp.weight_bytes(),
            Self::Experts(moe) => {
                let all: usize = moe.experts.iter().map(DenseMlp::weight_bytes).sum();
                let shared = moe.shared.as_ref().map_or(0, |s| {
                    s.mlp.weight_bytes()
                        + s.gate.as_ref().map_or(0, Vec::len) * std::mem::size_of::<f32>()
                });
                moe.router.len() * std::mem::size_of::<f32>()
                    + all * moe.top_k / moe.experts.len().max(1)
                    + shared
            }
        }
    }
}

/// Each row's chosen experts and their weights, `top_k` per row, most probable first.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Routes {
    /// Experts per row.
    pub top_k: usize,
    /// `[rows][top_k]` expert indices.
    pub experts: Vec<u32>,
    /// `[rows][top_k]` weights.
    pub weights: Vec<f32>,
}

impl Routes {
    /// Rows routed.
    pub fn rows(&self) -> usize {
        self.experts.len() / self.top_k.max(1)
    }

    /// For each expert, the `(row, choice)` pairs routed to it, rows ascending (`choice`:
    /// the rank of the expert among the row's).
    pub fn by_expert(&self, num_experts: usize) -> Vec<Vec<(usize, usize)>> {
        let mut groups = vec![Vec::new(); num_experts];
        for (i, &e) in self.experts.iter().enumerate() {
            groups[e as usize].push((i / self.top_k, i % self.top_k));
        }
        groups
    }
}

/// `a . b` in f32, summed in eight lanes (then the lanes in order): the same value for the
/// same inputs on every path and whatever else is in the step.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let (a8, a_rest) = a.split_at(a.len() / 8 * 8);
    let (b8, b_rest) = b.split_at(a8.len());
    for (x, y) in a8.chunks_exact(8).zip(b8.chunks_exact(8)) {
        for l in 0..8 {
            lanes[l] += x[l] * y[l];
        }
    }
    let mut sum = lanes.iter().sum::<f32>();
    for (x, y) in a_rest.iter().zip(b_rest) {
        sum += x * y;
    }
    sum
}

/// `1 / (1 + e^-x)`.
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

impl ExpertMlp {
    /// Residual width.
    pub fn hidden(&self) -> usize {
        self.router.len() / self.experts.len().max(1)
    }

    /// Routes each of the rows of `h` (`[rows][hidden]`). Blocks of [`ROUTE_ROWS`] rows are
    /// spread over the forward's team, and a block reads each expert's router row once for
    /// all of its rows; every value is what routing the row alone gives.
    pub fn route(&self, h: &[f32]) -> Routes {
        let hidden = self.hidden();
        let (n, k) = (self.experts.len(), self.top_k.min(self.experts.len()));
        let rows = h.len() / hidden.max(1);
        let mut routes = Routes {
            top_k: k,
            experts: vec![0; rows * k],
            weights: vec![0.0; rows * k],
        };
        if rows == 0 || n == 0 || hidden == 0 {
            return routes;
        }
        let experts = Disjoint::new(&mut routes.experts);
        let weights = Disjoint::new(&mut routes.weights);
        team::for_each(rows.div_ceil(ROUTE_ROWS), |block| {
            let first = block * ROUTE_ROWS;
            let count = ROUTE_ROWS.min(rows - first);
            let x = &h[first * hidden..(first + count) * hidden];
            let mut probs = vec![0f32; count * n];
            for (e, w) in self.router.chunks_exact(hidden).enumerate() {
                let bias = self.router_bias.as_ref().map_or(0.0, |b| b[e]);
                for (r, x) in x.chunks_exact(hidden).enumerate() {
                    probs[r * n + e] = dot(x, w) + bias;
                }
            }
            // SAFETY: block `block` alone reaches its rows' runs, inside buffers sized for
            // every row, which outlive the loop.
            let (experts, weights) = unsafe {
                (
                    experts.run(first * k, count * k),
                    weights.run(first * k, count * k),
                )
            };
            let mut order: Vec<u32> = Vec::with_capacity(n);
            for r in 0..count {
                let probs = &mut probs[r * n..(r + 1) * n];
                softmax(probs);
                order.clear();
                order.extend(0..n as u32);
                // Most probable first; equal probabilities keep the lower index first.
                let rank = |a: &u32, b: &u32| {
                    probs[*b as usize]
                        .total_cmp(&probs[*a as usize])
                        .then(a.cmp(b))
                };
                if k < n {
                    order.select_nth_unstable_by(k, rank);
                }
                let chosen = &mut order[..k];
                chosen.sort_unstable_by(rank);
                let sum: f32 = chosen.iter().map(|&e| probs[e as usize]).sum();
                for (j, &e) in chosen.iter().enumerate() {
                    let p = probs[e as usize];
                    experts[r * k + j] = e;
                    weights[r * k + j] = if self.normalize { p / sum } else { p };
                }
            }
        });
        routes
    }
}

/// Rows routed together: each expert's router row is read once for this many rows.
const ROUTE_ROWS: usize = 8;

/// `out[r] = sum_j weight[r][j] * chosen[r][j]`, each row's choices added in their order
/// (`chosen`: `[rows][top_k][hidden]`).
pub fn combine(routes: &Routes, chosen: &[f32], hidden: usize, out: &mut Vec<f32>) {
    let rows = routes.rows();
    out.clear();
    out.resize(rows * hidden, 0.0);
    let k = routes.top_k;
    let outs = Disjoint::new(out);
    team::for_each(rows.div_ceil(ROUTE_ROWS), |block| {
        let first = block * ROUTE_ROWS;
        let count = ROUTE_ROWS.min(rows - first);
        // SAFETY: block `block` alone reaches its rows of `out`, which outlives the loop.
        let o = unsafe { outs.run(first * hidden, count * hidden) };
        for (i, o) in o.chunks_exact_mut(hidden).enumerate() {
            let r = first + i;
            for j in 0..k {
                let w = routes.weights[r * k + j];
                let y = &chosen[(r * k + j) * hidden..][..hidden];
                for (o, y) in o.iter_mut().zip(y) {
                    *o += w * y;
                }
            }
        }
    });
}

/// `out[r] += sigmoid(gate . h[r]) * y[r]`: the shared expert's output `y` added, scaled
/// (`y[r]` as it is where there is no gate).
pub fn add_shared(h: &[f32], y: &[f32], gate: Option<&[f32]>, out: &mut [f32]) {
    let Some(gate) = gate else {
        add_into(y, out);
        return;
    };
    let hidden = gate.len();
    for ((x, y), o) in h
        .chunks_exact(hidden)
        .zip(y.chunks_exact(hidden))
        .zip(out.chunks_exact_mut(hidden))
    {
        let g = sigmoid(dot(x, gate));
        for (o, y) in o.iter_mut().zip(y) {
            *o += g * y;
        }
    }
}

/// Softmax in place: `e^(x - max) / sum`.
fn softmax(xs: &mut [f32]) {
    let max = xs.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f32;
    for x in xs.iter_mut() {
        *x = (*x - max).exp();
        sum += *x;
    }
    for x in xs.iter_mut() {
        *x /= sum;
    }
}

#[cfg(test)]
mod tests;
