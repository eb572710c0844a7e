//! `Projection`: one of the fused CPU pass's products as it runs it, on thicket's quantized
//! kernel (the matrix and its bias) or, for weights that kernel does not take, through the
//! model's candle `Linear`; and `project`, which runs several projections of the same input,
//! quantizing it once for every packed projection that reads the same activations and running
//! those as one parallel product.

use std::sync::Arc;

use candle_core::{Device, Tensor};

use crate::cpu::qgemm::{matmul_quantized_all, Activations, QuantMatrix};
use crate::model::linear::Linear;
use crate::Result;

/// One projection: thicket's quantized matrix and its bias, or (weights in a format or dtype
/// thicket's kernel does not take) the model's own `Linear`, run through candle.
#[derive(Debug, Clone)]
pub(crate) enum Projection {
    Packed {
        weight: Arc<QuantMatrix>,
        bias: Option<Vec<f32>>,
    },
    Candle(Linear),
}

impl Projection {
    pub(crate) fn from_linear(linear: &Linear) -> Result<Self> {
        Ok(match linear.packed() {
            Some(weight) => Self::Packed {
                weight: weight.clone(),
                bias: linear.bias_values()?,
            },
            None => Self::Candle(linear.clone()),
        })
    }

    /// Whether activations quantized for `other` serve this projection as they are.
    fn shares_activations(&self, other: &Projection) -> bool {
        match (self, other) {
            (Self::Packed { weight: a, .. }, Self::Packed { weight: b, .. }) => {
                a.same_activations(b)
            }
            _ => false,
        }
    }
}

/// Projects the `rows` rows of `x` through each projection into its buffer. `x` is quantized
/// once for each kind of activations the packed projections read, in `acts`, and the packed
/// projections that read the same activations run as one parallel product.
pub(crate) fn project(
    x: &[f32],
    rows: usize,
    outputs: &mut [(&Projection, &mut Vec<f32>)],
    acts: &mut Activations,
) -> Result<()> {
    let mut start = 0;
    while start < outputs.len() {
        let (first, rest) = outputs[start..].split_first_mut().expect("start < len");
        match first.0 {
            Projection::Packed { weight, .. } => {
                weight.quantize(x, acts);
                // The following packed projections that read these activations join it.
                let run = 1 + rest
                    .iter()
                    .take_while(|(p, _)| p.shares_activations(first.0))
                    .count();
                let group = &mut outputs[start..start + run];
                let products = group.iter_mut().filter_map(|(p, out)| match p {
                    Projection::Packed { weight, .. } => Some((&**weight, &mut **out)),
                    Projection::Candle(_) => None,
                });
                matmul_quantized_all(acts, products)?;
                for (projection, out) in group.iter_mut() {
                    if let Projection::Packed { bias, .. } = projection {
                        add_bias(bias, out);
                    }
                }
                start += run;
            }
            Projection::Candle(linear) => {
                let input = Tensor::from_slice(x, (rows, x.len() / rows.max(1)), &Device::Cpu)?;
                let y = linear.forward(&input)?.flatten_all()?.to_vec1::<f32>()?;
                first.1.clear();
                first.1.extend_from_slice(&y);
                start += 1;
            }
        }
    }
    Ok(())
}

/// Adds the bias, if any, to every row of `out`.
pub(crate) fn add_bias(bias: &Option<Vec<f32>>, out: &mut [f32]) {
    if let Some(bias) = bias {
        for row in out.chunks_exact_mut(bias.len()) {
            for (y, b) in row.iter_mut().zip(bias) {
                *y += *b;
            }
        }
    }
}
