//! A mixture of experts as candle ops, on any device: the forward the fused pass's experts
//! are tested against bit for bit on the CPU, and the path of off-CPU weights. The routes are
//! computed on the host from the rows' values (`ExpertMlp::route`); each chosen expert runs
//! once over the rows that chose it (gathered with `index_select`), and the outputs are summed
//! per row on the host in the order of the row's choices (`combine`).

use candle_core::Tensor;

use super::{add_shared, combine, DenseMlp, ExpertMlp};
use crate::Result;

/// `down(act(gate(x)) * up(x))` as candle ops, `act(gate) * up` as the caller computes it
/// (`gated(gate, up)`).
pub(crate) fn mlp(
    mlp: &DenseMlp,
    x: &Tensor,
    gated: &dyn Fn(&Tensor, &Tensor) -> Result<Tensor>,
) -> Result<Tensor> {
    let inner = gated(&mlp.gate.forward(x)?, &mlp.up.forward(x)?)?;
    mlp.down.forward(&inner)
}

impl ExpertMlp {
    /// The mixture's output for each row of `h` (`[rows, hidden]`, the layer's MLP norm of
    /// the residual `x`, which a mixture beside a dense MLP reads too).
    pub(crate) fn forward_candle(
        &self,
        x: &Tensor,
        h: &Tensor,
        gated: &dyn Fn(&Tensor, &Tensor) -> Result<Tensor>,
    ) -> Result<Tensor> {
        let (rows, hidden) = h.dims2()?;
        let host = h.flatten_all()?.to_vec1::<f32>()?;
        let (mut router_rows, mut expert_rows) = (Vec::new(), Vec::new());
        let (routed, inputs) = match &self.beside {
            Some(beside) => {
                let residual = x.flatten_all()?.to_vec1::<f32>()?;
                beside.inputs(&residual, &mut router_rows, &mut expert_rows);
                let inputs = Tensor::from_slice(&expert_rows, (rows, hidden), h.device())?;
                (router_rows.as_slice(), inputs)
            }
            None => (host.as_slice(), h.clone()),
        };
        let mut routes = self.route(routed);
        if let Some(beside) = &self.beside {
            beside.scale_routes(&mut routes);
        }
        let mut chosen = vec![0f32; rows * routes.top_k * hidden];
        for (expert, group) in routes.by_expert(self.experts.len()).iter().enumerate() {
            if group.is_empty() {
                continue;
            }
            let picked: Vec<u32> = group.iter().map(|&(r, _)| r as u32).collect();
            let picked = Tensor::new(picked.as_slice(), h.device())?;
            let x = inputs.index_select(&picked, 0)?;
            let y = mlp(&self.experts[expert], &x, gated)?;
            let y = y.flatten_all()?.to_vec1::<f32>()?;
            for (i, &(r, choice)) in group.iter().enumerate() {
                let at = (r * routes.top_k + choice) * hidden;
                chosen[at..at + hidden].copy_from_slice(&y[i * hidden..(i + 1) * hidden]);
            }
        }
        let mut out = Vec::new();
        combine(&routes, &chosen, hidden, &mut out);
        if let Some(shared) = &self.shared {
            let y = mlp(&shared.mlp, h, gated)?
                .flatten_all()?
                .to_vec1::<f32>()?;
            match &self.beside {
                Some(beside) => beside.outputs(&mut out, &y, &mut Vec::new()),
                None => add_shared(&host, &y, shared.gate.as_deref(), &mut out),
            }
        }
        Ok(Tensor::from_vec(out, (rows, hidden), h.device())?)
    }
}
