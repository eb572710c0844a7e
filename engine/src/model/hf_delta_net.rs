//! A Gated DeltaNet layer's tensors from an HF checkpoint as transformers names them
//! (Qwen3.5 / Qwen3.6: `linear_attn.in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`,
//! `conv1d`, `dt_bias`, `A_log`, `norm`, `out_proj`), its value heads grouped by key head as
//! transformers has them; Qwen3-Next's fused projections dealt into the same four
//! (`in_proj_qkvz`: per key head its query, its key, its value heads' values and their gates;
//! `in_proj_ba`: per key head its value heads' `beta` rows, then their `alpha` rows); and a
//! gated attention's query projection dealt into the queries and their gates.

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
    let fused = match load(&format!("{a}.in_proj_qkvz.weight")) {
        Ok(qkvz) => Some(dealt(
            &a,
            shape,
            &qkvz,
            &load(&format!("{a}.in_proj_ba.weight"))?,
        )?),
        Err(_) => None,
    };
    let proj = |name: &str, role: Role| -> Result<Linear> {
        let full = format!("{a}.{name}.weight");
        let w = match (&fused, name) {
            (Some(f), "in_proj_qkv") => f[0].clone(),
            (Some(f), "in_proj_z") => f[1].clone(),
            (Some(f), "in_proj_b") => f[2].clone(),
            (Some(f), "in_proj_a") => f[3].clone(),
            _ => load(&full)?,
        };
        shapes.check(&full, role, w.dims())?;
        Linear::from_dense(w, None, dtype)
    };
    let vector = |name: &str, len: usize| f32_vector(load, &format!("{a}.{name}"), len);
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

/// Tensor `full` from `load` as `len` f32 values, whatever its shape.
pub(crate) fn f32_vector(
    load: &dyn Fn(&str) -> Result<Tensor>,
    full: &str,
    len: usize,
) -> Result<Vec<f32>> {
    let values = load(full)?
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
}

/// Qwen3-Next's `in_proj_qkvz` and `in_proj_ba` (of layer `a`) dealt into the queries, keys
/// and values (all queries, then all keys, then the values grouped by key head), the gates,
/// `beta` and `alpha`.
fn dealt(a: &str, shape: DeltaNetShape, qkvz: &Tensor, ba: &Tensor) -> Result<[Tensor; 4]> {
    let (nk, dk, dv) = (shape.key_heads, shape.key_dim, shape.value_dim);
    let r = shape.value_heads / nk.max(1);
    let group = 2 * dk + 2 * r * dv;
    let (rows, _) = qkvz.dims2()?;
    let (ba_rows, _) = ba.dims2()?;
    if rows != nk * group || ba_rows != 2 * shape.value_heads {
        return Err(Error::Metadata(format!(
            "{a}: in_proj_qkvz of {rows} rows and in_proj_ba of {ba_rows} for {nk} key heads \
             of {dk} and {} value heads of {dv}",
            shape.value_heads
        )));
    }
    let pick = |t: &Tensor, of: &dyn Fn(usize) -> std::ops::Range<usize>| -> Result<Tensor> {
        let index: Vec<u32> = (0..nk).flat_map(of).map(|x| x as u32).collect();
        let index = Tensor::new(index.as_slice(), t.device())?;
        Ok(t.index_select(&index, 0)?.contiguous()?)
    };
    let q = pick(qkvz, &|k| k * group..k * group + dk)?;
    let key = pick(qkvz, &|k| k * group + dk..k * group + 2 * dk)?;
    let v = pick(qkvz, &|k| k * group + 2 * dk..k * group + 2 * dk + r * dv)?;
    let z = pick(qkvz, &|k| k * group + 2 * dk + r * dv..(k + 1) * group)?;
    let b = pick(ba, &|k| 2 * r * k..2 * r * k + r)?;
    let alpha = pick(ba, &|k| 2 * r * k + r..2 * r * (k + 1))?;
    Ok([Tensor::cat(&[q, key, v], 0)?, z, b, alpha])
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
