//! [`CudaBackend`]: a model on an NVIDIA GPU with its paged KV cache resident on the device.
//! The weights stay where loading put them (GGUF tensors quantized, run by candle's CUDA
//! quantized matmuls, or dequantized with `--dtype bf16|f16|f32` and run by cuBLAS); norms,
//! RoPE, SwiGLU and residuals are candle's CUDA ops; K/V writes, paged tree attention and KV
//! row copies are thicket's own kernels (`kernels.cu`). The cache is one device allocation of
//! f16, `[layer][K|V][slot][kv_head][head_dim]`; each forward uploads one packed plan (block
//! tables and every row's visible tree slots) and the rows' slots, and copies back only the
//! logits of the rows asked for.

use std::sync::Arc;

use candle_core::cuda::{CudaDevice, CudaStorage};
use candle_core::op::BackpropOp;
use candle_core::{DType, Device, Storage, Tensor};
use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use half::f16;
use kvcache::KvMove;

use super::plan::{move_waves, AttentionPlan};
use crate::backend::Backend;
use crate::batch::TreeBatch;
use crate::model::Model;
use crate::{Error, Result};

const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/thicket_kernels.ptx"));
/// Threads per attention block (`WARPS * 32` in `kernels.cu`).
const ATTENTION_THREADS: u32 = 256;
/// The widest head `kernels.cu` holds per lane (8 values for each of 32 lanes).
const MAX_HEAD_DIM: usize = 256;

fn device_err(what: &str) -> impl Fn(cudarc::driver::DriverError) -> Error + '_ {
    move |e| Error::Device(format!("{what}: {e}"))
}

/// thicket's kernels, loaded on one device.
struct Kernels {
    kv_write: CudaFunction,
    attention: CudaFunction,
    kv_copy: CudaFunction,
}

/// A model on a CUDA device with a device-resident paged KV cache.
pub struct CudaBackend {
    model: Model,
    device: CudaDevice,
    stream: Arc<CudaStream>,
    kernels: Kernels,
    cache: CudaSlice<f16>,
    num_slots: usize,
    /// Halves in one slot of one plane (`kv_heads * head_dim`).
    width: usize,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CudaBackend({:?}, {} slots)",
            self.device, self.num_slots
        )
    }
}

impl CudaBackend {
    /// `model` (loaded on a CUDA device) with a zeroed cache of `num_slots` rows per layer.
    pub fn new(model: Model, num_slots: usize) -> Result<Self> {
        let Device::Cuda(device) = model.device().clone() else {
            return Err(Error::Device(
                "the CUDA backend needs a model on a CUDA device".into(),
            ));
        };
        let cfg = model.config();
        if !cfg.head_dim.is_multiple_of(32) || cfg.head_dim > MAX_HEAD_DIM {
            return Err(Error::Device(format!(
                "head_dim {} not supported by the CUDA attention (a multiple of 32, at most {MAX_HEAD_DIM})",
                cfg.head_dim
            )));
        }
        let load = |name: &str| -> Result<CudaFunction> {
            Ok(device
                .get_or_load_custom_func(name, "thicket_kernels", PTX)?
                .into_cuda_function())
        };
        let kernels = Kernels {
            kv_write: load("kv_write")?,
            attention: load("tree_attention")?,
            kv_copy: load("kv_copy")?,
        };
        let width = cfg.kv_row_width();
        let len = cfg.num_layers * 2 * num_slots * width;
        let stream = device.cuda_stream();
        let cache = stream
            .alloc_zeros::<f16>(len)
            .map_err(device_err("allocating the KV cache"))?;
        Ok(Self {
            model,
            device,
            stream,
            kernels,
            cache,
            num_slots,
            width,
        })
    }

    /// Offsets of layer `layer`'s K and V planes in the cache.
    fn planes(&self, layer: usize) -> (i64, i64) {
        let plane = (self.num_slots * self.width) as i64;
        let k = 2 * layer as i64 * plane;
        (k, k + plane)
    }

    /// Writes the rows' K (`[1, kv_heads, rows, dim]`) and V (`[rows, kv_heads * dim]`) at
    /// their slots in layer `layer`.
    fn write_kv(
        &mut self,
        layer: usize,
        k: &Tensor,
        v: &Tensor,
        slots: &CudaSlice<i32>,
    ) -> Result<()> {
        let cfg = self.model.config();
        let (rows, kv_heads, dim) = (
            v.dim(0)? as i32,
            cfg.num_kv_heads as i32,
            cfg.head_dim as i32,
        );
        let (k_at, v_at) = self.planes(layer);
        let (k_store, k_layout) = k.storage_and_layout();
        let (v_store, v_layout) = v.storage_and_layout();
        let k_view = f32_view(&k_store, k_layout)?;
        let v_view = f32_view(&v_store, v_layout)?;
        let mut launch = self.stream.launch_builder(&self.kernels.kv_write);
        launch
            .arg(&k_view)
            .arg(&v_view)
            .arg(&mut self.cache)
            .arg(&k_at)
            .arg(&v_at)
            .arg(slots)
            .arg(&rows)
            .arg(&kv_heads)
            .arg(&dim);
        let config = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the arguments match kv_write's signature; every slot was checked against
        // the cache by `Model::validate`, and k/v hold rows * kv_heads * dim values.
        unsafe { launch.launch(config) }.map_err(device_err("kv_write"))?;
        Ok(())
    }

    /// Attention of the rows' queries (`[1, heads, rows, dim]`) over layer `layer`'s cache:
    /// `[rows, heads * dim]`.
    fn attend(
        &self,
        layer: usize,
        q: &Tensor,
        plan: &CudaSlice<i32>,
        rows: usize,
        block_size: usize,
    ) -> Result<Tensor> {
        let cfg = self.model.config();
        let (heads, kv_heads, dim) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
        let (k_at, v_at) = self.planes(layer);
        // SAFETY: tree_attention writes every one of the rows * heads * dim values.
        let mut out = unsafe { self.stream.alloc::<f32>(rows * heads * dim) }
            .map_err(device_err("allocating attention output"))?;
        {
            let (q_store, q_layout) = q.storage_and_layout();
            let q_view = f32_view(&q_store, q_layout)?;
            let (rows_i, heads_i, kv_i, dim_i) =
                (rows as i32, heads as i32, kv_heads as i32, dim as i32);
            let block_size = block_size as i32;
            let scale = 1f32 / (dim as f32).sqrt();
            let mut launch = self.stream.launch_builder(&self.kernels.attention);
            launch
                .arg(&q_view)
                .arg(&self.cache)
                .arg(&k_at)
                .arg(&v_at)
                .arg(plan)
                .arg(&mut out)
                .arg(&rows_i)
                .arg(&heads_i)
                .arg(&kv_i)
                .arg(&dim_i)
                .arg(&block_size)
                .arg(&scale);
            let config = LaunchConfig {
                grid_dim: (heads as u32, rows as u32, 1),
                block_dim: (ATTENTION_THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: the arguments match tree_attention's signature; the plan's block ids
            // and slots were checked against the cache by `Model::validate`.
            unsafe { launch.launch(config) }.map_err(device_err("tree_attention"))?;
        }
        let storage = CudaStorage::wrap_cuda_slice(out, self.device.clone());
        Ok(Tensor::from_storage(
            Storage::Cuda(storage),
            (rows, heads * dim),
            BackpropOp::none(),
            false,
        ))
    }
}

/// The f32 values of a contiguous CUDA tensor, from its first element.
fn f32_view<'a>(
    storage: &'a Storage,
    layout: &candle_core::Layout,
) -> Result<cudarc::driver::CudaView<'a, f32>> {
    let Storage::Cuda(storage) = storage else {
        return Err(Error::Device("a tensor off the CUDA device".into()));
    };
    if !layout.is_contiguous() {
        return Err(Error::Device(
            "a non-contiguous tensor given to a kernel".into(),
        ));
    }
    let start = layout.start_offset();
    let slice = storage.as_cuda_slice::<f32>()?;
    Ok(slice.slice(start..start + layout.shape().elem_count()))
}

impl Backend for CudaBackend {
    fn vocab_size(&self) -> usize {
        self.model.config().vocab_size
    }

    fn num_slots(&self) -> usize {
        self.num_slots
    }

    fn describe(&self) -> String {
        let kernel = match self.model.quant_kernel() {
            Some(_) => "candle's CUDA quantized matmul".to_string(),
            None => {
                let dtype = self.model.weights().layers[0].q.dense_dtype();
                format!(
                    "cuBLAS {}",
                    dtype.map_or("dense".into(), |d| format!("{d:?}").to_lowercase())
                )
            }
        };
        let context = self.stream.context();
        let name = context.name().unwrap_or_else(|_| "unnamed GPU".into());
        format!(
            "cuda:{} ({name}), thicket's paged tree attention, {kernel}, device KV (f16)",
            context.ordinal()
        )
    }

    fn forward(&mut self, batch: &TreeBatch) -> Result<Vec<Vec<f32>>> {
        self.model.validate(batch, self.num_slots)?;
        let model = self.model.clone();
        let cfg = model.config();
        let weights = model.weights();
        let rows = batch.num_rows();
        let device = Device::Cuda(self.device.clone());
        let plan = AttentionPlan::new(batch)?;
        let plan = self
            .stream
            .clone_htod(&plan.words)
            .map_err(device_err("uploading the attention plan"))?;
        let slots: Vec<i32> = batch.slots.iter().map(|s| s.0 as i32).collect();
        let slots = self
            .stream
            .clone_htod(&slots)
            .map_err(device_err("uploading slots"))?;
        let ids = Tensor::new(batch.token_ids.as_slice(), &device)?;
        let positions = Tensor::new(batch.positions.as_slice(), &device)?;
        let (cos, sin) = model.rope_rows(&positions)?;
        let eps = cfg.rms_norm_eps as f32;

        let mut x = weights.embedding.index_select(&ids, 0)?;
        for (index, layer) in weights.layers.iter().enumerate() {
            let h = candle_nn::ops::rms_norm(&x, &layer.attn_norm, eps)?;
            let q = model.rotate(&layer.q.forward(&h)?, cfg.num_heads, &cos, &sin)?;
            let k = model.rotate(&layer.k.forward(&h)?, cfg.num_kv_heads, &cos, &sin)?;
            let v = layer.v.forward(&h)?.contiguous()?;
            self.write_kv(index, &k, &v, &slots)?;
            let attn = self.attend(index, &q, &plan, rows, batch.block_size)?;
            x = (layer.o.forward(&attn)? + x)?;
            let h = candle_nn::ops::rms_norm(&x, &layer.mlp_norm, eps)?;
            let gated =
                (candle_nn::ops::silu(&layer.gate.forward(&h)?)? * layer.up.forward(&h)?)?;
            x = (layer.down.forward(&gated)? + x)?;
        }
        if batch.logit_rows.is_empty() {
            // The rows' K/V are written; nothing is read back, so wait for the writes here
            // (a later forward on the same stream would see them anyway).
            self.stream
                .synchronize()
                .map_err(device_err("synchronizing"))?;
            return Ok(Vec::new());
        }
        let wanted: Vec<u32> = batch.logit_rows.iter().map(|&r| r as u32).collect();
        let wanted = Tensor::new(wanted.as_slice(), &device)?;
        let x = x.index_select(&wanted, 0)?;
        let x = candle_nn::ops::rms_norm(&x, &weights.final_norm, eps)?;
        let logits = weights.lm_head.forward(&x)?.to_dtype(DType::F32)?;
        Ok(logits.to_vec2::<f32>()?)
    }

    fn move_kv(&mut self, moves: &[KvMove]) -> Result<()> {
        if let Some(bad) = moves
            .iter()
            .flat_map(|m| [m.from, m.to])
            .find(|s| s.index() >= self.num_slots)
        {
            return Err(Error::InvalidBatch(format!(
                "slot {} outside KV store of {} slots",
                bad.0, self.num_slots
            )));
        }
        let planes = (2 * self.model.config().num_layers) as u32;
        let plane = (self.num_slots * self.width) as i64;
        let width = self.width as i32;
        for wave in move_waves(moves) {
            let pairs: Vec<i32> = wave
                .iter()
                .flat_map(|m| [m.from.0 as i32, m.to.0 as i32])
                .collect();
            let pairs = self
                .stream
                .clone_htod(&pairs)
                .map_err(device_err("uploading KV moves"))?;
            let mut launch = self.stream.launch_builder(&self.kernels.kv_copy);
            launch
                .arg(&mut self.cache)
                .arg(&pairs)
                .arg(&plane)
                .arg(&width);
            let config = LaunchConfig {
                grid_dim: (wave.len() as u32, planes, 1),
                block_dim: (128, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: the arguments match kv_copy's signature, every slot was checked above,
            // and no slot of a wave is both read and written (`move_waves`).
            unsafe { launch.launch(config) }.map_err(device_err("kv_copy"))?;
        }
        Ok(())
    }
}
