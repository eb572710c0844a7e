//! Attention as a token mixer: q/k/v projections (with biases where the family has them),
//! the per-head QK norm where declared, RoPE from the layer's table, K and V written at each
//! row's slot and paged tree attention over what the row sees (full, or its window's view),
//! then, in a gated family (Qwen3.5), each head's output times the sigmoid of its gate, and
//! the output projection. The candle-ops form and the fused form repeat the same arithmetic
//! (the fused pass's bit-identity rests on it).

use std::sync::Arc;

use candle_core::Tensor;

use super::{CandleAt, FusedAt, FusedMixer, MixerBuffers, TokenMixer};
use crate::cpu::attention::{
    gathered_tree_attention, paged_tree_attention, AttentionKernel, HeadShape,
};
use crate::cpu::kv_store::{LayerStorage, PagedKvStore};
use crate::cpu::qgemm::Activations;
use crate::model::config::{LayerMixer, ModelConfig};
use crate::model::fused_pass::{host_values, Clock};
use crate::model::fused_rows::{rms_norm, rotate};
use crate::model::linear::Linear;
use crate::model::projection::{project, Projection};
use crate::Result;

/// One layer's attention weights.
#[derive(Debug, Clone)]
pub struct AttentionWeights {
    /// Per-head RMSNorm of queries and of keys before RoPE (QK-norm families).
    pub qk_norm: Option<(Tensor, Tensor)>,
    /// Query projection.
    pub q: Linear,
    /// Key projection.
    pub k: Linear,
    /// Value projection.
    pub v: Linear,
    /// Output projection.
    pub o: Linear,
    /// The gate on each head's output, where the family gates it (`[heads * dim, hidden]`).
    pub output_gate: Option<Linear>,
    /// Each query head's sink logit, where the model has them (gpt-oss).
    pub sinks: Option<Vec<f32>>,
}

/// The shape layer `index` of `cfg` attends in, with the layer's `sinks`.
pub(super) fn head_shape<'a>(
    cfg: &ModelConfig,
    index: usize,
    sinks: Option<&'a [f32]>,
) -> HeadShape<'a> {
    let (kv_heads, head_dim) = cfg.layer_heads(index);
    let plain = HeadShape::plain(cfg.num_heads, kv_heads, head_dim);
    HeadShape {
        scale: cfg.variant.attention_scale.unwrap_or(plain.scale),
        softcap: cfg.variant.attention_softcap,
        sinks,
        ..plain
    }
}

impl TokenMixer for AttentionWeights {
    fn kind(&self) -> LayerMixer {
        LayerMixer::Attention
    }

    fn storage(&self) -> LayerStorage {
        LayerStorage::Kv
    }

    fn attention(&self) -> Option<&AttentionWeights> {
        Some(self)
    }

    fn projections(&self) -> Vec<&Linear> {
        let mut all = vec![&self.q, &self.k, &self.v, &self.o];
        all.extend(self.output_gate.as_ref());
        all
    }

    fn projections_mut(&mut self) -> Vec<&mut Linear> {
        let mut all = vec![&mut self.q, &mut self.k, &mut self.v, &mut self.o];
        all.extend(self.output_gate.as_mut());
        all
    }

    fn forward_candle(
        &self,
        at: &CandleAt<'_>,
        h: &Tensor,
        kv: &mut PagedKvStore,
    ) -> Result<Tensor> {
        let model = at.model;
        let cfg = model.config();
        let (cos, sin) = at.rope;
        let eps = cfg.rms_norm_eps as f32;
        let (kv_heads, head_dim) = cfg.layer_heads(at.index);
        let rotary = cfg.layer_rotary(at.index);
        let mut q = self.q.forward(h)?;
        let mut k = self.k.forward(h)?;
        if let Some((q_norm, k_norm)) = &self.qk_norm {
            q = head_norm(&q, q_norm, head_dim, eps)?;
            k = head_norm(&k, k_norm, head_dim, eps)?;
        }
        let q = model.rotate(&q, cfg.num_heads, rotary, cos, sin)?;
        let k = model.rotate(&k, kv_heads, rotary, cos, sin)?;
        let mut v = self.v.forward(h)?;
        if cfg.variant.value_norm {
            let ones = Tensor::ones(head_dim, v.dtype(), v.device())?;
            v = head_norm(&v, &ones, head_dim, eps)?;
        }
        // K back to row-major [rows][kv_heads][dim] for the store; Q stays head-major.
        let k = k.squeeze(0)?.transpose(0, 1)?.contiguous()?;
        let seen = at.seen;
        kv.write(
            at.index,
            &seen.slots,
            &k.flatten_all()?.to_vec1::<f32>()?,
            &v.flatten_all()?.to_vec1::<f32>()?,
        )?;
        let shape = head_shape(cfg, at.index, self.sinks.as_deref());
        let attn = attend(at, &q, kv, shape)?;
        let attn = match &self.output_gate {
            Some(gate) => {
                let mut values = attn.flatten_all()?.to_vec1::<f32>()?;
                let gates = gate.forward(h)?.flatten_all()?.to_vec1::<f32>()?;
                apply_gate(&mut values, &gates);
                Tensor::from_vec(values, attn.dims(), model.device())?
            }
            None => attn,
        };
        self.o.forward(&attn)
    }

    fn fused(&self) -> Result<Arc<dyn FusedMixer>> {
        let p = Projection::from_linear;
        Ok(Arc::new(FusedAttention {
            qk_norm: self
                .qk_norm
                .as_ref()
                .map(|(a, b)| Ok::<_, crate::Error>((host_values(a)?, host_values(b)?)))
                .transpose()?,
            q: p(&self.q)?,
            k: p(&self.k)?,
            v: p(&self.v)?,
            o: p(&self.o)?,
            output_gate: self.output_gate.as_ref().map(p).transpose()?,
            sinks: self.sinks.clone(),
        }))
    }

    fn clone_box(&self) -> Box<dyn TokenMixer> {
        Box::new(self.clone())
    }
}

/// Attention of the rotated queries `q` (`[1, heads, rows, dim]`) over what layer `at.index`
/// reads in `kv` (its own keys and values, or those of the layer it shares): `[rows, heads *
/// dim]`.
pub(super) fn attend(
    at: &CandleAt<'_>,
    q: &Tensor,
    kv: &PagedKvStore,
    shape: HeadShape<'_>,
) -> Result<Tensor> {
    let model = at.model;
    let device = model.device();
    Ok(match model.attention() {
        AttentionKernel::Reference => {
            gathered_tree_attention(q, kv.layer(at.index), at.seen, shape, device)?
        }
        AttentionKernel::Fused => {
            let q = q.flatten_all()?.to_vec1::<f32>()?;
            let attn = paged_tree_attention(&q, kv.layer(at.index), at.seen, shape);
            let width = shape.num_heads * shape.head_dim;
            Tensor::from_vec(attn, (at.batch.num_rows(), width), device)?
        }
    })
}

/// RMSNorm of each head of `x` (`[rows, heads * dim]`) with the per-head weight `alpha`.
pub(super) fn head_norm(x: &Tensor, alpha: &Tensor, head_dim: usize, eps: f32) -> Result<Tensor> {
    let (rows, width) = x.dims2()?;
    let heads = x.reshape((rows * width / head_dim, head_dim))?;
    Ok(candle_nn::ops::rms_norm(&heads, alpha, eps)?.reshape((rows, width))?)
}

/// `values[i] *= sigmoid(gates[i])`: a gated head's output.
fn apply_gate(values: &mut [f32], gates: &[f32]) {
    for (x, g) in values.iter_mut().zip(gates) {
        *x *= 1.0 / (1.0 + (-g).exp());
    }
}

/// Attention in the fused pass.
#[derive(Debug)]
struct FusedAttention {
    qk_norm: Option<(Vec<f32>, Vec<f32>)>,
    q: Projection,
    k: Projection,
    v: Projection,
    o: Projection,
    output_gate: Option<Projection>,
    sinks: Option<Vec<f32>>,
}

impl FusedMixer for FusedAttention {
    fn projections(&self) -> Vec<&Projection> {
        let mut all = vec![&self.q, &self.k, &self.v, &self.o];
        all.extend(self.output_gate.as_ref());
        all
    }

    fn run(
        &self,
        at: &FusedAt<'_>,
        h: &[f32],
        kv: &mut PagedKvStore,
        w: &mut MixerBuffers,
        acts: &mut Activations,
        clock: &mut Clock,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let cfg = at.cfg;
        let rows = at.batch.num_rows();
        let eps = cfg.rms_norm_eps as f32;
        project(
            h,
            rows,
            &mut [
                (&self.q, &mut w.q),
                (&self.k, &mut w.k),
                (&self.v, &mut w.v),
            ],
            acts,
        )?;
        clock.lap(|p| &mut p.matmul);
        if let Some((q_norm, k_norm)) = &self.qk_norm {
            for (x, alpha) in [(&mut w.q, q_norm), (&mut w.k, k_norm)] {
                w.normed.resize(x.len(), 0.0);
                rms_norm(x, alpha, eps, &mut w.normed);
                std::mem::swap(x, &mut w.normed);
            }
        }
        if cfg.variant.value_norm {
            let ones = vec![1.0; cfg.layer_heads(at.index).1];
            w.normed.resize(w.v.len(), 0.0);
            rms_norm(&w.v, &ones, eps, &mut w.normed);
            std::mem::swap(&mut w.v, &mut w.normed);
        }
        let positions = &at.batch.positions;
        let (heads, kv_heads) = (cfg.num_heads, cfg.layer_heads(at.index).0);
        let rotary = cfg.layer_rotary(at.index);
        rotate(
            rotary,
            at.table,
            positions,
            &w.q,
            heads,
            &mut w.q_heads,
            true,
        );
        rotate(rotary, at.table, positions, &[], kv_heads, &mut w.k, false);
        clock.lap(|p| &mut p.other);
        kv.write(at.index, &at.seen.slots, &w.k, &w.v)?;
        let shape = head_shape(cfg, at.index, self.sinks.as_deref());
        let mut attn = paged_tree_attention(&w.q_heads, kv.layer(at.index), at.seen, shape);
        clock.lap(|p| &mut p.attention);
        if let Some(gate) = &self.output_gate {
            project(h, rows, &mut [(gate, &mut w.mixed)], acts)?;
            apply_gate(&mut attn, &w.mixed);
            clock.lap(|p| &mut p.matmul);
        }
        project(&attn, rows, &mut [(&self.o, out)], acts)?;
        clock.lap(|p| &mut p.matmul);
        Ok(())
    }
}
