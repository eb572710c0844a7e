//! Mamba-2 as a token mixer (Granite 4.0-H): one input projection of the normed rows giving
//! the gate `z`, the convolution's channels `x, B, C` and a step `dt` per head (loaded as
//! three projections, so the fused pass quantizes the rows once for all of them), a causal
//! convolution with bias and SiLU, the selective state space with one state per head and
//! sequence, the gate and a per-group RMSNorm, and the output projection. What a position
//! keeps and how a sequence's state moves (a kept chain in place, a draft tree from its
//! parents' states, an accepted path folded in without a model pass) is Gated DeltaNet's:
//! the host half is `delta_net_rows` with `Recurrence::Mamba2`.

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

/// A Mamba-2 layer's tensors as a file gives them (the input projection already cut).
pub struct Mamba2Parts {
    /// `[heads * head dim, hidden]`: the gate `z`.
    pub gate: Linear,
    /// `[channels, hidden]`: `x`, `B`, `C` before the convolution.
    pub xbc: Linear,
    /// `[heads, hidden]`: each head's step before its bias and softplus.
    pub dt: Linear,
    /// The convolution's taps, `[channels, kernel]` or `[channels, 1, kernel]`.
    pub conv: Tensor,
    /// Per channel.
    pub conv_bias: Vec<f32>,
    /// Per head.
    pub dt_bias: Vec<f32>,
    /// Per head, negative (`A = -exp(A_log)`).
    pub decay: Vec<f32>,
    /// Per head, `D`.
    pub skip: Vec<f32>,
    /// The group norm's weight, per channel of `x`.
    pub norm: Vec<f32>,
    /// `[hidden, heads * head dim]`.
    pub out: Linear,
}

/// One Mamba-2 layer.
#[derive(Debug, Clone)]
pub struct Mamba2Weights {
    gate: Linear,
    xbc: Linear,
    dt: Linear,
    out: Linear,
    consts: Arc<DeltaNetConsts>,
}

impl Mamba2Weights {
    /// The layer, its vectors checked against `shape`.
    pub fn new(shape: DeltaNetShape, parts: Mamba2Parts) -> Result<Self> {
        let channels = shape.conv_channels();
        let dims = parts.conv.dims().to_vec();
        match dims.as_slice() {
            [c, k] | [c, 1, k] if *c == channels && *k == shape.kernel => {}
            _ => {
                return Err(Error::Metadata(format!(
                    "a Mamba-2 convolution's weight is {dims:?}; [{channels}, {}] expected",
                    shape.kernel
                )))
            }
        }
        let heads = shape.value_heads;
        for (what, len, want) in [
            ("convolution bias", parts.conv_bias.len(), channels),
            ("step bias", parts.dt_bias.len(), heads),
            ("A", parts.decay.len(), heads),
            ("D", parts.skip.len(), heads),
            ("norm", parts.norm.len(), shape.value_width()),
        ] {
            if len != want {
                return Err(Error::Metadata(format!(
                    "a Mamba-2 layer's {what} has {len} values; {want} expected"
                )));
            }
        }
        if !shape.value_width().is_multiple_of(shape.key_heads.max(1)) {
            return Err(Error::Metadata(format!(
                "a Mamba-2 layer of {} channels cannot be normed in {} groups",
                shape.value_width(),
                shape.key_heads
            )));
        }
        if let Some(bad) = parts.decay.iter().find(|a| a.is_nan() || **a > 0.0) {
            return Err(Error::Metadata(format!(
                "a Mamba-2 A of {bad}: it must be negative (-exp(A_log))"
            )));
        }
        let taps = parts
            .conv
            .to_device(&Device::Cpu)?
            .to_dtype(DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        Ok(Self {
            gate: parts.gate,
            xbc: parts.xbc,
            dt: parts.dt,
            out: parts.out,
            consts: Arc::new(DeltaNetConsts {
                shape,
                taps,
                dt_bias: parts.dt_bias,
                decay: parts.decay,
                norm: parts.norm,
                recurrence: Recurrence::Mamba2 {
                    skip: parts.skip,
                    conv_bias: parts.conv_bias,
                },
            }),
        })
    }
}

impl TokenMixer for Mamba2Weights {
    fn kind(&self) -> LayerMixer {
        LayerMixer::Mamba2(self.consts.shape)
    }

    fn storage(&self) -> LayerStorage {
        LayerStorage::Recurrent {
            row: self.consts.row_width(),
            state: self.consts.shape.state_len(),
        }
    }

    fn projections(&self) -> Vec<&Linear> {
        vec![&self.gate, &self.xbc, &self.dt, &self.out]
    }

    fn projections_mut(&mut self) -> Vec<&mut Linear> {
        vec![&mut self.gate, &mut self.xbc, &mut self.dt, &mut self.out]
    }

    fn forward_candle(
        &self,
        at: &CandleAt<'_>,
        h: &Tensor,
        kv: &mut PagedKvStore,
    ) -> Result<Tensor> {
        let host = |l: &Linear| DeltaNetConsts::host(l, h);
        let (xbc, z, dt) = (host(&self.xbc)?, host(&self.gate)?, host(&self.dt)?);
        let x = Projected {
            qkv: &xbc,
            z: &z,
            b: &[],
            a: &dt,
        };
        self.consts.run_candle(at, kv, &x, &self.out, h.device())
    }

    fn fused(&self) -> Result<Arc<dyn FusedMixer>> {
        let p = Projection::from_linear;
        Ok(Arc::new(FusedMamba2 {
            gate: p(&self.gate)?,
            xbc: p(&self.xbc)?,
            dt: p(&self.dt)?,
            out: p(&self.out)?,
            consts: self.consts.clone(),
        }))
    }

    fn clone_box(&self) -> Box<dyn TokenMixer> {
        Box::new(self.clone())
    }
}

/// Mamba-2 in the fused pass.
#[derive(Debug)]
struct FusedMamba2 {
    gate: Projection,
    xbc: Projection,
    dt: Projection,
    out: Projection,
    consts: Arc<DeltaNetConsts>,
}

impl FusedMixer for FusedMamba2 {
    fn projections(&self) -> Vec<&Projection> {
        vec![&self.gate, &self.xbc, &self.dt, &self.out]
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
                (&self.xbc, &mut w.q),
                (&self.gate, &mut w.k),
                (&self.dt, &mut w.normed),
            ],
            acts,
        )?;
        clock.lap(|p| &mut p.matmul);
        let x = Projected {
            qkv: &w.q,
            z: &w.k,
            b: &[],
            a: &w.normed,
        };
        self.consts
            .run_fused(at, kv, &x, &mut w.mixed, (&self.out, out), acts, clock)
    }
}
