//! A Gated DeltaNet layer's tensors from a GGUF file, in the layouts llama.cpp's converters
//! write: Qwen3.5's (`attn_qkv`, `attn_gate`, `ssm_beta`, `ssm_alpha`) and Qwen3-Next's, whose
//! `beta` and `alpha` come in one tensor (`ssm_ba`, per key head the `beta` rows of its value
//! heads then their `alpha` rows) and whose first converter fused the queries, keys, values
//! and output gate into `ssm_in` (per key head: its query, its key, its value heads' values,
//! their gates), dealt here into the layout the layer reads. Every projection is checked
//! against the shape the file's metadata implies.

use crate::model::config::DeltaNetShape;
use crate::model::experts::load::GgufTensors;
use crate::model::linear::Linear;
use crate::model::mixer::DeltaNetParts;
use crate::model::shapes::{deal_quantized, gather_quantized, Role, Shapes};
use crate::{Error, Result};

impl GgufTensors<'_> {
    /// Layer `p`'s (`blk.N`) Gated DeltaNet tensors.
    pub(crate) fn delta_net(
        &self,
        p: &str,
        shape: DeltaNetShape,
        shapes: &Shapes,
    ) -> Result<DeltaNetParts> {
        let name = |n: &str| format!("{p}.{n}.weight");
        let checked = |n: &str, role: Role| -> Result<Linear> {
            let full = name(n);
            let weight = (self.read)(&full)?;
            shapes.check(&full, role, weight.shape().dims())?;
            self.linear(weight)
        };
        let vector = |n: &str, len: usize| self.vector(&format!("{p}.{n}"), len);
        let heads = shape.value_heads;
        let per_key = heads / shape.key_heads.max(1);
        let (beta, alpha) = match (self.has)(&name("ssm_ba")) {
            true => {
                let weight = (self.read)(&name("ssm_ba"))?;
                let [beta, alpha] = deal_quantized(&weight, per_key)?;
                (self.linear(beta)?, self.linear(alpha)?)
            }
            false => (
                checked("ssm_beta", Role::DeltaHeads)?,
                checked("ssm_alpha", Role::DeltaHeads)?,
            ),
        };
        let (qkv, gate) = match (self.has)(&name("attn_qkv")) {
            true => (
                checked("attn_qkv", Role::DeltaQkv)?,
                checked("attn_gate", Role::DeltaGate)?,
            ),
            false => self.fused_qkvz(&name("ssm_in"), shape)?,
        };
        Ok(DeltaNetParts {
            qkv,
            gate,
            beta,
            alpha,
            conv: self.dense(&name("ssm_conv1d"))?,
            dt_bias: vector("ssm_dt.bias", heads)?,
            decay: vector("ssm_a", heads)?,
            norm: vector("ssm_norm.weight", shape.value_dim)?,
            out: checked("ssm_out", Role::DeltaOut)?,
        })
    }

    /// Tensor `full` as `len` f32 values, whatever its shape.
    pub(crate) fn vector(&self, full: &str, len: usize) -> Result<Vec<f32>> {
        let values = self.dense(full)?.flatten_all()?.to_vec1::<f32>()?;
        if values.len() != len {
            return Err(Error::Metadata(format!(
                "tensor {full} has {} values, {len} expected",
                values.len()
            )));
        }
        Ok(values)
    }

    /// `ssm_in` dealt into the queries, keys and values (each group's, in key-head order)
    /// and the output gates.
    fn fused_qkvz(&self, full: &str, shape: DeltaNetShape) -> Result<(Linear, Linear)> {
        let weight = (self.read)(full)?;
        let (hk, r) = (shape.key_dim, shape.value_heads / shape.key_heads.max(1));
        let values = r * shape.value_dim;
        let group = 2 * hk + 2 * values;
        let rows = weight.shape().dims().first().copied().unwrap_or(0);
        if rows != group * shape.key_heads {
            return Err(Error::Metadata(format!(
                "tensor {full} has {rows} rows; {} expected for {} key heads",
                group * shape.key_heads,
                shape.key_heads
            )));
        }
        let of = |offset: usize, len: usize| {
            (0..shape.key_heads)
                .map(|k| k * group + offset..k * group + offset + len)
                .collect::<Vec<_>>()
        };
        let qkv: Vec<_> = [of(0, hk), of(hk, hk), of(2 * hk, values)].concat();
        let z = of(2 * hk + values, values);
        Ok((
            self.linear(gather_quantized(&weight, &qkv)?)?,
            self.linear(gather_quantized(&weight, &z)?)?,
        ))
    }
}
