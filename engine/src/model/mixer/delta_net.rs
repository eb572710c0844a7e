//! Gated DeltaNet as a token mixer (Qwen3.5, Qwen3-Next): four projections of the normed
//! rows (queries, keys and values before the convolution; the output gate `z`; `beta` and
//! `alpha` per value head), a causal convolution with SiLU, the gated delta rule with one
//! state per value head and sequence, a gated RMSNorm of each head's output and the output
//! projection. The layer keeps each position's inputs as a row of the paged store and each
//! sequence's state in a state slot (`LayerStorage::Recurrent`); the arithmetic between the
//! projections is `delta_net_rows`, shared by the candle-ops form and the fused one.

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};

use super::delta_net_rows::{DeltaNetConsts, Projected, Recurrence};
use super::{CandleAt, FusedAt, FusedMixer, MixerBuffers, TokenMixer};
use crate::cpu::kv_store::{LayerStorage, PagedKvStore};
use crate::cpu::qgemm::Activations;
use crate::model::config::{DeltaNetShape, LayerMixer};
use crate::model::fused_pass::Clock;
use crate::model::linear::Linear;
use crate::model::projection::{project, Projection};
use crate::{Error, Result};

/// A Gated DeltaNet layer's tensors as a file gives them.
pub struct DeltaNetParts {
    /// `[channels, hidden]`: queries, keys, values.
    pub qkv: Linear,
    /// `[value width, hidden]`: the output gate.
    pub gate: Linear,
    /// `[value heads, hidden]`.
    pub beta: Linear,
    /// `[value heads, hidden]`.
    pub alpha: Linear,
    /// The convolution's taps, `[channels, kernel]` or `[channels, 1, kernel]`.
    pub conv: Tensor,
    /// Per value head.
    pub dt_bias: Vec<f32>,
    /// Per value head, negative (`-exp(A_log)`).
    pub decay: Vec<f32>,
    /// The output norm's weight, per value dimension.
    pub norm: Vec<f32>,
    /// `[hidden, value width]`.
    pub out: Linear,
}

/// One Gated DeltaNet layer.
#[derive(Debug, Clone)]
pub struct DeltaNetWeights {
    qkv: Linear,
    gate: Linear,
    beta: Linear,
    alpha: Linear,
    out: Linear,
    consts: Arc<DeltaNetConsts>,
}

impl DeltaNetWeights {
    /// The layer, its taps checked against `shape`.
    pub fn new(shape: DeltaNetShape, parts: DeltaNetParts) -> Result<Self> {
        let channels = shape.conv_channels();
        let dims = parts.conv.dims().to_vec();
        match dims.as_slice() {
            [c, k] | [c, 1, k] if *c == channels && *k == shape.kernel => {}
            _ => {
                return Err(Error::Metadata(format!(
                    "a Gated DeltaNet convolution's weight is {dims:?}; [{channels}, {}] \
                     expected",
                    shape.kernel
                )))
            }
        }
        let taps = parts
            .conv
            .to_device(&Device::Cpu)?
            .to_dtype(DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        if let Some(bad) = parts.decay.iter().find(|a| a.is_nan() || **a > 0.0) {
            return Err(Error::Metadata(format!(
                "a Gated DeltaNet decay factor of {bad}: it must be negative (-exp(A_log))"
            )));
        }
        Ok(Self {
            qkv: parts.qkv,
            gate: parts.gate,
            beta: parts.beta,
            alpha: parts.alpha,
            out: parts.out,
            consts: Arc::new(DeltaNetConsts {
                shape,
                taps,
                dt_bias: parts.dt_bias,
                decay: parts.decay,
                norm: parts.norm,
                recurrence: Recurrence::GatedDelta,
            }),
        })
    }
}

impl TokenMixer for DeltaNetWeights {
    fn kind(&self) -> LayerMixer {
        LayerMixer::DeltaNet(self.consts.shape)
    }

    fn storage(&self) -> LayerStorage {
        LayerStorage::Recurrent {
            row: self.consts.row_width(),
            state: self.consts.shape.state_len(),
        }
    }

    fn projections(&self) -> Vec<&Linear> {
        vec![&self.qkv, &self.gate, &self.beta, &self.alpha, &self.out]
    }

    fn projections_mut(&mut self) -> Vec<&mut Linear> {
        vec![
            &mut self.qkv,
            &mut self.gate,
            &mut self.beta,
            &mut self.alpha,
            &mut self.out,
        ]
    }

    fn forward_candle(
        &self,
        at: &CandleAt<'_>,
        h: &Tensor,
        kv: &mut PagedKvStore,
    ) -> Result<Tensor> {
        let host = |l: &Linear| DeltaNetConsts::host(l, h);
        let (qkv, z) = (host(&self.qkv)?, host(&self.gate)?);
        let (b, a) = (host(&self.beta)?, host(&self.alpha)?);
        let x = Projected {
            qkv: &qkv,
            z: &z,
            b: &b,
            a: &a,
        };
        self.consts.run_candle(at, kv, &x, &self.out, h.device())
    }

    fn fused(&self) -> Result<Arc<dyn FusedMixer>> {
        let p = Projection::from_linear;
        Ok(Arc::new(FusedDeltaNet {
            qkv: p(&self.qkv)?,
            gate: p(&self.gate)?,
            beta: p(&self.beta)?,
            alpha: p(&self.alpha)?,
            out: p(&self.out)?,
            consts: self.consts.clone(),
        }))
    }

    fn clone_box(&self) -> Box<dyn TokenMixer> {
        Box::new(self.clone())
    }
}

/// Gated DeltaNet in the fused pass.
#[derive(Debug)]
struct FusedDeltaNet {
    qkv: Projection,
    gate: Projection,
    beta: Projection,
    alpha: Projection,
    out: Projection,
    consts: Arc<DeltaNetConsts>,
}

impl FusedMixer for FusedDeltaNet {
    fn projections(&self) -> Vec<&Projection> {
        vec![&self.qkv, &self.gate, &self.beta, &self.alpha, &self.out]
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
        let rows = at.batch.num_rows();
        project(
            h,
            rows,
            &mut [
                (&self.qkv, &mut w.q),
                (&self.gate, &mut w.k),
                (&self.beta, &mut w.v),
                (&self.alpha, &mut w.normed),
            ],
            acts,
        )?;
        clock.lap(|p| &mut p.matmul);
        let x = Projected {
            qkv: &w.q,
            z: &w.k,
            b: &w.v,
            a: &w.normed,
        };
        self.consts
            .run_fused(at, kv, &x, &mut w.mixed, (&self.out, out), acts, clock)
    }
}
