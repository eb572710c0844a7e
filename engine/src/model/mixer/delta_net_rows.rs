//! The host half of a Gated DeltaNet layer or a Mamba-2 one (`Recurrence`: the same
//! convolution and per-head matrix state, another update, skip and norm), shared by the
//! candle-ops form and the fused one (which therefore agree bit for bit): from the rows'
//! projections to the gated, normed output of every value head. Each row's inputs (`[qkv | beta | g]`, `row_width` floats) are
//! kept at its slot in the paged store; a row convolves its own and its path's last
//! `kernel` inputs (its ancestors', then the context's, newest first), and the recurrence
//! runs from the sequence's state at the context's end:
//!
//! - the state slot has folded in fewer positions than the context holds after a draft path
//!   was accepted: the positions in between are folded in first, from their kept inputs (no
//!   model pass);
//! - a chain the sequence keeps (`SeqState::commits`) steps the slot's state in place, so it
//!   ends at the chain's last row; any other chain or tree runs on a copy, each node from its
//!   parent's state (`delta_rule::tree`), never a sibling's.

use crate::cpu::delta_rule::{self, Chain, HeadDims, Inputs, Rule, TreeTokens};
use candle_core::{Device, Tensor};

use super::{CandleAt, FusedAt};
use crate::cpu::kv_store::PagedKvStore;
use crate::cpu::qgemm::Activations;
use crate::cpu::team::{self, Disjoint};
use crate::model::config::DeltaNetShape;
use crate::model::fused_pass::Clock;
use crate::model::linear::Linear;
use crate::model::projection::{project, Projection};
use crate::tree_batch::{SeqEntry, TreeBatch};
use crate::{Error, Result};

/// What a layer's rows need beside their projections.
#[derive(Debug, Clone)]
pub(crate) struct DeltaNetConsts {
    /// The heads.
    pub shape: DeltaNetShape,
    /// Each convolution channel's taps, oldest position first: `[channels][kernel]`.
    pub taps: Vec<f32>,
    /// Per value head, added to `alpha` before the softplus.
    pub dt_bias: Vec<f32>,
    /// Per value head, the (negative) factor of the softplus: `g = decay * softplus(..)`.
    pub decay: Vec<f32>,
    /// The output norm's weight: one per value dimension (Gated DeltaNet), or per value
    /// channel (Mamba-2, whose norm runs over groups of channels).
    pub norm: Vec<f32>,
    /// The recurrence.
    pub recurrence: Recurrence,
}

/// Which recurrence a layer runs, with what only it needs.
#[derive(Debug, Clone)]
pub(crate) enum Recurrence {
    /// The gated delta rule: `beta` is its own projection's sigmoid, queries and keys are
    /// L2-normalised, each head's output is RMS-normed and then gated.
    GatedDelta,
    /// Mamba-2's selective state space: `beta` is the step `dt` (the softplus `g` is made
    /// of), the convolution's channels are `x, B, C` with a bias, each head adds `D x`, and
    /// the output is gated and then RMS-normed per group of heads.
    Mamba2 {
        /// Per value head, `D`.
        skip: Vec<f32>,
        /// Per convolution channel.
        conv_bias: Vec<f32>,
    },
}
/// The rows' projections, row-major.
pub(crate) struct Projected<'a> {
    /// `[rows][channels]`: queries, keys and values before the convolution.
    pub qkv: &'a [f32],
    /// `[rows][value heads * value dim]`: the output gate.
    pub z: &'a [f32],
    /// `[rows][value heads]`: `beta` before its sigmoid (empty for Mamba-2).
    pub b: &'a [f32],
    /// `[rows][value heads]`: `alpha` before the bias and softplus.
    pub a: &'a [f32],
}

impl DeltaNetConsts {
    /// `l` over the rows `h`, as host f32 values row by row.
    pub fn host(l: &Linear, h: &Tensor) -> Result<Vec<f32>> {
        Ok(l.forward(h)?
            .to_device(&Device::Cpu)?
            .flatten_all()?
            .to_vec1::<f32>()?)
    }

    /// Floats kept per position: the convolution's inputs, then `beta` and `g` per head.
    pub fn row_width(&self) -> usize {
        self.shape.conv_channels() + 2 * self.shape.value_heads
    }

    /// The candle-ops form's end: the rows of `at` through the layer from their projections
    /// `x`, then `out` (the output projection) over the result, on `device`.
    pub fn run_candle(
        &self,
        at: &CandleAt<'_>,
        kv: &mut PagedKvStore,
        x: &Projected<'_>,
        out: &Linear,
        device: &Device,
    ) -> Result<Tensor> {
        let eps = at.model.config().rms_norm_eps as f32;
        let mut mixed = Vec::new();
        self.run(at.batch, at.index, eps, kv, x, &mut mixed)?;
        let rows = at.batch.num_rows();
        let mixed = Tensor::from_vec(mixed, (rows, self.shape.value_width()), device)?;
        out.forward(&mixed)
    }

    /// The fused pass's end: the rows of `at` through the layer from their projections `x`
    /// (into `mixed`), then the output projection `out_proj` into `out`, each part timed.
    #[allow(clippy::too_many_arguments)]
    pub fn run_fused(
        &self,
        at: &FusedAt<'_>,
        kv: &mut PagedKvStore,
        x: &Projected<'_>,
        mixed: &mut Vec<f32>,
        (out_proj, out): (&Projection, &mut Vec<f32>),
        acts: &mut Activations,
        clock: &mut Clock,
    ) -> Result<()> {
        let eps = at.cfg.rms_norm_eps as f32;
        self.run(at.batch, at.index, eps, kv, x, mixed)?;
        clock.lap(|p| &mut p.attention);
        project(mixed, at.batch.num_rows(), &mut [(out_proj, out)], acts)?;
        clock.lap(|p| &mut p.matmul);
        Ok(())
    }

    /// Every row of `batch` through layer `layer`: `out` gets `[rows][value width]`.
    pub fn run(
        &self,
        batch: &TreeBatch,
        layer: usize,
        eps: f32,
        kv: &mut PagedKvStore,
        x: &Projected<'_>,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let s = self.shape;
        let (rows, channels, heads) = (batch.num_rows(), s.conv_channels(), s.value_heads);
        let width = self.row_width();
        let step = |r: usize, j: usize| softplus(x.a[r * heads + j] + self.dt_bias[j]);
        // The rows' slots in the layer's space (its own windowed one, where it has one).
        let slots = match batch.window_slots.is_empty() {
            true => &batch.slots,
            false => &batch.window_slots,
        };
        if slots.len() != rows {
            return Err(Error::InvalidBatch(format!(
                "{} slots for {rows} rows",
                slots.len()
            )));
        }
        // Each row's inputs, written where the store keeps them: the convolution's, then per
        // head the update's weight and the decay.
        kv.fill_rows(layer, slots, width, |r, row| {
            let (conv, rest) = row.split_at_mut(channels);
            conv.copy_from_slice(&x.qkv[r * channels..(r + 1) * channels]);
            let (weights, decays) = rest.split_at_mut(heads);
            for (j, (w, d)) in weights.iter_mut().zip(decays).enumerate() {
                *w = match self.recurrence {
                    Recurrence::GatedDelta => sigmoid(x.b[r * heads + j]),
                    Recurrence::Mamba2 { .. } => step(r, j),
                };
                *d = self.decay[j] * step(r, j);
            }
        })?;
        let row_slots: Vec<usize> = slots.iter().map(|s| s.index()).collect();
        out.clear();
        out.resize(rows * s.value_width(), 0.0);
        for (i, seq) in batch.seqs.iter().enumerate() {
            let outs = &mut out[seq.rows.start * s.value_width()..seq.rows.end * s.value_width()];
            let saves: Vec<(usize, usize)> = batch
                .state_saves
                .iter()
                .filter(|save| save.seq == i)
                .map(|save| (save.folded, save.slot))
                .collect();
            self.run_seq(seq, &row_slots, layer, eps, kv, &saves, outs)?;
        }
        self.gated_norm(x.z, eps, out);
        Ok(())
    }

    /// One sequence's rows: their recurrence outputs into `out` (`[rows][value width]`), and
    /// the snapshots `saves` asks for (`(folded, slot)`: the state once it has folded that
    /// many positions, copied into that slot).
    #[allow(clippy::too_many_arguments)]
    fn run_seq(
        &self,
        seq: &SeqEntry,
        row_slots: &[usize],
        layer: usize,
        eps: f32,
        kv: &mut PagedKvStore,
        saves: &[(usize, usize)],
        out: &mut [f32],
    ) -> Result<()> {
        let s = self.shape;
        if let Some(st) = seq.state {
            if let Some(from) = st.resume {
                // A cached prefix's end: its snapshot becomes the sequence's state.
                kv.copy_state(layer, from, st.slot)?;
                let folded = *kv.rows_and_state(layer, st.slot)?.1.folded;
                if folded != seq.context_len {
                    return Err(Error::InvalidBatch(format!(
                        "a snapshot of {folded} positions resumed for a context of {}",
                        seq.context_len
                    )));
                }
            }
        }
        let (first, context): (usize, &[usize]) = match &seq.window_context {
            Some(held) => (held.first, &held.slots),
            None => (0, &seq.context_slots),
        };
        let n = seq.context_len;
        // The slot of context position `p`, where the store still holds it.
        let at = |p: usize| -> Result<usize> {
            p.checked_sub(first)
                .and_then(|i| context.get(i).copied())
                .ok_or_else(|| {
                    Error::InvalidBatch(format!(
                        "a Gated DeltaNet layer needs position {p}'s inputs, which the store \
                         no longer holds"
                    ))
                })
        };
        let mut scratch = Vec::new();
        let save_slots: Vec<usize> = saves.iter().map(|&(_, slot)| slot).collect();
        let (stored, width, state, mut folded, mut copies) = match seq.state {
            Some(st) => {
                let ((stored, width), state, copies) =
                    kv.rows_and_states(layer, st.slot, &save_slots)?;
                (stored, width, state.values, Some(state.folded), copies)
            }
            None if n == 0 && saves.is_empty() => {
                scratch.resize(s.state_len(), 0.0);
                let (stored, width) = kv.rows(layer)?;
                (stored, width, &mut scratch[..], None, Vec::new())
            }
            None => {
                return Err(Error::InvalidBatch(
                    "a sequence with context but no recurrent state slot".into(),
                ))
            }
        };
        let mut path = Vec::with_capacity(s.kernel);
        if let Some(folded) = folded.as_deref_mut() {
            if n == 0 {
                state.fill(0.0);
                *folded = 0;
            }
            if *folded > n {
                return Err(Error::InvalidBatch(format!(
                    "a recurrent state has folded {} positions of a context of {n}",
                    *folded
                )));
            }
        }
        let start = folded.as_deref().copied().unwrap_or(0);
        // Positions accepted since the state was last moved: folded in from their inputs.
        let mut fold = Vec::with_capacity(n - start);
        for p in start..n {
            path.clear();
            for back in 0..s.kernel.min(p + 1) {
                path.push(at(p - back)?);
            }
            fold.push(self.token(&path, (stored, width), eps));
        }
        // Each row's convolution: itself, its ancestors, then the context, newest first.
        let rows = seq.rows.len();
        let mut tokens = Vec::with_capacity(rows);
        for local in 0..rows {
            path.clear();
            path.extend(
                std::iter::once(local)
                    .chain(seq.mask.ancestors_nearest_first(local))
                    .take(s.kernel)
                    .map(|j| row_slots[seq.rows.start + j]),
            );
            let more = s.kernel - path.len();
            for back in 1..=more.min(n) {
                path.push(at(n - back)?);
            }
            tokens.push(self.token(&path, (stored, width), eps));
        }
        // The snapshots asked for, copied as the state passes them.
        let mut keep_at: Vec<(usize, &mut [f32])> = Vec::with_capacity(saves.len());
        for (&(at, _), copy) in saves.iter().zip(&mut copies) {
            if at <= start || at > n + rows {
                return Err(Error::InvalidBatch(format!(
                    "a snapshot after {at} positions, outside the {start}..{} the step folds",
                    n + rows
                )));
            }
            *copy.folded = at;
            keep_at.push((at - start, &mut *copy.values));
        }
        match (seq.mask.is_chain(), seq.state) {
            (true, Some(st)) if st.commits => {
                let end = n + rows;
                fold.extend(tokens);
                self.run_heads(state, &fold, Some((n - start, out)), &mut keep_at);
                if let Some(folded) = folded {
                    *folded = end;
                }
            }
            (true, _) => {
                self.run_heads(state, &fold, None, &mut keep_at);
                if let Some(folded) = folded {
                    *folded = n;
                }
                let mut copy = state.to_vec();
                self.run_heads(&mut copy, &tokens, Some((0, out)), &mut []);
            }
            (false, _) => {
                self.run_heads(state, &fold, None, &mut keep_at);
                if let Some(folded) = folded {
                    *folded = n;
                }
                let parents: Vec<Option<usize>> = (0..rows).map(|i| seq.mask.parent(i)).collect();
                self.tree(state, &tokens, &parents, out);
            }
        }
        Ok(())
    }

    /// `tokens` through every value head's state (`[value heads][key dim][value dim]`), the
    /// heads spread over the forward's team: token `i`'s outputs into row `i - skip` of
    /// `out` (`[rows][value width]`) where given (the first `skip` tokens' are dropped), and
    /// the state after the first `count` tokens copied into `copy` for each `(count, copy)`
    /// of `keep_at`.
    fn run_heads(
        &self,
        state: &mut [f32],
        tokens: &[Token],
        out: Option<(usize, &mut [f32])>,
        keep_at: &mut [(usize, &mut [f32])],
    ) {
        let s = self.shape;
        let (dk, dv, vw) = (s.key_dim, s.value_dim, s.value_width());
        let size = dk * dv;
        let states = Disjoint::new(state);
        let (skip, out) = match out {
            Some((skip, out)) => (skip, Some(Disjoint::new(out))),
            None => (usize::MAX, None),
        };
        let copies: Vec<(usize, Disjoint<f32>)> = keep_at
            .iter_mut()
            .map(|(count, values)| (*count, Disjoint::new(values)))
            .collect();
        team::for_each(s.value_heads, |j| {
            // SAFETY: head `j` alone reaches run `j` of the state, of each copy and of each
            // output row, all inside their buffers, which outlive the loop.
            let head = unsafe { states.run(j * size, size) };
            let mut discard = vec![0f32; dv];
            let kh = s.key_head_of(j);
            let keys = kh * dk..(kh + 1) * dk;
            let mut chain = Chain::new(self.rule(j), HeadDims { dk, dv });
            for (i, token) in tokens.iter().enumerate() {
                let o = match &out {
                    Some(rows) if i >= skip => unsafe { rows.run((i - skip) * vw + j * dv, dv) },
                    _ => &mut discard[..],
                };
                let next_k = tokens.get(i + 1).map(|t| &t.k[keys.clone()]);
                chain.step(
                    head,
                    [
                        &token.q[keys.clone()],
                        &token.k[keys.clone()],
                        &token.v[j * dv..(j + 1) * dv],
                    ],
                    token.beta[j],
                    token.g[j],
                    next_k,
                    o,
                );
                for (count, copy) in &copies {
                    if *count == i + 1 {
                        unsafe { copy.run(j * size, size) }.copy_from_slice(head);
                    }
                }
            }
        });
    }

    /// Value head `j`'s update.
    fn rule(&self, j: usize) -> Rule {
        match &self.recurrence {
            Recurrence::GatedDelta => Rule::GatedDelta,
            Recurrence::Mamba2 { skip, .. } => Rule::Ssd { skip: skip[j] },
        }
    }

    /// The token whose convolution path is `path` (slots, newest first: its own, then the
    /// positions before it): the convolution (with its bias, where it has one) and its SiLU;
    /// for the gated delta rule queries and keys L2-normalised (the queries then scaled by
    /// `1/sqrt(key_dim)`); and its kept `beta` and `g`.
    fn token(&self, path: &[usize], (stored, width): (&[f32], usize), eps: f32) -> Token {
        let s = self.shape;
        let (channels, kernel) = (s.conv_channels(), s.kernel);
        let mut conv = vec![0f32; channels];
        for t in (0..path.len()).rev() {
            let src = &stored[path[t] * width..path[t] * width + channels];
            let tap = kernel - 1 - t;
            for (c, (d, x)) in conv.iter_mut().zip(src).enumerate() {
                *d += self.taps[c * kernel + tap] * *x;
            }
        }
        if let Recurrence::Mamba2 { conv_bias, .. } = &self.recurrence {
            for (x, b) in conv.iter_mut().zip(conv_bias) {
                *x += b;
            }
        }
        for x in &mut conv {
            *x *= sigmoid(*x);
        }
        let kw = s.key_heads * s.key_dim;
        let own = &stored[path[0] * width + channels..path[0] * width + width];
        let (beta, g) = own.split_at(s.value_heads);
        if let Recurrence::Mamba2 { .. } = self.recurrence {
            // `x`, then `B` (the keys), then `C` (the queries).
            let q = conv.split_off(s.value_width() + kw);
            let k = conv.split_off(s.value_width());
            return Token {
                q,
                k,
                v: conv,
                beta: beta.to_vec(),
                g: g.to_vec(),
            };
        }
        let v = conv.split_off(2 * kw);
        let k = conv.split_off(kw);
        let mut q = conv;
        let mut k = k;
        let scale = 1.0 / (s.key_dim as f32).sqrt();
        for (qh, kh) in q
            .chunks_exact_mut(s.key_dim)
            .zip(k.chunks_exact_mut(s.key_dim))
        {
            l2_normalize(qh, eps, scale);
            l2_normalize(kh, eps, 1.0);
        }
        Token {
            q,
            k,
            v,
            beta: beta.to_vec(),
            g: g.to_vec(),
        }
    }

    /// A tree's rows from `state` (left unchanged), each node from its parent's state; the
    /// heads spread over the forward's team.
    fn tree(&self, state: &[f32], tokens: &[Token], parents: &[Option<usize>], out: &mut [f32]) {
        let s = self.shape;
        let (dk, dv, vw) = (s.key_dim, s.value_dim, s.value_width());
        let dims = HeadDims { dk, dv };
        let rows = tokens.len();
        let outs = Disjoint::new(out);
        team::for_each(s.value_heads, |j| {
            let kh = s.key_head_of(j);
            let gather = |f: &dyn Fn(&Token) -> &[f32]| -> Vec<f32> {
                tokens.iter().flat_map(|t| f(t).iter().copied()).collect()
            };
            let q = gather(&|t| &t.q[kh * dk..(kh + 1) * dk]);
            let k = gather(&|t| &t.k[kh * dk..(kh + 1) * dk]);
            let v = gather(&|t| &t.v[j * dv..(j + 1) * dv]);
            let beta: Vec<f32> = tokens.iter().map(|t| t.beta[j]).collect();
            let g: Vec<f32> = tokens.iter().map(|t| t.g[j]).collect();
            let nodes = TreeTokens {
                rule: self.rule(j),
                parents,
                inputs: Inputs {
                    q: &q,
                    k: &k,
                    v: &v,
                    beta: &beta,
                    g: &g,
                },
            };
            let mut head_out = vec![0f32; rows * dv];
            let head_state = &state[j * dk * dv..(j + 1) * dk * dv];
            delta_rule::tree(head_state, dims, &nodes, &mut Vec::new(), &mut head_out);
            for (i, o) in head_out.chunks_exact(dv).enumerate() {
                // SAFETY: head `j` alone writes its run of each row, inside `out`.
                unsafe { outs.run(i * vw + j * dv, dv) }.copy_from_slice(o);
            }
        });
    }

    /// Each value head's output RMS-normed, times the norm's weight and `silu(z)`; for
    /// Mamba-2 times `silu(z)` first, then RMS-normed per group and times the weight.
    fn gated_norm(&self, z: &[f32], eps: f32, out: &mut [f32]) {
        if let Recurrence::Mamba2 { .. } = self.recurrence {
            for (x, z) in out.iter_mut().zip(z) {
                *x *= z * sigmoid(*z);
            }
            let (vw, groups) = (self.shape.value_width(), self.shape.key_heads.max(1));
            for row in out.chunks_exact_mut(vw) {
                for (group, w) in row
                    .chunks_exact_mut(vw / groups)
                    .zip(self.norm.chunks_exact(vw / groups))
                {
                    let mean = group.iter().map(|v| v * v).sum::<f32>() / group.len() as f32;
                    let r = 1.0 / (mean + eps).sqrt();
                    for (x, w) in group.iter_mut().zip(w) {
                        *x *= r * w;
                    }
                }
            }
            return;
        }
        let dv = self.shape.value_dim;
        for (x, z) in out.chunks_exact_mut(dv).zip(z.chunks_exact(dv)) {
            let mean = x.iter().map(|v| v * v).sum::<f32>() / dv as f32;
            let r = 1.0 / (mean + eps).sqrt();
            for ((x, w), z) in x.iter_mut().zip(&self.norm).zip(z) {
                *x = *x * r * w * (z * sigmoid(*z));
            }
        }
    }
}

/// One token's inputs to every head, after the convolution.
struct Token {
    /// `[key heads][key dim]`, normalised and scaled.
    q: Vec<f32>,
    /// `[key heads][key dim]`, normalised.
    k: Vec<f32>,
    /// `[value heads][value dim]`.
    v: Vec<f32>,
    /// Per value head.
    beta: Vec<f32>,
    /// Per value head, the log-decay.
    g: Vec<f32>,
}

/// `x / sqrt(sum x^2 + eps)`, times `scale` (as Gated DeltaNet's reference normalises).
fn l2_normalize(x: &mut [f32], eps: f32, scale: f32) {
    let f = scale / (x.iter().map(|v| v * v).sum::<f32>() + eps).sqrt();
    for v in x {
        *v *= f;
    }
}

/// The logistic function.
fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `ln(1 + e^x)`, exactly `x` where the exponential would dominate.
fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}
