//! Per-layer embeddings (Gemma 4's E2B and E4B) and each block's output scale. A second
//! table gives every token a `width`-wide input for every layer, to which a projection of the
//! token's scaled embedding is added: `ple = (norm(x @ P * hidden^-1/2) + table[id] *
//! sqrt(width)) / sqrt(2)`, the norm over each layer's `width` values with one shared weight.
//! After its MLP, each block adds `norm(gelu(x @ gate) * ple[layer]) @ proj)` to the residual
//! and then multiplies the whole residual by its scalar, as llama.cpp and transformers compute
//! them. The candle-ops forward and the fused pass run the same steps (`inputs_candle` /
//! `inputs_fused`, `apply_candle` / `apply_fused`), so their bits agree.

use candle_core::{Device, Tensor};

use crate::cpu::qgemm::Activations;
use crate::model::config::Activation;
use crate::model::embedding::Embedding;
use crate::model::fused_rows::{add_into, rms_norm};
use crate::model::linear::Linear;
use crate::model::projection::{project, Projection};
use crate::Result;

/// The model-wide part: the table and the projection of the embedding.
#[derive(Debug, Clone)]
pub struct PerLayerEmbedding {
    /// `[vocab, layers * width]`.
    pub table: Embedding,
    /// `[layers * width, hidden]`: the scaled embedding's share.
    pub projection: Linear,
    /// `[width]`: the norm of each layer's share of the projection.
    pub norm: Tensor,
    /// Values per layer.
    pub width: usize,
}

/// One block's part.
#[derive(Debug, Clone)]
pub struct PerLayerInput {
    /// `[width, hidden]`: the gate over the residual.
    pub gate: Linear,
    /// `[hidden, width]`: back to the residual.
    pub projection: Linear,
    /// `[hidden]`: the norm of what is added.
    pub norm: Tensor,
}

/// The fused pass's form of the model-wide part.
#[derive(Debug, Clone)]
pub(crate) struct FusedPerLayer {
    table: Embedding,
    projection: Projection,
    norm: Vec<f32>,
    width: usize,
}

/// The fused pass's form of one block's part.
#[derive(Debug, Clone)]
pub(crate) struct FusedLayerInput {
    gate: Projection,
    projection: Projection,
    norm: Vec<f32>,
}

/// Reusable buffers of the fused pass.
#[derive(Default)]
pub(crate) struct PerLayerBuffers {
    /// `[rows][layers * width]`: every row's inputs for every layer.
    pub(super) inputs: Vec<f32>,
    gate: Vec<f32>,
    mine: Vec<f32>,
    out: Vec<f32>,
    normed: Vec<f32>,
}

/// `sqrt(width)`, `hidden^-1/2` and `2^-1/2` as f32, the factors of the inputs.
fn factors(width: usize, hidden: usize) -> (f32, f32, f32) {
    (
        (width as f32).sqrt(),
        1.0 / (hidden as f32).sqrt(),
        std::f32::consts::FRAC_1_SQRT_2,
    )
}

impl PerLayerEmbedding {
    /// Every row's inputs for every layer, `[rows, layers * width]`, from the token ids and
    /// the scaled embedding rows `x`, as candle ops.
    pub(crate) fn inputs_candle(
        &self,
        ids: &[u32],
        x: &Tensor,
        eps: f32,
        device: &Device,
    ) -> Result<Tensor> {
        let (rows, hidden) = x.dims2()?;
        let (up, down, half) = factors(self.width, hidden);
        let tokens = (self.table.lookup(ids, device)? * f64::from(up))?;
        let projected = (self.projection.forward(x)? * f64::from(down))?;
        let all = projected.dim(1)?;
        let per_layer = projected.reshape((rows * all / self.width, self.width))?;
        let normed = candle_nn::ops::rms_norm(&per_layer, &self.norm, eps)?.reshape((rows, all))?;
        Ok(((normed + tokens)? * f64::from(half))?)
    }

    /// The fused pass's form.
    pub(crate) fn fused(&self) -> Result<FusedPerLayer> {
        Ok(FusedPerLayer {
            table: self.table.clone(),
            projection: Projection::from_linear(&self.projection)?,
            norm: crate::model::fused_pass::host_values(&self.norm)?,
            width: self.width,
        })
    }
}

impl FusedPerLayer {
    /// `inputs_candle` on the host: into `b.inputs`.
    pub(crate) fn inputs_fused(
        &self,
        ids: &[u32],
        x: &[f32],
        (hidden, eps): (usize, f32),
        b: &mut PerLayerBuffers,
        acts: &mut Activations,
    ) -> Result<()> {
        let rows = ids.len();
        let (up, down, half) = factors(self.width, hidden);
        self.table.rows_into(ids, &mut b.normed)?;
        for v in &mut b.normed {
            *v *= up;
        }
        project(x, rows, &mut [(&self.projection, &mut b.out)], acts)?;
        for v in &mut b.out {
            *v *= down;
        }
        b.inputs.resize(b.out.len(), 0.0);
        rms_norm(&b.out, &self.norm, eps, &mut b.inputs);
        for (v, t) in b.inputs.iter_mut().zip(&b.normed) {
            *v = (*v + *t) * half;
        }
        Ok(())
    }

    /// Values per layer.
    pub(crate) fn width(&self) -> usize {
        self.width
    }

    /// The embedding's projection.
    pub(crate) fn projection(&self) -> &Projection {
        &self.projection
    }
}

impl PerLayerInput {
    /// The block's addition to the residual `x` (`[rows, hidden]`) from its inputs
    /// `mine` (`[rows, width]`), as candle ops; `gated` is the model's GELU times.
    pub(crate) fn apply_candle(
        &self,
        x: &Tensor,
        mine: &Tensor,
        eps: f32,
        gated: &dyn Fn(&Tensor, &Tensor) -> Result<Tensor>,
    ) -> Result<Tensor> {
        let g = gated(&self.gate.forward(x)?, mine)?;
        let out = self.projection.forward(&g)?;
        Ok((candle_nn::ops::rms_norm(&out, &self.norm, eps)? + x)?)
    }

    /// The fused pass's form.
    pub(crate) fn fused(&self) -> Result<FusedLayerInput> {
        Ok(FusedLayerInput {
            gate: Projection::from_linear(&self.gate)?,
            projection: Projection::from_linear(&self.projection)?,
            norm: crate::model::fused_pass::host_values(&self.norm)?,
        })
    }
}

impl FusedLayerInput {
    /// Both projections.
    pub(crate) fn projections(&self) -> [&Projection; 2] {
        [&self.gate, &self.projection]
    }

    /// `apply_candle` on the host, for layer `layer` of `width`-wide inputs in `b.inputs`.
    pub(crate) fn apply_fused(
        &self,
        x: &mut [f32],
        (layer, width, eps): (usize, usize, f32),
        b: &mut PerLayerBuffers,
        acts: &mut Activations,
    ) -> Result<()> {
        let hidden = self.norm.len();
        let rows = x.len() / hidden.max(1);
        let all = b.inputs.len() / rows.max(1);
        b.mine.clear();
        for r in 0..rows {
            let at = r * all + layer * width;
            b.mine.extend_from_slice(&b.inputs[at..at + width]);
        }
        project(x, rows, &mut [(&self.gate, &mut b.gate)], acts)?;
        crate::cpu::silu::gated(Activation::GeluTanh, &mut b.gate, &b.mine);
        project(&b.gate, rows, &mut [(&self.projection, &mut b.out)], acts)?;
        b.normed.resize(b.out.len(), 0.0);
        rms_norm(&b.out, &self.norm, eps, &mut b.normed);
        add_into(&b.normed, x);
        Ok(())
    }
}
