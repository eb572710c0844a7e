//! gpt-oss's parts of a Hugging Face checkpoint (`GptOssForCausalLM`) and what its config
//! declares beyond the common keys: the experts' clamped SwiGLU (`swiglu_limit`,
//! `swiglu_alpha`, checked to be the ones thicket's activation computes), the quantization
//! (`quantization_config`: MXFP4 experts only, any other method refused by name, for every
//! family), the sinks (`self_attn.sinks`), and the mixture: a biased router (`mlp.router`)
//! and each layer's experts in two tensors whose gate and up alternate, either dense
//! (`mlp.experts.gate_up_proj` `[experts, hidden, 2 * width]`, `down_proj` `[experts, width,
//! hidden]`) or as the released files hold them, MXFP4 blocks and scales (`*_blocks` `[experts,
//! rows, blocks, 16]` with two values a byte, the first in the low nibble; `*_scales`
//! `[experts, rows, blocks]`), which are regrouped into ggml's blocks for thicket's kernels.

use candle_core::{DType, Device, Tensor};
use serde::Deserialize;

use crate::cpu::qgemm::formats::QuantFormat;
use crate::cpu::qgemm::QuantMatrix;
use crate::model::config::{Architecture, Moe};
use crate::model::experts::load::{check, f32_values, kernel_only};
use crate::model::experts::ExpertMlp;
use crate::model::linear::Linear;
use crate::model::DenseMlp;
use crate::{Error, Result};

/// The clamp and slope thicket's `swiglu_oai` computes.
const LIMIT: f64 = 7.0;
const ALPHA: f64 = 1.702;

/// gpt-oss's own keys of `config.json`, and the quantization of any checkpoint.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct HfGptOss {
    #[serde(default)]
    swiglu_limit: Option<f64>,
    #[serde(default)]
    swiglu_alpha: Option<f64>,
    #[serde(default)]
    quantization_config: Option<serde_json::Value>,
}

impl HfGptOss {
    /// Refuses a quantization thicket does not read and an activation other than its own.
    pub(crate) fn check(&self, architecture: Architecture) -> Result<()> {
        if let Some(q) = &self.quantization_config {
            let method = q["quant_method"].as_str().unwrap_or("(none named)");
            if method != "mxfp4" || architecture != Architecture::GptOss {
                return Err(Error::Metadata(format!(
                    "quantization_config.quant_method = '{method}': thicket reads HF checkpoints \
                     unquantized (and gpt-oss's MXFP4 experts); convert this one to GGUF"
                )));
            }
        }
        for (key, value, want) in [
            ("swiglu_limit", self.swiglu_limit, LIMIT),
            ("swiglu_alpha", self.swiglu_alpha, ALPHA),
        ] {
            if let Some(v) = value.filter(|v| (v - want).abs() > 1e-6) {
                return Err(Error::Metadata(format!(
                    "{key} = {v}: thicket's gpt-oss activation computes {want}"
                )));
            }
        }
        Ok(())
    }
}

/// Layer `p`'s sinks, one per query head, where the checkpoint has them.
pub(crate) fn sinks(
    p: &str,
    heads: usize,
    load: &dyn Fn(&str) -> Result<Tensor>,
) -> Result<Vec<f32>> {
    let name = format!("{p}.self_attn.sinks");
    f32_values(&name, &load(&name)?, &[&[heads]])
}

/// Layer `p`'s (`model.layers.N`) mixture: dense experts in `dtype` (as `Linear::from_dense`
/// takes it), MXFP4 ones on thicket's kernels where `keep_quantized` (on the CPU).
pub(crate) fn experts(
    p: &str,
    moe: &Moe,
    hidden: usize,
    load: &dyn Fn(&str) -> Result<Tensor>,
    (dtype, keep_quantized): (Option<DType>, bool),
    device: &Device,
) -> Result<ExpertMlp> {
    // MXFP4 experts stay so on the CPU unless a dense type was asked for.
    let mxfp4_dtype = match keep_quantized && device.is_cpu() {
        true => None,
        false => dtype,
    };
    let (n, width) = (moe.num_experts, moe.expert_width);
    let router_name = format!("{p}.mlp.router.weight");
    let router = f32_values(&router_name, &load(&router_name)?, &[&[n, hidden]])?;
    let bias_name = format!("{p}.mlp.router.bias");
    let router_bias = f32_values(&bias_name, &load(&bias_name)?, &[&[n]])?;
    let at = |name: &str| format!("{p}.mlp.experts.{name}");
    let bias = |name: &str, rows: usize| -> Result<Vec<Vec<f32>>> {
        let values = f32_values(&at(name), &load(&at(name))?, &[&[n, rows]])?;
        Ok(values.chunks_exact(rows).map(<[f32]>::to_vec).collect())
    };
    let gate_up_bias = bias("gate_up_proj_bias", 2 * width)?;
    let down_bias = bias("down_proj_bias", hidden)?;
    let blocks = load(&at("gate_up_proj_blocks")).ok();
    let mut projections = match blocks {
        Some(gate_up) => {
            let gate_up =
                Mxfp4Stack::read(&at("gate_up_proj"), gate_up, load, [n, 2 * width, hidden])?;
            let down = load(&at("down_proj_blocks"))?;
            let down = Mxfp4Stack::read(&at("down_proj"), down, load, [n, hidden, width])?;
            let linear = |name: &str, stack: &Mxfp4Stack, e: usize, rows: Rows| {
                kernel_only(name, stack.matrix(e, rows)?, mxfp4_dtype, device)
            };
            (0..n)
                .map(|e| {
                    Ok([
                        linear(&gate_up.name, &gate_up, e, Rows::Even)?,
                        linear(&gate_up.name, &gate_up, e, Rows::Odd)?,
                        linear(&down.name, &down, e, Rows::All)?,
                    ])
                })
                .collect::<Result<Vec<_>>>()?
        }
        None => {
            let gate_up = load(&at("gate_up_proj"))?;
            check(&at("gate_up_proj"), gate_up.dims(), &[n, hidden, 2 * width])?;
            let down = load(&at("down_proj"))?;
            check(&at("down_proj"), down.dims(), &[n, width, hidden])?;
            let linear = |t: Tensor| Linear::from_dense(t.t()?.contiguous()?, None, dtype);
            (0..n)
                .map(|e| {
                    // Columns alternate gate and up.
                    let pairs = gate_up.get(e)?.reshape((hidden, width, 2))?;
                    let half =
                        |i: usize| -> Result<Tensor> { Ok(pairs.narrow(2, i, 1)?.squeeze(2)?) };
                    Ok([linear(half(0)?)?, linear(half(1)?)?, linear(down.get(e)?)?])
                })
                .collect::<Result<Vec<_>>>()?
        }
    };
    let tensor = |v: Vec<f32>| -> Result<Tensor> {
        let len = v.len();
        Ok(Tensor::from_vec(v, len, device)?)
    };
    let experts = projections
        .drain(..)
        .zip(gate_up_bias.iter().zip(&down_bias))
        .map(|([gate, up, down], (gate_up_b, down_b))| {
            let gate_b: Vec<f32> = gate_up_b.iter().step_by(2).copied().collect();
            let up_b: Vec<f32> = gate_up_b.iter().skip(1).step_by(2).copied().collect();
            Ok(DenseMlp {
                gate: gate.with_bias(Some(tensor(gate_b)?)),
                up: up.with_bias(Some(tensor(up_b)?)),
                down: down.with_bias(Some(tensor(down_b.clone())?)),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(ExpertMlp {
        router,
        router_bias: Some(router_bias),
        experts,
        shared: None,
        top_k: moe.experts_per_token,
        normalize: moe.normalize,
        beside: None,
    })
}

/// Which rows of a stacked projection an expert's matrix takes.
#[derive(Clone, Copy)]
enum Rows {
    /// Every row.
    All,
    /// Rows 0, 2, 4, ... (the gate's).
    Even,
    /// Rows 1, 3, 5, ... (the up projection's).
    Odd,
}

/// A stacked MXFP4 projection, `[experts, rows, cols]`, as the checkpoint holds it.
struct Mxfp4Stack {
    name: String,
    blocks: Vec<u8>,
    scales: Vec<u8>,
    dims: [usize; 3],
}

impl Mxfp4Stack {
    /// `{name}_blocks` (given) and `{name}_scales`, their shapes checked against `dims`.
    fn read(
        name: &str,
        blocks: Tensor,
        load: &dyn Fn(&str) -> Result<Tensor>,
        dims: [usize; 3],
    ) -> Result<Self> {
        let [experts, rows, cols] = dims;
        if !cols.is_multiple_of(32) {
            return Err(Error::Metadata(format!(
                "tensor {name}_blocks: rows of {cols} values are not whole MXFP4 blocks"
            )));
        }
        let per_row = cols / 32;
        let scales = load(&format!("{name}_scales"))?;
        for (part, t, want) in [
            ("blocks", &blocks, vec![experts, rows, per_row, 16]),
            ("scales", &scales, vec![experts, rows, per_row]),
        ] {
            check(&format!("{name}_{part}"), t.dims(), &want)?;
            if t.dtype() != DType::U8 {
                return Err(Error::Metadata(format!(
                    "tensor {name}_{part} is {:?}, not the bytes (U8) of MXFP4",
                    t.dtype()
                )));
            }
        }
        let bytes = |t: Tensor| -> Result<Vec<u8>> { Ok(t.flatten_all()?.to_vec1::<u8>()?) };
        Ok(Self {
            name: format!("{name}_blocks"),
            blocks: bytes(blocks)?,
            scales: bytes(scales)?,
            dims,
        })
    }

    /// Expert `e`'s `rows` as ggml's MXFP4 blocks (the scale byte, then byte `j` holding
    /// values `j` and `j + 16`).
    fn matrix(&self, e: usize, rows: Rows) -> Result<QuantMatrix> {
        let [_, all_rows, cols] = self.dims;
        let per_row = cols / 32;
        let (first, step) = match rows {
            Rows::All => (0, 1),
            Rows::Even => (0, 2),
            Rows::Odd => (1, 2),
        };
        let picked: Vec<usize> = (first..all_rows).step_by(step).collect();
        let mut out = Vec::with_capacity(picked.len() * per_row * 17);
        for &r in &picked {
            for b in 0..per_row {
                let block = (e * all_rows + r) * per_row + b;
                let packed = &self.blocks[block * 16..block * 16 + 16];
                let code = |i: usize| (packed[i / 2] >> (4 * (i % 2))) & 0x0f;
                out.push(self.scales[block]);
                out.extend((0..16).map(|j| code(j) | (code(j + 16) << 4)));
            }
        }
        QuantMatrix::new(QuantFormat::Mxfp4, picked.len(), cols, out)
    }
}
