//! A layer's MLP in the fused CPU pass: `FusedMlp` runs a gated MLP over some rows (gate and
//! up as one parallel product of activations quantized once, the activation computed row by
//! row as the down projection quantizes its input), and `FusedFfn` is a layer's dense MLP or
//! mixture. A mixture routes every row (`ExpertMlp::route`), groups the rows by the experts
//! they chose and runs each chosen expert once over all of its rows, so a step reads each
//! active expert's weights once however many of its rows chose it; the outputs are summed per
//! row in the order of the row's choices (`combine`), as the candle-ops forward sums them.

use std::sync::Arc;

use super::{add_shared, combine, DenseMlp, ExpertMlp, Routes};
use crate::cpu::qgemm::{matmul_quantized_all, matmul_quantized_each, Activations, QuantMatrix};
use crate::cpu::team::{self, Disjoint};
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

    /// Gate, up and down on thicket's kernel, unbiased, gate and up reading the same
    /// activations; `None` otherwise.
    fn packed(&self) -> Option<[Arc<QuantMatrix>; 3]> {
        let packed = |p: &Projection| match p {
            Projection::Packed { weight, bias: None } => Some(weight.clone()),
            _ => None,
        };
        let [gate, up, down] = [packed(&self.gate)?, packed(&self.up)?, packed(&self.down)?];
        gate.same_activations(&up).then_some([gate, up, down])
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
    /// Every expert's matrices on thicket's kernel, where they all are (unbiased, gate and up
    /// reading the same activations): then a step's chosen experts run their products side
    /// by side, one parallel loop for gate and up and one for down.
    packed: Option<Vec<[Arc<QuantMatrix>; 3]>>,
    shared: Option<FusedMlp>,
}

/// One chosen expert's buffers in a step.
#[derive(Debug, Default)]
struct ExpertRun {
    /// Its rows, gathered.
    x: Vec<f32>,
    acts: Activations,
    gate: Vec<f32>,
    up: Vec<f32>,
    /// Its outputs.
    y: Vec<f32>,
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
    /// Per chosen expert, where they run side by side.
    each: Vec<ExpertRun>,
    /// A mixture beside a dense MLP: the router's rows, the experts' rows, a norm's output.
    router_rows: Vec<f32>,
    expert_rows: Vec<f32>,
    normed: Vec<f32>,
}

impl FusedFfn {
    pub(crate) fn new(mlp: &super::Mlp) -> Result<Self> {
        Ok(match mlp {
            super::Mlp::Dense(mlp) => Self::Dense(FusedMlp::new(mlp)?),
            super::Mlp::Experts(moe) => {
                let experts: Vec<FusedMlp> = moe
                    .experts
                    .iter()
                    .map(FusedMlp::new)
                    .collect::<Result<_>>()?;
                let packed = experts.iter().map(FusedMlp::packed).collect();
                Self::Experts(Box::new(FusedExperts {
                    experts,
                    packed,
                    shared: moe
                        .shared
                        .as_ref()
                        .map(|s| FusedMlp::new(&s.mlp))
                        .transpose()?,
                    moe: (**moe).clone(),
                }))
            }
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

    /// The MLP of the `rows` rows of `h` (the layer's MLP norm of the residual `x`, which a
    /// mixture beside a dense MLP reads too), into `out`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn run(
        &self,
        x: &[f32],
        h: &[f32],
        rows: usize,
        act: Activation,
        b: &mut ExpertBuffers,
        acts: &mut Activations,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        match self {
            Self::Dense(mlp) => mlp.run(h, rows, act, &mut b.mlp, acts, out),
            Self::Experts(moe) => moe.run(x, h, rows, act, b, acts, out),
        }
    }
}

impl FusedExperts {
    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        x: &[f32],
        h: &[f32],
        rows: usize,
        act: Activation,
        b: &mut ExpertBuffers,
        acts: &mut Activations,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let mut expert_rows = std::mem::take(&mut b.expert_rows);
        let (routes, inputs) = match &self.moe.beside {
            Some(beside) => {
                beside.inputs(x, &mut b.router_rows, &mut expert_rows);
                let mut routes = self.moe.route(&b.router_rows);
                beside.scale_routes(&mut routes);
                (routes, expert_rows.as_slice())
            }
            None => (self.moe.route(h), h),
        };
        let result = self.run_routed(&routes, inputs, h, (rows, act), b, acts, out);
        b.expert_rows = expert_rows;
        result
    }

    /// The experts `routes` chose over their rows of `inputs`, combined into `out`, and the
    /// shared expert over `h`.
    #[allow(clippy::too_many_arguments)]
    fn run_routed(
        &self,
        routes: &Routes,
        inputs: &[f32],
        h: &[f32],
        (rows, act): (usize, Activation),
        b: &mut ExpertBuffers,
        acts: &mut Activations,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let hidden = self.moe.hidden();
        let h_experts = inputs;
        b.chosen.resize(rows * routes.top_k * hidden, 0.0);
        let groups = routes.by_expert(self.experts.len());
        if let Some(packed) = &self.packed {
            side_by_side(packed, h_experts, hidden, &groups, routes.top_k, act, b)?;
        } else {
            for (expert, group) in groups.iter().enumerate() {
                if group.is_empty() {
                    continue;
                }
                b.x.clear();
                for &(r, _) in group {
                    b.x.extend_from_slice(&h_experts[r * hidden..(r + 1) * hidden]);
                }
                self.experts[expert].run(&b.x, group.len(), act, &mut b.mlp, acts, &mut b.y)?;
                scatter(group, &b.y, hidden, routes.top_k, &mut b.chosen);
            }
        }
        combine(routes, &b.chosen, hidden, out);
        if let (Some(mlp), Some(shared)) = (&self.shared, &self.moe.shared) {
            mlp.run(h, rows, act, &mut b.mlp, acts, &mut b.y)?;
            match &self.moe.beside {
                Some(beside) => beside.outputs(out, &b.y, &mut b.normed),
                None => add_shared(h, &b.y, shared.gate.as_deref(), out),
            }
        }
        Ok(())
    }
}

/// Copies one expert's outputs (`y`, one row per entry of `group`) to their rows' places in
/// `chosen` (`[rows][top_k][hidden]`).
fn scatter(group: &[(usize, usize)], y: &[f32], hidden: usize, top_k: usize, chosen: &mut [f32]) {
    for (i, &(r, choice)) in group.iter().enumerate() {
        let at = (r * top_k + choice) * hidden;
        chosen[at..at + hidden].copy_from_slice(&y[i * hidden..(i + 1) * hidden]);
    }
}

/// The chosen experts' MLPs side by side: each expert's rows gathered and quantized, then
/// every chosen expert's gate and up in one parallel loop, the activation computed row by row
/// as each down projection quantizes its input, and every down product in one more loop.
/// Each value is what the expert's own `FusedMlp::run` computes.
fn side_by_side(
    packed: &[[Arc<QuantMatrix>; 3]],
    h: &[f32],
    hidden: usize,
    groups: &[Vec<(usize, usize)>],
    top_k: usize,
    act: Activation,
    b: &mut ExpertBuffers,
) -> Result<()> {
    let active: Vec<usize> = (0..groups.len())
        .filter(|&e| !groups[e].is_empty())
        .collect();
    if b.each.len() < active.len() {
        b.each.resize_with(active.len(), ExpertRun::default);
    }
    let runs = &mut b.each[..active.len()];
    // Each expert's rows gathered and quantized, the experts spread over the team.
    each_run(runs, |i, run| {
        let e = active[i];
        run.x.clear();
        for &(r, _) in &groups[e] {
            run.x.extend_from_slice(&h[r * hidden..(r + 1) * hidden]);
        }
        packed[e][0].quantize(&run.x, &mut run.acts);
    });
    matmul_quantized_each(runs.iter_mut().zip(&active).flat_map(|(run, &e)| {
        let ExpertRun { acts, gate, up, .. } = run;
        let acts = &*acts;
        [(acts, &*packed[e][0], gate), (acts, &*packed[e][1], up)]
    }))?;
    each_run(runs, |i, run| {
        let e = active[i];
        let down = &packed[e][2];
        let ExpertRun { acts, gate, up, .. } = run;
        let k = down.cols();
        down.quantize_rows(groups[e].len(), acts, |r, row| {
            let at = r * k..(r + 1) * k;
            crate::cpu::silu::gated_into(act, &gate[at.clone()], &up[at], row)
        });
    });
    matmul_quantized_each(
        runs.iter_mut()
            .zip(&active)
            .map(|(run, &e)| (&run.acts, &*packed[e][2], &mut run.y)),
    )?;
    // Each expert's outputs to their rows' places: every `(row, choice)` is one expert's.
    let chosen = Disjoint::new(&mut b.chosen);
    each_run(runs, |i, run| {
        for (j, &(r, choice)) in groups[active[i]].iter().enumerate() {
            // SAFETY: `(r, choice)` names one place, routed to one expert alone, inside
            // `chosen` (sized for every row's choices), which outlives the loop.
            let place = unsafe { chosen.run((r * top_k + choice) * hidden, hidden) };
            place.copy_from_slice(&run.y[j * hidden..(j + 1) * hidden]);
        }
    });
    Ok(())
}

/// `f(i, run)` for each of `runs`, spread over the forward's team.
fn each_run(runs: &mut [ExpertRun], f: impl Fn(usize, &mut ExpertRun) + Sync) {
    let count = runs.len();
    let all = Disjoint::new(runs);
    team::for_each(count, |i| {
        // SAFETY: task `i` alone reaches run `i`, inside `runs`, which outlives the loop.
        f(i, &mut unsafe { all.run(i, 1) }[0])
    });
}
