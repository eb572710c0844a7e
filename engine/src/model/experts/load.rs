//! A layer's mixture of experts from a file. GGUF stacks each projection's experts in one
//! tensor (`blk.N.ffn_gate_exps`: `[experts, width, hidden]`, quantized); each expert's blocks
//! are cut out as they are and kept in their format. Older Mixtral conversions keep one
//! tensor per expert (`blk.N.ffn_gate.E`). HF checkpoints keep one tensor per expert
//! (`mlp.experts.E.gate_proj`, Mixtral's `block_sparse_moe.experts.E.w1`), or, saved by
//! transformers 5 in its own layout, two per layer (`mlp.experts.gate_up_proj`, `down_proj`). The router (and
//! Qwen2-MoE's shared-expert gate) is read as f32. Every tensor's shape is checked against the
//! config, and a mismatch names the tensor.

use std::borrow::Cow;

use candle_core::quantized::{QStorage, QTensor};
use candle_core::{DType, Device, Tensor};

use serde::Deserialize;

use super::prepared::PreparedExperts;
use super::{DenseMlp, ExpertMlp, SharedExpert};
use crate::cpu::qgemm::{process_isa, QuantMatrix};
use crate::model::arch::ExpertFacts;
use crate::model::config::{Architecture, Moe};
use crate::model::gguf_header::RawBlocks;
use crate::model::linear::Linear;
use crate::model::shapes::split_quantized;
use crate::{Error, Result};

/// An error naming `name` unless `dims` is `want`.
pub(crate) fn check(name: &str, dims: &[usize], want: &[usize]) -> Result<()> {
    if dims == want {
        return Ok(());
    }
    Err(Error::Metadata(format!(
        "tensor {name} has shape {dims:?}, but the config implies {want:?}"
    )))
}

/// A dense tensor's values as f32, its shape checked to be one of `shapes`.
pub(crate) fn f32_values(name: &str, t: &Tensor, shapes: &[&[usize]]) -> Result<Vec<f32>> {
    if !shapes.contains(&t.dims()) {
        return Err(Error::Metadata(format!(
            "tensor {name} has shape {:?}, but the config implies {:?}",
            t.dims(),
            shapes[0]
        )));
    }
    Ok(t.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?)
}

/// The experts of a stacked GGUF tensor of shape `[experts, rows, cols]`, one `[rows, cols]`
/// tensor each, their blocks' bytes as they are.
pub(crate) fn split_stacked(name: &str, q: &QTensor, want: [usize; 3]) -> Result<Vec<QTensor>> {
    check(name, q.shape().dims(), &want)?;
    let [experts, rows, cols] = want;
    let dtype = q.dtype();
    if !cols.is_multiple_of(dtype.block_size()) {
        return Err(Error::Metadata(format!(
            "tensor {name}: rows of {cols} values are not whole {dtype:?} blocks"
        )));
    }
    let bytes = rows * cols / dtype.block_size() * dtype.type_size();
    let data = q.data()?;
    if data.len() != experts * bytes {
        return Err(Error::Metadata(format!(
            "tensor {name} holds {} bytes, not {experts} experts of {bytes}",
            data.len()
        )));
    }
    data.chunks_exact(bytes)
        .map(|part| {
            let storage = QStorage::from_data(Cow::Borrowed(part), &q.device(), dtype)?;
            Ok(QTensor::new(storage, (rows, cols))?)
        })
        .collect()
}

/// A matrix in a format only thicket's kernels read (`name`'s): on them where the weights
/// stay quantized on the CPU (`dtype` `None`), else its values as a dense weight (in `dtype`).
pub(crate) fn kernel_only(
    name: &str,
    matrix: QuantMatrix,
    dtype: Option<DType>,
    device: &Device,
) -> Result<Linear> {
    if dtype.is_none() && device.is_cpu() {
        return Ok(Linear::from_packed(matrix.for_isa(process_isa())));
    }
    let values = matrix
        .dequantize()
        .map_err(|e| Error::Metadata(format!("tensor {name}: {e}")))?;
    let dense = Tensor::from_vec(values, (matrix.rows(), matrix.cols()), device)?;
    Linear::from_dense(dense, None, Some(dtype.unwrap_or(DType::F32)))
}

/// How a GGUF loader reads a tensor: by name, and whether the file has it.
pub(crate) struct GgufTensors<'a> {
    pub read: &'a dyn Fn(&str) -> Result<QTensor>,
    pub has: &'a dyn Fn(&str) -> bool,
    /// A tensor candle does not read but thicket's kernels do (MXFP4 experts): its format,
    /// shape and blocks; `None` for any other.
    pub blocks: &'a dyn Fn(&str) -> Option<Result<RawBlocks>>,
    pub dtype: Option<DType>,
    pub device: &'a Device,
    /// The GGUF's experts prepared for the SIMD kernels, where they are (see `prepared`).
    pub prepared: Option<&'a PreparedExperts>,
}

impl GgufTensors<'_> {
    pub(crate) fn dense(&self, name: &str) -> Result<Tensor> {
        Ok((self.read)(name)?
            .dequantize(self.device)?
            .to_dtype(DType::F32)?)
    }

    pub(crate) fn linear(&self, q: QTensor) -> Result<Linear> {
        Linear::from_qtensor(q, None, self.dtype)
    }

    /// One projection of every expert: the stacked tensor, or one tensor per expert.
    fn experts(
        &self,
        p: &str,
        name: &str,
        n: usize,
        rows: usize,
        cols: usize,
    ) -> Result<Vec<Linear>> {
        let stacked = format!("{p}.{name}_exps.weight");
        if let Some(mapped) = self
            .prepared
            .and_then(|m| m.experts(&stacked, [n, rows, cols]))
        {
            return Ok(mapped?.into_iter().map(Linear::from_packed).collect());
        }
        if let Some(raw) = (self.blocks)(&stacked) {
            let (format, dims, bytes) = raw?;
            check(&stacked, &dims, &[n, rows, cols])?;
            let per_expert = bytes.len() / n.max(1);
            return bytes
                .chunks_exact(per_expert)
                .map(|blocks| {
                    let matrix = QuantMatrix::new(format, rows, cols, blocks.to_vec())?;
                    kernel_only(&stacked, matrix, self.dtype, self.device)
                })
                .collect();
        }
        if (self.has)(&stacked) || !(self.has)(&format!("{p}.{name}.0.weight")) {
            let q = (self.read)(&stacked)?;
            return split_stacked(&stacked, &q, [n, rows, cols])?
                .into_iter()
                .map(|q| self.linear(q))
                .collect();
        }
        (0..n)
            .map(|e| {
                let one = format!("{p}.{name}.{e}.weight");
                let q = (self.read)(&one)?;
                check(&one, q.shape().dims(), &[rows, cols])?;
                self.linear(q)
            })
            .collect()
    }

    /// `experts` with each one's bias from the stacked `{p}.{name}_exps.bias` (`[experts,
    /// rows]`), where the file has it (gpt-oss).
    fn biased(&self, p: &str, name: &str, experts: Vec<Linear>) -> Result<Vec<Linear>> {
        let full = format!("{p}.{name}_exps.bias");
        if !(self.has)(&full) {
            return Ok(experts);
        }
        let bias = self.dense(&full)?;
        let rows = experts.first().map_or(0, Linear::rows);
        let values = f32_values(&full, &bias, &[&[experts.len(), rows]])?;
        experts
            .into_iter()
            .zip(values.chunks_exact(rows.max(1)))
            .map(|(linear, b)| {
                let b = Tensor::from_slice(b, rows, self.device)?;
                Ok(linear.with_bias(Some(b)))
            })
            .collect()
    }

    /// Layer `p`'s (`blk.N`) mixture.
    pub(crate) fn mixture(&self, p: &str, moe: &Moe, hidden: usize) -> Result<ExpertMlp> {
        let (n, width) = (moe.num_experts, moe.expert_width);
        let router_name = format!("{p}.ffn_gate_inp.weight");
        let router = f32_values(&router_name, &self.dense(&router_name)?, &[&[n, hidden]])?;
        let merged = format!("{p}.ffn_gate_up_exps.weight");
        let (gate, up) = match (self.has)(&merged) {
            // Gemma 4's converter stacks each expert's gate and up rows in one tensor.
            true => {
                let q = (self.read)(&merged)?;
                let mut gates = Vec::with_capacity(n);
                let mut ups = Vec::with_capacity(n);
                for both in split_stacked(&merged, &q, [n, 2 * width, hidden])? {
                    let [gate, up] =
                        <[QTensor; 2]>::try_from(split_quantized(&both, &[width, width])?)
                            .map_err(|_| Error::Metadata(format!("{merged} split wrongly")))?;
                    gates.push(self.linear(gate)?);
                    ups.push(self.linear(up)?);
                }
                (gates, ups)
            }
            false => (
                self.biased(
                    p,
                    "ffn_gate",
                    self.experts(p, "ffn_gate", n, width, hidden)?,
                )?,
                self.biased(p, "ffn_up", self.experts(p, "ffn_up", n, width, hidden)?)?,
            ),
        };
        let down = self.biased(
            p,
            "ffn_down",
            self.experts(p, "ffn_down", n, hidden, width)?,
        )?;
        // gpt-oss: a bias on the router.
        let bias_name = format!("{p}.ffn_gate_inp.bias");
        let router_bias = match (self.has)(&bias_name) {
            true => Some(f32_values(&bias_name, &self.dense(&bias_name)?, &[&[n]])?),
            false => None,
        };
        let experts = gate
            .into_iter()
            .zip(up)
            .zip(down)
            .map(|((gate, up), down)| DenseMlp { gate, up, down })
            .collect();
        let shared = match moe.shared_width {
            None => None,
            Some(width) => {
                let proj = |name: &str, dims: [usize; 2]| -> Result<Linear> {
                    let full = format!("{p}.{name}.weight");
                    let q = (self.read)(&full)?;
                    check(&full, q.shape().dims(), &dims)?;
                    self.linear(q)
                };
                // Granite 4.0-H's shared expert has no gate.
                let gate_name = format!("{p}.ffn_gate_inp_shexp.weight");
                let gate = match (self.has)(&gate_name) {
                    true => {
                        let gate = self.dense(&gate_name)?;
                        Some(f32_values(&gate_name, &gate, &[&[hidden], &[1, hidden]])?)
                    }
                    false => None,
                };
                Some(SharedExpert {
                    mlp: DenseMlp {
                        gate: proj("ffn_gate_shexp", [width, hidden])?,
                        up: proj("ffn_up_shexp", [width, hidden])?,
                        down: proj("ffn_down_shexp", [hidden, width])?,
                    },
                    gate,
                })
            }
        };
        Ok(ExpertMlp {
            router,
            router_bias,
            experts,
            shared,
            top_k: moe.experts_per_token,
            normalize: moe.normalize,
            beside: None,
        })
    }
}

/// Layer `p`'s (`model.layers.N`) mixture from an HF checkpoint of `family`: `load` reads a
/// tensor by name, `dtype` as `Linear::from_dense` takes it.
pub(crate) fn from_hf(
    p: &str,
    family: Architecture,
    moe: &Moe,
    hidden: usize,
    load: &dyn Fn(&str) -> Result<Tensor>,
    dtype: Option<DType>,
) -> Result<ExpertMlp> {
    let (n, width) = (moe.num_experts, moe.expert_width);
    let proj = |name: &str, dims: [usize; 2]| -> Result<Linear> {
        let w = load(name)?;
        check(name, w.dims(), &dims)?;
        Linear::from_dense(w, None, dtype)
    };
    // transformers 5 may keep each layer's experts in two tensors, under `mlp` for every
    // family: `experts.gate_up_proj` (`[experts, 2 * width, hidden]`, gate rows first) and
    // `experts.down_proj` (`[experts, hidden, width]`).
    let stacked_name = format!("{p}.mlp.experts.gate_up_proj");
    let stacked = load(&stacked_name).ok();
    // Otherwise one tensor per expert: Mixtral names the block `block_sparse_moe` and its
    // projections w1 (gate), w3 (up) and w2 (down); the Qwen mixtures name them as the dense
    // MLP does.
    let (block, names) = match family {
        Architecture::Mixtral if stacked.is_none() => ("block_sparse_moe", ["w1", "w3", "w2"]),
        _ => ("mlp", ["gate_proj", "up_proj", "down_proj"]),
    };
    let router_name = format!("{p}.{block}.gate.weight");
    let router = f32_values(&router_name, &load(&router_name)?, &[&[n, hidden]])?;
    let experts = match stacked {
        Some(gate_up) => {
            check(&stacked_name, gate_up.dims(), &[n, 2 * width, hidden])?;
            let down_name = format!("{p}.mlp.experts.down_proj");
            let down = load(&down_name)?;
            check(&down_name, down.dims(), &[n, hidden, width])?;
            let linear = |t: Tensor| Linear::from_dense(t.contiguous()?, None, dtype);
            (0..n)
                .map(|e| {
                    let both = gate_up.get(e)?;
                    Ok(DenseMlp {
                        gate: linear(both.narrow(0, 0, width)?)?,
                        up: linear(both.narrow(0, width, width)?)?,
                        down: linear(down.get(e)?)?,
                    })
                })
                .collect::<Result<Vec<_>>>()?
        }
        None => (0..n)
            .map(|e| {
                let at = |i: usize| format!("{p}.{block}.experts.{e}.{}.weight", names[i]);
                Ok(DenseMlp {
                    gate: proj(&at(0), [width, hidden])?,
                    up: proj(&at(1), [width, hidden])?,
                    down: proj(&at(2), [hidden, width])?,
                })
            })
            .collect::<Result<Vec<_>>>()?,
    };
    let shared = match moe.shared_width {
        None => None,
        Some(width) => {
            let at = |name: &str| format!("{p}.mlp.shared_expert.{name}.weight");
            let gate_name = format!("{p}.mlp.shared_expert_gate.weight");
            Some(SharedExpert {
                mlp: DenseMlp {
                    gate: proj(&at("gate_proj"), [width, hidden])?,
                    up: proj(&at("up_proj"), [width, hidden])?,
                    down: proj(&at("down_proj"), [hidden, width])?,
                },
                gate: Some(f32_values(&gate_name, &load(&gate_name)?, &[&[1, hidden]])?),
            })
        }
    };
    Ok(ExpertMlp {
        router,
        router_bias: None,
        experts,
        shared,
        top_k: moe.experts_per_token,
        normalize: moe.normalize,
        beside: None,
    })
}

/// The mixture-of-experts keys of `config.json` (Qwen2-MoE, Qwen3-MoE, Mixtral), and the
/// routing options of other mixtures, which are refused by name.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct HfExperts {
    #[serde(default)]
    num_experts: Option<usize>,
    #[serde(default)]
    num_local_experts: Option<usize>,
    #[serde(default)]
    num_experts_per_tok: Option<usize>,
    #[serde(default)]
    moe_intermediate_size: Option<usize>,
    #[serde(default)]
    shared_expert_intermediate_size: Option<usize>,
    #[serde(default)]
    norm_topk_prob: Option<bool>,
    #[serde(default)]
    decoder_sparse_step: Option<usize>,
    #[serde(default)]
    mlp_only_layers: Option<Vec<usize>>,
    #[serde(default)]
    scoring_func: Option<String>,
    #[serde(default)]
    topk_method: Option<String>,
    #[serde(default)]
    n_group: Option<usize>,
    #[serde(default)]
    routed_scaling_factor: Option<f64>,
}

impl HfExperts {
    /// The mixture these keys declare, `None` where they declare no experts. `dense_width`
    /// is `intermediate_size`: Mixtral's experts are that wide.
    pub(crate) fn facts(&self, layers: usize, dense_width: usize) -> Result<Option<ExpertFacts>> {
        let Some(count) = self
            .num_experts
            .or(self.num_local_experts)
            .filter(|&n| n > 0)
        else {
            return Ok(None);
        };
        if let Some(func) = self.scoring_func.as_deref().filter(|f| *f != "softmax") {
            return Err(Error::Metadata(format!(
                "scoring_func = '{func}': only a softmax router is supported"
            )));
        }
        if let Some(method) = self.topk_method.as_deref().filter(|m| *m != "greedy") {
            return Err(Error::Metadata(format!(
                "topk_method = '{method}': only greedy top-k routing is supported"
            )));
        }
        if self.n_group.is_some_and(|g| g > 1) {
            return Err(Error::Metadata(
                "n_group: grouped expert routing is not supported".into(),
            ));
        }
        if let Some(f) = self.routed_scaling_factor.filter(|&f| f != 1.0) {
            return Err(Error::Metadata(format!(
                "routed_scaling_factor = {f}: scaled expert weights are not supported"
            )));
        }
        let used = self
            .num_experts_per_tok
            .ok_or_else(|| Error::Metadata("num_experts_per_tok is missing".into()))?;
        let step = self.decoder_sparse_step.unwrap_or(1);
        if step == 0 {
            return Err(Error::Metadata(
                "decoder_sparse_step must be positive".into(),
            ));
        }
        let dense = self.mlp_only_layers.clone().unwrap_or_default();
        if let Some(&bad) = dense.iter().find(|&&l| l >= layers) {
            return Err(Error::Metadata(format!(
                "mlp_only_layers names layer {bad} of {layers}"
            )));
        }
        // As transformers decides: a layer is sparse unless listed, every `step`-th.
        let sparse: Vec<bool> = (0..layers)
            .map(|i| !dense.contains(&i) && (i + 1) % step == 0)
            .collect();
        Ok(Some(ExpertFacts {
            count,
            used,
            width: self.moe_intermediate_size.unwrap_or(dense_width),
            shared_width: self.shared_expert_intermediate_size.filter(|&w| w > 0),
            normalize: self.norm_topk_prob,
            sparse_layers: (!sparse.iter().all(|&s| s)).then_some(sparse),
        }))
    }
}
