//! Attention over an earlier layer's keys and values (Gemma 4's last layers): the layer
//! projects and norms its queries, rotates them with its table, and attends over the keys and
//! values the named layer wrote at the same slots, writing none of its own (so the paged store
//! holds nothing for it, and the prefix cache, tree verification and compaction need nothing
//! beyond what the source layer keeps). Its queries' shape, scale and window are the source
//! layer's kind's. The candle-ops form and the fused form repeat the same arithmetic.

use std::sync::Arc;

use candle_core::Tensor;

use super::attention::{attend, head_norm, head_shape};
use super::{CandleAt, FusedAt, FusedMixer, MixerBuffers, TokenMixer};
use crate::cpu::attention::paged_tree_attention;
use crate::cpu::kv_store::{LayerStorage, PagedKvStore};
use crate::cpu::qgemm::Activations;
use crate::model::config::LayerMixer;
use crate::model::fused_pass::{host_values, Clock};
use crate::model::fused_rows::{rms_norm, rotate};
use crate::model::linear::Linear;
use crate::model::projection::{project, Projection};
use crate::Result;

/// One layer's weights when it reads another layer's keys and values.
#[derive(Debug, Clone)]
pub struct SharedKvAttention {
    /// The layer whose keys and values it reads.
    pub source: usize,
    /// Per-head RMSNorm of the queries before RoPE, where the family norms them.
    pub q_norm: Option<Tensor>,
    /// Query projection.
    pub q: Linear,
    /// Output projection.
    pub o: Linear,
}

impl TokenMixer for SharedKvAttention {
    fn kind(&self) -> LayerMixer {
        LayerMixer::Attention
    }

    fn storage(&self) -> LayerStorage {
        LayerStorage::Shared(self.source)
    }

    fn projections(&self) -> Vec<&Linear> {
        vec![&self.q, &self.o]
    }

    fn projections_mut(&mut self) -> Vec<&mut Linear> {
        vec![&mut self.q, &mut self.o]
    }

    fn forward_candle(
        &self,
        at: &CandleAt<'_>,
        h: &Tensor,
        kv: &mut PagedKvStore,
    ) -> Result<Tensor> {
        let cfg = at.model.config();
        let (cos, sin) = at.rope;
        let head_dim = cfg.layer_heads(at.index).1;
        let mut q = self.q.forward(h)?;
        if let Some(q_norm) = &self.q_norm {
            q = head_norm(&q, q_norm, head_dim, cfg.rms_norm_eps as f32)?;
        }
        let rotary = cfg.layer_rotary(at.index);
        let q = at.model.rotate(&q, cfg.num_heads, rotary, cos, sin)?;
        let attn = attend(at, &q, kv, head_shape(cfg, at.index, None))?;
        self.o.forward(&attn)
    }

    fn fused(&self) -> Result<Arc<dyn FusedMixer>> {
        Ok(Arc::new(FusedShared {
            q_norm: self.q_norm.as_ref().map(host_values).transpose()?,
            q: Projection::from_linear(&self.q)?,
            o: Projection::from_linear(&self.o)?,
        }))
    }

    fn clone_box(&self) -> Box<dyn TokenMixer> {
        Box::new(self.clone())
    }
}

/// The same in the fused pass.
#[derive(Debug)]
struct FusedShared {
    q_norm: Option<Vec<f32>>,
    q: Projection,
    o: Projection,
}

impl FusedMixer for FusedShared {
    fn projections(&self) -> Vec<&Projection> {
        vec![&self.q, &self.o]
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
        project(h, rows, &mut [(&self.q, &mut w.q)], acts)?;
        clock.lap(|p| &mut p.matmul);
        if let Some(q_norm) = &self.q_norm {
            w.normed.resize(w.q.len(), 0.0);
            rms_norm(&w.q, q_norm, cfg.rms_norm_eps as f32, &mut w.normed);
            std::mem::swap(&mut w.q, &mut w.normed);
        }
        let rotary = cfg.layer_rotary(at.index);
        let positions = &at.batch.positions;
        rotate(
            rotary,
            at.table,
            positions,
            &w.q,
            cfg.num_heads,
            &mut w.q_heads,
            true,
        );
        clock.lap(|p| &mut p.other);
        let shape = head_shape(cfg, at.index, None);
        let attn = paged_tree_attention(&w.q_heads, kv.layer(at.index), at.seen, shape);
        clock.lap(|p| &mut p.attention);
        project(&attn, rows, &mut [(&self.o, out)], acts)?;
        clock.lap(|p| &mut p.matmul);
        Ok(())
    }
}
