//! The CUDA backend's fused f16 pass, for models whose projections are f16 (GGUF weights
//! dequantized at load, the default on a GPU). q, k and v are one projection, gate and up
//! another; everything between the four cuBLAS products per layer is one thicket kernel:
//! the residual add with the next RMSNorm, RoPE with the K/V write into the cache, paged
//! tree attention, SwiGLU. Nine launches a layer, against about thirty for candle's ops
//! (each of which also converts f32 activations to f16 and back around every product).
//! Activations between kernels are f16 (what the f16 products read anyway); the residual
//! stream, norms, RoPE, softmax and SwiGLU are f32.

use candle_core::{DType, Tensor};
use cudarc::driver::{CudaSlice, PushKernelArg};
use half::f16;

use super::device::{device_err, grid, view, Gpu, ROW_THREADS};
use crate::model::config::{ModelConfig, RopeStyle};
use crate::model::linear::Linear;
use crate::model::Model;
use crate::tree_batch::TreeBatch;
use crate::Result;

/// One decoder block's weights as the fused pass reads them.
struct FusedLayer {
    attn_norm: Tensor,
    /// `[(heads + 2 kv_heads) * head_dim, hidden]` f16: q, k and v stacked.
    qkv: Tensor,
    /// q, k and v biases stacked (f32), where the model has them.
    qkv_bias: Option<Tensor>,
    o: Tensor,
    mlp_norm: Tensor,
    /// `[2 * ffn, hidden]` f16: gate then up.
    gate_up: Tensor,
    down: Tensor,
}

/// The fused pass's weights.
pub(super) struct FusedPass {
    /// `[vocab, hidden]` f32.
    embedding: Tensor,
    layers: Vec<FusedLayer>,
    final_norm: Tensor,
    /// `[vocab, hidden]` f16.
    lm_head: Tensor,
    cos: Tensor,
    sin: Tensor,
    interleaved: i32,
    /// Passed as the bias of a model without q/k/v biases (never read).
    no_bias: CudaSlice<f32>,
}

/// The f16 weight of a bias-free projection, `None` for any other.
fn f16_weight(linear: &Linear) -> Option<Tensor> {
    linear
        .dense_weight()
        .filter(|w| w.dtype() == DType::F16 && linear.bias().is_none())
        .cloned()
}

/// An f32 contiguous copy (norm weights, the embedding).
fn f32_contiguous(t: &Tensor) -> Result<Tensor> {
    Ok(t.to_dtype(DType::F32)?.contiguous()?)
}

impl FusedPass {
    /// The pass for `model`, `None` when any projection is not f16.
    pub fn new(model: &Model) -> Result<Option<Self>> {
        let weights = model.weights();
        let candle_core::Device::Cuda(device) = model.device() else {
            return Ok(None);
        };
        let Some(lm_head) = f16_weight(&weights.lm_head) else {
            return Ok(None);
        };
        let mut layers = Vec::with_capacity(weights.layers.len());
        for layer in &weights.layers {
            let qkv: Option<Vec<Tensor>> = [&layer.q, &layer.k, &layer.v]
                .iter()
                .map(|l| {
                    l.dense_weight()
                        .filter(|w| w.dtype() == DType::F16)
                        .cloned()
                })
                .collect();
            let (Some(qkv), Some(o), Some(gate), Some(up), Some(down)) = (
                qkv,
                f16_weight(&layer.o),
                f16_weight(&layer.gate),
                f16_weight(&layer.up),
                f16_weight(&layer.down),
            ) else {
                return Ok(None);
            };
            let qkv_bias = if [&layer.q, &layer.k, &layer.v]
                .iter()
                .any(|l| l.bias().is_some())
            {
                let parts: Vec<Tensor> = [&layer.q, &layer.k, &layer.v]
                    .iter()
                    .zip(&qkv)
                    .map(|(l, w)| match l.bias() {
                        Some(b) => Ok(b.to_dtype(DType::F32)?),
                        None => Ok(Tensor::zeros(w.dim(0)?, DType::F32, w.device())?),
                    })
                    .collect::<Result<_>>()?;
                Some(Tensor::cat(&parts, 0)?.contiguous()?)
            } else {
                None
            };
            layers.push(FusedLayer {
                attn_norm: f32_contiguous(&layer.attn_norm)?,
                qkv: Tensor::cat(&qkv, 0)?.contiguous()?,
                qkv_bias,
                o,
                mlp_norm: f32_contiguous(&layer.mlp_norm)?,
                gate_up: Tensor::cat(&[gate, up], 0)?.contiguous()?,
                down,
            });
        }
        let (cos, sin) = model.rope_tables();
        let no_bias = device
            .cuda_stream()
            .alloc_zeros::<f32>(1)
            .map_err(device_err("allocating"))?;
        Ok(Some(Self {
            embedding: f32_contiguous(&weights.embedding)?,
            layers,
            final_norm: f32_contiguous(&weights.final_norm)?,
            lm_head,
            cos: f32_contiguous(cos)?,
            sin: f32_contiguous(sin)?,
            interleaved: i32::from(model.config().rope_style == RopeStyle::Interleaved),
            no_bias,
        }))
    }

    /// Runs `batch`; the f32 logits of its logit rows, or `None` when it asks for none.
    pub fn forward(
        &self,
        gpu: &mut Gpu,
        cfg: &ModelConfig,
        batch: &TreeBatch,
    ) -> Result<Option<Tensor>> {
        let rows = batch.num_rows();
        let (hidden, heads, kv_heads, dim) = (
            cfg.hidden_size,
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
        );
        let ffn = cfg.intermediate_size;
        let plan = gpu.upload_plan(batch)?;
        let by_rows = grid((rows as u32, 1, 1), ROW_THREADS);
        let (hidden_i, heads_i, kv_i, dim_i) =
            (hidden as i32, heads as i32, kv_heads as i32, dim as i32);

        let mut x = gpu.scratch::<f32>(rows * hidden)?;
        {
            let (table, layout) = self.embedding.storage_and_layout();
            let table = view::<f32>(&table, layout)?;
            let mut launch = gpu.stream.launch_builder(&gpu.kernels.embed);
            launch
                .arg(&table)
                .arg(&plan.words)
                .arg(&mut x)
                .arg(&hidden_i);
            // SAFETY: embed's signature; every token was checked against the vocabulary.
            unsafe { launch.launch(by_rows) }.map_err(device_err("embed"))?;
        }
        // The last projection's output, not yet added to x.
        let mut delta: Option<Tensor> = None;
        for (index, layer) in self.layers.iter().enumerate() {
            let h = self.residual_norm(gpu, &mut x, delta.as_ref(), &layer.attn_norm, rows, cfg)?;
            let qkv = gpu.tensor(h, (rows, hidden)).matmul(&layer.qkv.t()?)?;
            let (k_at, v_at) = gpu.planes(index);
            let mut q = gpu.scratch::<f32>(rows * heads * dim)?;
            {
                let (store, layout) = qkv.storage_and_layout();
                let qkv = view::<f16>(&store, layout)?;
                let (cos_store, cos_layout) = self.cos.storage_and_layout();
                let (sin_store, sin_layout) = self.sin.storage_and_layout();
                let cos = view::<f32>(&cos_store, cos_layout)?;
                let sin = view::<f32>(&sin_store, sin_layout)?;
                let bias_store = layer.qkv_bias.as_ref().map(|b| b.storage_and_layout());
                let has_bias = i32::from(bias_store.is_some());
                let bias = match &bias_store {
                    Some((store, layout)) => view::<f32>(store, layout)?,
                    None => self.no_bias.slice(..),
                };
                let mut launch = gpu.stream.launch_builder(&gpu.kernels.rope_kv);
                launch
                    .arg(&qkv)
                    .arg(&bias)
                    .arg(&has_bias)
                    .arg(&cos)
                    .arg(&sin)
                    .arg(&plan.words)
                    .arg(&mut q)
                    .arg(&mut gpu.cache)
                    .arg(&k_at)
                    .arg(&v_at)
                    .arg(&heads_i)
                    .arg(&kv_i)
                    .arg(&dim_i)
                    .arg(&self.interleaved);
                // SAFETY: rope_kv's signature; slots and positions were checked by
                // `TreeBatch::validate` (positions below the RoPE table's length).
                unsafe { launch.launch(by_rows) }.map_err(device_err("rope_kv"))?;
            }
            let mut attn = gpu.scratch::<f16>(rows * heads * dim)?;
            // q is [rows, heads, dim].
            let strides = ((heads * dim) as i64, dim as i64);
            gpu.attend(cfg, index, &plan, &q.slice(..), strides, &mut attn, true)?;
            let o = gpu
                .tensor(attn, (rows, heads * dim))
                .matmul(&layer.o.t()?)?;
            let h = self.residual_norm(gpu, &mut x, Some(&o), &layer.mlp_norm, rows, cfg)?;
            let gate_up = gpu.tensor(h, (rows, hidden)).matmul(&layer.gate_up.t()?)?;
            let mut gated = gpu.scratch::<f16>(rows * ffn)?;
            {
                let (store, layout) = gate_up.storage_and_layout();
                let gate_up = view::<f16>(&store, layout)?;
                let ffn_i = ffn as i32;
                let mut launch = gpu.stream.launch_builder(&gpu.kernels.swiglu);
                launch.arg(&gate_up).arg(&mut gated).arg(&ffn_i);
                // SAFETY: swiglu's signature; gate_up holds rows * 2 * ffn values.
                unsafe { launch.launch(by_rows) }.map_err(device_err("swiglu"))?;
            }
            delta = Some(gpu.tensor(gated, (rows, ffn)).matmul(&layer.down.t()?)?);
        }
        let h = self.residual_norm(gpu, &mut x, delta.as_ref(), &self.final_norm, rows, cfg)?;
        if batch.logit_rows.is_empty() {
            return Ok(None);
        }
        let wanted: Vec<u32> = batch.logit_rows.iter().map(|&r| r as u32).collect();
        let wanted = Tensor::new(wanted.as_slice(), self.lm_head.device())?;
        let h = gpu.tensor(h, (rows, hidden)).index_select(&wanted, 0)?;
        Ok(Some(h.matmul(&self.lm_head.t()?)?.to_dtype(DType::F32)?))
    }

    /// `x += delta` (when given), then RMSNorm of `x` with `gamma`, as f16 rows.
    fn residual_norm(
        &self,
        gpu: &Gpu,
        x: &mut CudaSlice<f32>,
        delta: Option<&Tensor>,
        gamma: &Tensor,
        rows: usize,
        cfg: &ModelConfig,
    ) -> Result<CudaSlice<f16>> {
        let hidden = cfg.hidden_size as i32;
        let eps = cfg.rms_norm_eps as f32;
        let mut out = gpu.scratch::<f16>(rows * cfg.hidden_size)?;
        let (gamma_store, gamma_layout) = gamma.storage_and_layout();
        let gamma = view::<f32>(&gamma_store, gamma_layout)?;
        let config = grid((rows as u32, 1, 1), ROW_THREADS);
        match delta {
            Some(delta) => {
                let (store, layout) = delta.storage_and_layout();
                let delta = view::<f16>(&store, layout)?;
                let mut launch = gpu.stream.launch_builder(&gpu.kernels.add_rms_norm);
                launch
                    .arg(x)
                    .arg(&delta)
                    .arg(&gamma)
                    .arg(&mut out)
                    .arg(&hidden)
                    .arg(&eps);
                // SAFETY: add_rms_norm's signature; x, delta and out hold rows * hidden.
                unsafe { launch.launch(config) }.map_err(device_err("add_rms_norm"))?;
            }
            None => {
                let mut launch = gpu.stream.launch_builder(&gpu.kernels.rms_norm);
                launch
                    .arg(x)
                    .arg(&gamma)
                    .arg(&mut out)
                    .arg(&hidden)
                    .arg(&eps);
                // SAFETY: rms_norm's signature; x and out hold rows * hidden values.
                unsafe { launch.launch(config) }.map_err(device_err("rms_norm"))?;
            }
        }
        Ok(out)
    }
}
