//! A Mamba-2 layer's tensors from a GGUF file, as llama.cpp's converter writes Granite
//! 4.0-H's: `ssm_in` (the gate `z`, then the convolution's `x, B, C`, then a step per head,
//! cut here into the three projections the layer runs), `ssm_conv1d` with its bias,
//! `ssm_dt.bias`, `ssm_a` (already `-exp(A_log)`), `ssm_d`, the group norm `ssm_norm` and
//! `ssm_out`. Every tensor is checked against the shape the file's `ssm.*` keys imply.

use crate::model::config::DeltaNetShape;
use crate::model::experts::load::GgufTensors;
use crate::model::mixer::Mamba2Parts;
use crate::model::shapes::{split_quantized, Role, Shapes};
use crate::{Error, Result};

impl GgufTensors<'_> {
    /// Layer `p`'s (`blk.N`) Mamba-2 tensors.
    pub(crate) fn mamba2(
        &self,
        p: &str,
        shape: DeltaNetShape,
        shapes: &Shapes,
    ) -> Result<Mamba2Parts> {
        let name = |n: &str| format!("{p}.{n}");
        let input = name("ssm_in.weight");
        let weight = (self.read)(&input)?;
        shapes.check(&input, Role::Mamba2In, weight.shape().dims())?;
        let (width, channels, heads) = (
            shape.value_width(),
            shape.conv_channels(),
            shape.value_heads,
        );
        let [gate, xbc, dt] =
            <[_; 3]>::try_from(split_quantized(&weight, &[width, channels, heads])?)
                .map_err(|_| Error::Metadata(format!("tensor {input} split wrongly")))?;
        let out = name("ssm_out.weight");
        let out_weight = (self.read)(&out)?;
        shapes.check(&out, Role::DeltaOut, out_weight.shape().dims())?;
        Ok(Mamba2Parts {
            gate: self.linear(gate)?,
            xbc: self.linear(xbc)?,
            dt: self.linear(dt)?,
            conv: self.dense(&name("ssm_conv1d.weight"))?,
            conv_bias: self.vector(&name("ssm_conv1d.bias"), channels)?,
            dt_bias: self.vector(&name("ssm_dt.bias"), heads)?,
            decay: self.vector(&name("ssm_a"), heads)?,
            skip: self.vector(&name("ssm_d"), heads)?,
            norm: self.vector(&name("ssm_norm.weight"), width)?,
            out: self.linear(out_weight)?,
        })
    }
}
