//! A Gated DeltaNet layer's tensors from an HF checkpoint as transformers names them
//! (Qwen3.5 / Qwen3.6: `linear_attn.in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`,
//! `conv1d`, `dt_bias`, `A_log`, `norm`, `out_proj`), its value heads grouped by key head as
//! transformers has them; and a gated attention's query projection dealt into the queries and
//! their gates. Qwen3-Next's fused HF projections (`in_proj_qkvz`, `in_proj_ba`) are refused by
//! name.

use candle_core::{DType, Tensor};

use crate::model::config::DeltaNetShape;
use crate::model::linear::Linear;
use crate::model::mixer::DeltaNetParts;
use crate::model::shapes::{Role, Shapes};
use crate::{Error, Result};

/// Layer `p`'s (`...layers.N`) Gated DeltaNet from `load` (a tensor by its full name).
pub(crate) fn delta_net_parts(
    p: &str,
    shape: DeltaNetShape,
    shapes: &Shapes,
    load: &dyn Fn(&str) -> Result<Tensor>,
    dtype: Option<DType>,
) -> Result<DeltaNetParts> {
    let a = format!("{p}.linear_attn");
    if load(&format!("{a}.in_proj_qkvz.weight")).is_ok() {
        return Err(Error::Metadata(format!(
            "{a}.in_proj_qkvz: Qwen3-Next's fused projections are not supported from an HF \
             checkpoint (its GGUF files are)"
        )));
    }
    let proj = |name: &str, role: Role| -> Result<Linear> {
        let full = format!("{a}.{name}.weight");
        let w = load(&full)?;
        shapes.check(&full, role, w.dims())?;
        Linear::from_dense(w, None, dtype)
    };
    let vector = |name: &str, len: usize| -> Result<Vec<f32>> {
        let full = format!("{a}.{name}");
        let values = load(&full)?
            .to_dtype(DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        if values.len() != len {
            return Err(Error::Metadata(format!(
                "tensor {full} has {} values, {len} expected",
                values.len()
            )));
        }
        Ok(values)
    };
    let heads = shape.value_heads;
    // transformers keeps `A_log`; the decay factor is `-exp(A_log)`.
    let decay = vector("A_log", heads)?
        .into_iter()
        .map(|x| -x.exp())
        .collect();
    Ok(DeltaNetParts {
        qkv: proj("in_proj_qkv", Role::DeltaQkv)?,
        gate: proj("in_proj_z", Role::DeltaGate)?,
        beta: proj("in_proj_b", Role::DeltaHeads)?,
        alpha: proj("in_proj_a", Role::DeltaHeads)?,
        conv: load(&format!("{a}.conv1d.weight"))?.to_dtype(DType::F32)?,
        dt_bias: vector("dt_bias", heads)?,
        decay,
        norm: vector("norm.weight", shape.value_dim)?,
        out: proj("out_proj", Role::DeltaOut)?,
    })
}

/// A gated attention's query projection (`[heads * 2 * head_dim, hidden]`: each head's query
/// then its gate) as the queries and the gates.
pub(crate) fn deal_dense(t: &Tensor, head_dim: usize) -> Result<[Tensor; 2]> {
    let (rows, cols) = t.dims2()?;
    if head_dim == 0 || !rows.is_multiple_of(2 * head_dim) {
        return Err(Error::Metadata(format!(
            "a gated query projection of {rows} rows does not deal into heads of {head_dim}"
        )));
    }
    let heads = rows / (2 * head_dim);
    let per_head = t.reshape((heads, 2, head_dim, cols))?;
    let part = |i: usize| -> Result<Tensor> {
        Ok(per_head
            .narrow(1, i, 1)?
            .reshape((heads * head_dim, cols))?
            .contiguous()?)
    };
    Ok([part(0)?, part(1)?])
}
