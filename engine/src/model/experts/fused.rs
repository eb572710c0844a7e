//! A layer's MLP in the fused CPU pass: `FusedMlp` runs a gated MLP over some rows (gate and
//! up as one parallel product of activations quantized once, the activation computed row by
//! row as the down projection quantizes its input), and `FusedFfn` is a layer's dense MLP or
//! mixture. A mixture routes every row (`ExpertMlp::route`), groups the rows by the experts
//! they chose and runs each chosen expert once over all of its rows, so a step reads each
//! active expert's weights once however many of its rows chose it; the outputs are summed per
//! row in the order of the row's choices (`combine`), as the candle-ops forward sums them.

use super::{add_shared, combine, DenseMlp, ExpertMlp, Routes};
use crate::cpu::qgemm::{matmul_quantized_all, Activations};
use crate::model::config::Activation;
use crate::model::projection::{add_bias, project, Projection};
use crate::Result;

/// A gated MLP's projections as the fused pass runs them.
#[derive(Debug, Clone)]
pub(crate) struct FusedMlp {
    gate: Projection,
    up: Projection,
    down: Projection,
}

/// Buffers of one MLP's run, reused.
#[derive(Debug, Default)]
pub(crate) struct MlpBuffers {
    gate: Vec<f32>,
    up: Vec<f32>,
}

impl FusedMlp {
    pub(crate) fn new(mlp: &DenseMlp) -> Result<Self> {
        Ok(Self {
            gate: Projection::from_linear(&mlp.gate)?,
            up: Projection::from_linear(&mlp.up)?,
            down: Projection::from_linear(&mlp.down)?,
        })
    }

    fn projections(&self) -> [&Projection; 3] {
        [&self.gate, &self.up, &self.down]
    }

    /// `down(act(gate(x)) * up(x))` for the `rows` rows of `x`, into `out`.
    pub(crate) fn run(
        &self,
        x: &[f32],
        rows: usize,
        act: Activation,
        b: &mut MlpBuffers,
        acts: &mut Activations,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        project(
            x,
            rows,
            &mut [(&self.gate, &mut b.gate), (&self.up, &mut b.up)],
            acts,
        )?;
        if let Projection::Packed { weight, bias } = &self.down {
            // The gated activation row by row as the down projection quantizes its input,
            // in one row-parallel pass.
            let (gate, up, k) = (&b.gate, &b.up, weight.cols());
            weight.quantize_rows(rows, acts, |r, row| {
                let at = r * k..(r + 1) * k;
                crate::cpu::silu::gated_into(act, &gate[at.clone()], &up[at], row)
            });
            matmul_quantized_all(acts, [(&**weight, &mut *out)])?;
            add_bias(bias, out);
        } else {
            crate::cpu::silu::gated(act, &mut b.gate, &b.up);
            project(&b.gate, rows, &mut [(&self.down, out)], acts)?;
        }
        Ok(())
    }
}

/// A mixture of experts as the fused pass runs it.
#[derive(Debug, Clone)]
pub(crate) struct FusedExperts {
    /// The router and routing options (its experts' weights are shared with `experts`).
    moe: ExpertMlp,
    experts: Vec<FusedMlp>,
    shared: Option<FusedMlp>,
}

/// A layer's MLP as the fused pass runs it.
#[derive(Debug, Clone)]
pub(crate) enum FusedFfn {
    Dense(FusedMlp),
    Experts(Box<FusedExperts>),
}

/// Buffers of a mixture's run, reused.
#[derive(Debug, Default)]
pub(crate) struct ExpertBuffers {
    mlp: MlpBuffers,
    /// One expert's rows, gathered.
    x: Vec<f32>,
    /// One expert's outputs.
    y: Vec<f32>,
    /// `[rows][top_k][hidden]`: every row's chosen experts' outputs.
    chosen: Vec<f32>,
}

impl FusedFfn {
    pub(crate) fn new(mlp: &super::Mlp) -> Result<Self> {
        Ok(match mlp {
            super::Mlp::Dense(mlp) => Self::Dense(FusedMlp::new(mlp)?),
            super::Mlp::Experts(moe) => Self::Experts(Box::new(FusedExperts {
                experts: moe
                    .experts
                    .iter()
                    .map(FusedMlp::new)
                    .collect::<Result<_>>()?,
                shared: moe
                    .shared
                    .as_ref()
                    .map(|s| FusedMlp::new(&s.mlp))
                    .transpose()?,
                moe: (**moe).clone(),
            })),
        })
    }

    /// Every projection.
    pub(crate) fn projections(&self) -> Vec<&Projection> {
        match self {
            Self::Dense(mlp) => mlp.projections().to_vec(),
            Self::Experts(moe) => moe
                .experts
                .iter()
                .chain(&moe.shared)
                .flat_map(FusedMlp::projections)
                .collect(),
        }
    }

    /// The MLP of the `rows` rows of `h`, into `out`.
    pub(crate) fn run(
        &self,
        h: &[f32],
        rows: usize,
        act: Activation,
        b: &mut ExpertBuffers,
        acts: &mut Activations,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        match self {
            Self::Dense(mlp) => mlp.run(h, rows, act, &mut b.mlp, acts, out),
            Self::Experts(moe) => moe.run(h, rows, act, b, acts, out),
        }
    }
}

impl FusedExperts {
    fn run(
        &self,
        h: &[f32],
        rows: usize,
        act: Activation,
        b: &mut ExpertBuffers,
        acts: &mut Activations,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let hidden = self.moe.hidden();
        let routes: Routes = self.moe.route(h);
        b.chosen.resize(rows * routes.top_k * hidden, 0.0);
        for (expert, group) in routes.by_expert(self.experts.len()).iter().enumerate() {
            if group.is_empty() {
                continue;
            }
            b.x.clear();
            for &(r, _) in group {
                b.x.extend_from_slice(&h[r * hidden..(r + 1) * hidden]);
            }
            self.experts[expert].run(&b.x, group.len(), act, &mut b.mlp, acts, &mut b.y)?;
            for (i, &(r, choice)) in group.iter().enumerate() {
                let at = (r * routes.top_k + choice) * hidden;
                b.chosen[at..at + hidden].copy_from_slice(&b.y[i * hidden..(i + 1) * hidden]);
            }
        }
        combine(&routes, &b.chosen, hidden, out);
        if let (Some(mlp), Some(shared)) = (&self.shared, &self.moe.shared) {
            mlp.run(h, rows, act, &mut b.mlp, acts, &mut b.y)?;
            add_shared(h, &b.y, &shared.gate, out);
        }
        Ok(())
    }
}
