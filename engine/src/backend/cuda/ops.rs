//! The CUDA backend's forward for weights the fused pass does not take (quantized, bf16,
//! f32): candle's ops for projections, norms, RoPE and SwiGLU, thicket's kernels for K/V
//! writes into the device cache and paged tree attention.

use candle_core::{DType, Device, Tensor};
use cudarc::driver::{CudaSlice, PushKernelArg};

use super::device::{device_err, grid, view, Gpu, Uploaded};
use crate::model::Model;
use crate::tree_batch::TreeBatch;
use crate::{Error, Result};

/// Runs `batch`; the f32 logits of its logit rows, or `None` when it asks for none.
pub(super) fn forward(gpu: &mut Gpu, model: &Model, batch: &TreeBatch) -> Result<Option<Tensor>> {
    let cfg = model.config();
    let weights = model.weights();
    let device = Device::Cuda(gpu.device.clone());
    let plan = gpu.upload_plan(batch)?;
    let slots: Vec<i32> = batch.slots.iter().map(|s| s.0 as i32).collect();
    let slots = gpu
        .stream
        .clone_htod(&slots)
        .map_err(device_err("uploading slots"))?;
    let positions = Tensor::new(batch.positions.as_slice(), &device)?;
    let (cos, sin) = model.rope_rows(&positions)?;
    let eps = cfg.rms_norm_eps as f32;

    let mut x = weights.embedding.lookup(&batch.token_ids, &device)?;
    for (index, layer) in weights.layers.iter().enumerate() {
        // Every layer attends in a model the kernels take (`support::kernels_take`).
        let a = layer
            .attention()
            .ok_or_else(|| Error::Device("the CUDA backend runs attention layers only".into()))?;
        let h = candle_nn::ops::rms_norm(&x, &layer.attn_norm, eps)?;
        let rotary = cfg.layer_rotary(index);
        let q = model.rotate(&a.q.forward(&h)?, cfg.num_heads, rotary, &cos, &sin)?;
        let k = model.rotate(&a.k.forward(&h)?, cfg.num_kv_heads, rotary, &cos, &sin)?;
        let v = a.v.forward(&h)?.contiguous()?;
        write_kv(gpu, index, &k, &v, &slots, cfg.num_kv_heads, cfg.head_dim)?;
        let attn = attend(gpu, index, &q, &plan, model)?;
        x = (a.o.forward(&attn)? + x)?;
        let h = candle_nn::ops::rms_norm(&x, &layer.mlp_norm, eps)?;
        // A mixture is not one the kernels take (`support::kernels_take`).
        let mlp = layer.mlp.dense().ok_or_else(|| {
            Error::Device("the CUDA backend does not run a mixture of experts".into())
        })?;
        let gated = (candle_nn::ops::silu(&mlp.gate.forward(&h)?)? * mlp.up.forward(&h)?)?;
        x = (mlp.down.forward(&gated)? + x)?;
    }
    if batch.logit_rows.is_empty() {
        return Ok(None);
    }
    let wanted: Vec<u32> = batch.logit_rows.iter().map(|&r| r as u32).collect();
    let wanted = Tensor::new(wanted.as_slice(), &device)?;
    let x = x.index_select(&wanted, 0)?;
    let x = candle_nn::ops::rms_norm(&x, &weights.final_norm, eps)?;
    Ok(Some(weights.lm_head.forward(&x)?.to_dtype(DType::F32)?))
}

/// Writes the rows' K (`[1, kv_heads, rows, dim]`) and V (`[rows, kv_heads * dim]`) at
/// their slots in layer `layer`.
fn write_kv(
    gpu: &mut Gpu,
    layer: usize,
    k: &Tensor,
    v: &Tensor,
    slots: &CudaSlice<i32>,
    kv_heads: usize,
    dim: usize,
) -> Result<()> {
    let (rows, kv_heads, dim) = (v.dim(0)? as i32, kv_heads as i32, dim as i32);
    let (k_at, v_at) = gpu.planes(layer);
    let (k_store, k_layout) = k.storage_and_layout();
    let (v_store, v_layout) = v.storage_and_layout();
    let k_view = view::<f32>(&k_store, k_layout)?;
    let v_view = view::<f32>(&v_store, v_layout)?;
    let mut launch = gpu.stream.launch_builder(&gpu.kernels.kv_write);
    launch
        .arg(&k_view)
        .arg(&v_view)
        .arg(&mut gpu.cache)
        .arg(&k_at)
        .arg(&v_at)
        .arg(slots)
        .arg(&rows)
        .arg(&kv_heads)
        .arg(&dim);
    // SAFETY: the arguments match kv_write's signature; every slot was checked against the
    // cache by `TreeBatch::validate`, and k/v hold rows * kv_heads * dim values.
    unsafe { launch.launch(grid((rows as u32, 1, 1), 128)) }.map_err(device_err("kv_write"))?;
    Ok(())
}

/// Attention of the rows' queries (`[1, heads, rows, dim]`) over layer `layer`'s cache:
/// `[rows, heads * dim]` f32.
fn attend(gpu: &Gpu, layer: usize, q: &Tensor, plan: &Uploaded, model: &Model) -> Result<Tensor> {
    let cfg = model.config();
    let (rows, heads, dim) = (plan.rows, cfg.num_heads, cfg.head_dim);
    let mut out = gpu.scratch::<f32>(rows * heads * dim)?;
    {
        let (q_store, q_layout) = q.storage_and_layout();
        let q_view = view::<f32>(&q_store, q_layout)?;
        // q is [1, heads, rows, dim]: a row's next is dim values on, a head's rows * dim.
        let strides = (dim as i64, (rows * dim) as i64);
        let at = gpu.attend_at(plan);
        gpu.attend(cfg, layer, &at, &q_view, strides, &mut out, false, None)?;
    }
    Ok(gpu.tensor(out, (rows, heads * dim)))
}
