//! [`CudaBackend`]: a model on an NVIDIA GPU with its paged KV cache resident on the device.
//! [`Gpu`] owns what every pass shares: the stream, thicket's kernels (`kernels.cu`, loaded
//! once), the cache (one f16 allocation, `[layer][K|V][slot][kv_head][head_dim]`), the
//! per-forward plan upload and KV moves. The forward itself is one of two passes: the fused
//! f16 pass (`fused`: nine launches a layer, for f16 weights, the default; a decode or tree
//! step replayed from a CUDA graph) or candle's ops
//! around thicket's attention (`ops`: any other weights, e.g. `--dtype q`). Only the logits of
//! the rows asked for come back to the host.

use std::sync::Arc;

use candle_core::cuda::{CudaDevice, CudaStorage};
use candle_core::op::BackpropOp;
use candle_core::{Device, Layout, Storage, Tensor};
use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, CudaView, LaunchConfig, PushKernelArg};
use half::f16;
use kvcache::KvMove;

use super::attend::AttendAt;
use super::fused::FusedPass;
use super::plan::{attention_runs, move_waves, AttentionPlan, GRAPH_ROWS, SPLIT_KEYS};
use super::support::kernels_take;
use crate::backend::Backend;
use crate::model::config::ModelConfig;
use crate::model::Model;
use crate::tree_batch::TreeBatch;
use crate::{Error, Result};

const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/thicket_kernels.ptx"));
/// Threads per attention block (`ATT_THREADS` in `kernels.cu`).
pub(super) const ATTENTION_THREADS: u32 = 128;
/// Threads per block of the one-row-per-block kernels.
pub(super) const ROW_THREADS: u32 = 256;

/// A driver error as the engine's.
pub(super) fn device_err(what: &str) -> impl Fn(cudarc::driver::DriverError) -> Error + '_ {
    move |e| Error::Device(format!("{what}: {e}"))
}

/// One block per row (or per `grid`), `threads` threads, no dynamic shared memory.
pub(super) fn grid(grid_dim: (u32, u32, u32), threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim,
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// thicket's kernels, loaded on one device.
pub(super) struct Kernels {
    pub kv_write: CudaFunction,
    pub attention: CudaFunction,
    pub attention_f16: CudaFunction,
    pub attention_part: CudaFunction,
    pub attention_merge: CudaFunction,
    pub attention_merge_f16: CudaFunction,
    pub embed: CudaFunction,
    pub rms_norm: CudaFunction,
    pub add_rms_norm: CudaFunction,
    pub rope_kv: CudaFunction,
    pub swiglu: CudaFunction,
    pub kv_copy: CudaFunction,
    pub gather_rows: CudaFunction,
}

/// The device, its stream, thicket's kernels and the KV cache.
pub(super) struct Gpu {
    pub device: CudaDevice,
    pub stream: Arc<CudaStream>,
    /// candle's cuBLAS handle for the device, on `stream`.
    pub blas: Arc<cudarc::cublas::CudaBlas>,
    pub kernels: Kernels,
    /// `num_slots` slots and one spare (padding rows of a captured step write and read it).
    pub cache: CudaSlice<f16>,
    /// Slots the engine allocates.
    pub num_slots: usize,
    /// Keys per attention run (`SPLIT_KEYS`, or `THICKET_CUDA_SPLIT_KEYS`).
    pub split: usize,
    /// Halves in one slot of one plane (`kv_heads * head_dim`).
    pub width: usize,
    pub num_layers: usize,
    /// Page-locked staging for logits, grown to the largest copy so far.
    pinned: Option<cudarc::driver::PinnedHostSlice<f32>>,
}

/// A forward's plan on the device.
pub(super) struct Uploaded {
    pub words: CudaSlice<i32>,
    pub max_keys: usize,
    pub block_size: usize,
    pub rows: usize,
}

impl Gpu {
    fn new(device: CudaDevice, cfg: &ModelConfig, num_slots: usize) -> Result<Self> {
        if let Err(why) = kernels_take(cfg) {
            return Err(Error::Device(format!("the CUDA attention: {why}")));
        }
        let load = |name: &str| -> Result<CudaFunction> {
            Ok(device
                .get_or_load_custom_func(name, "thicket_kernels", PTX)?
                .into_cuda_function())
        };
        let kernels = Kernels {
            kv_write: load("kv_write")?,
            attention: load("tree_attention")?,
            attention_f16: load("tree_attention_f16")?,
            attention_part: load("tree_attention_part")?,
            attention_merge: load("tree_attention_merge")?,
            attention_merge_f16: load("tree_attention_merge_f16")?,
            embed: load("embed")?,
            rms_norm: load("rms_norm")?,
            add_rms_norm: load("add_rms_norm")?,
            rope_kv: load("rope_kv")?,
            swiglu: load("swiglu")?,
            kv_copy: load("kv_copy")?,
            gather_rows: load("gather_rows")?,
        };
        let width = cfg.kv_row_width();
        let stream = device.cuda_stream();
        let cache = stream
            .alloc_zeros::<f16>(cfg.num_layers * 2 * (num_slots + 1) * width)
            .map_err(device_err("allocating the KV cache"))?;
        let blas = device.cublas_handle();
        let split = std::env::var("THICKET_CUDA_SPLIT_KEYS")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|&v| v > 0)
            .unwrap_or(SPLIT_KEYS);
        Ok(Self {
            device,
            stream,
            blas,
            split,
            kernels,
            cache,
            num_slots,
            width,
            num_layers: cfg.num_layers,
            pinned: None,
        })
    }

    /// Makes the device's context current on this thread. A CUDA buffer freed on a thread
    /// where it is not fails, and cudarc keeps that failure (CUDA_ERROR_INVALID_CONTEXT) for
    /// the next call of any thread: the engine thread receives its backend from the thread
    /// that built it, and may drop it before running anything.
    fn bind(&self) -> Result<()> {
        let context = self.stream.context();
        // SAFETY: the context outlives this call (the stream holds it).
        unsafe { cudarc::driver::result::ctx::set_current(context.cu_ctx()) }
            .map_err(device_err("making the CUDA context current"))
    }

    /// Slots in one plane of the cache: the engine's and the spare one.
    fn plane_slots(&self) -> usize {
        self.num_slots + 1
    }

    /// The slot no sequence owns, written and read only by padding rows.
    pub fn spare_slot(&self) -> usize {
        self.num_slots
    }

    /// Offsets of layer `layer`'s K and V planes in the cache.
    pub fn planes(&self, layer: usize) -> (i64, i64) {
        let plane = (self.plane_slots() * self.width) as i64;
        let k = 2 * layer as i64 * plane;
        (k, k + plane)
    }

    /// Where attention reads `plan`.
    pub fn attend_at<'a>(&self, plan: &'a Uploaded) -> AttendAt<'a> {
        AttendAt {
            words: &plan.words,
            rows: plan.rows,
            runs: attention_runs(plan.max_keys, self.split),
            block_size: plan.block_size,
        }
    }

    /// `batch`'s plan on the device, and the most keys a row sees.
    pub fn upload_plan(&self, batch: &TreeBatch) -> Result<Uploaded> {
        let plan = AttentionPlan::new(batch)?;
        let words = self
            .stream
            .clone_htod(&plan.words)
            .map_err(device_err("uploading the forward's plan"))?;
        Ok(Uploaded {
            words,
            max_keys: plan.max_keys,
            block_size: batch.block_size,
            rows: batch.num_rows(),
        })
    }

    /// The f32 logits `[rows, vocab]` of a tensor on the host.
    pub fn logits_to_host(&mut self, logits: &Tensor) -> Result<Vec<Vec<f32>>> {
        let (rows, vocab) = logits.dims2()?;
        let (store, layout) = logits.storage_and_layout();
        let src = view::<f32>(&store, layout)?;
        self.copy_logits(&src, rows, vocab)
    }

    /// `rows` rows of `vocab` f32 logits on the host, through a page-locked buffer kept for
    /// the next forward (a pageable copy of many rows' logits costs more than the forward).
    pub fn copy_logits(
        &mut self,
        src: &CudaView<f32>,
        rows: usize,
        vocab: usize,
    ) -> Result<Vec<Vec<f32>>> {
        let len = rows * vocab;
        if src.len() < len {
            return Err(Error::Device("logits shorter than their rows".into()));
        }
        if self.pinned.as_ref().is_none_or(|p| p.len() < len) {
            self.pinned = None;
            // SAFETY: the buffer is written by the copy below before it is read.
            let pinned = unsafe { self.stream.context().alloc_pinned_with_flags::<f32>(len, 0) }
                .map_err(device_err("allocating page-locked memory"))?;
            self.pinned = Some(pinned);
        }
        let stream = self.stream.clone();
        let Some(pinned) = self.pinned.as_mut() else {
            return Err(Error::Device("no page-locked buffer".into()));
        };
        let host = pinned
            .as_mut_slice()
            .map_err(device_err("page-locked memory"))?;
        let host = &mut host[..len];
        // A copy into host memory is asynchronous and, on one stream, followed by no event:
        // wait for it before reading.
        stream
            .memcpy_dtoh(&src.slice(..len), host)
            .map_err(device_err("copying logits"))?;
        stream.synchronize().map_err(device_err("copying logits"))?;
        Ok(host.chunks(vocab.max(1)).map(<[f32]>::to_vec).collect())
    }

    /// `len` values the next kernel will write in full.
    pub fn scratch<T: cudarc::driver::DeviceRepr>(&self, len: usize) -> Result<CudaSlice<T>> {
        // SAFETY: every caller launches a kernel that writes all `len` values before any read.
        unsafe { self.stream.alloc::<T>(len) }.map_err(device_err("allocating scratch"))
    }

    /// A device buffer as a tensor of `shape` (for candle's ops).
    pub fn tensor<T: candle_core::cuda::CudaDType>(
        &self,
        values: CudaSlice<T>,
        shape: impl Into<candle_core::Shape>,
    ) -> Tensor {
        let storage = CudaStorage::wrap_cuda_slice(values, self.device.clone());
        Tensor::from_storage(Storage::Cuda(storage), shape, BackpropOp::none(), false)
    }

    /// Waits for everything queued (a forward that returns no logits ends here).
    pub fn synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(device_err("synchronizing"))
    }

    fn move_kv(&mut self, moves: &[KvMove]) -> Result<()> {
        if moves.iter().any(|m| m.group != kvcache::KvGroup::Full) {
            return Err(Error::InvalidBatch(
                "a windowed KV move: the CUDA backend keeps one KV space".into(),
            ));
        }
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
        let planes = (2 * self.num_layers) as u32;
        let plane = (self.plane_slots() * self.width) as i64;
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
            // SAFETY: the arguments match kv_copy's signature, every slot was checked above,
            // and no slot of a wave is both read and written (`move_waves`).
            unsafe { launch.launch(grid((wave.len() as u32, planes, 1), 128)) }
                .map_err(device_err("kv_copy"))?;
        }
        Ok(())
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        // Before the cache, the staging buffer and (in `CudaBackend`) the pass's weights are
        // freed by this thread.
        if let Err(e) = self.bind() {
            tracing::warn!("freeing the CUDA backend: {e}");
        }
    }
}

/// The values of a contiguous CUDA tensor of `T`, from its first element.
pub(super) fn view<'a, T: candle_core::cuda::CudaDType>(
    storage: &'a Storage,
    layout: &Layout,
) -> Result<CudaView<'a, T>> {
    let Storage::Cuda(storage) = storage else {
        return Err(Error::Device("a tensor off the CUDA device".into()));
    };
    if !layout.is_contiguous() {
        return Err(Error::Device(
            "a non-contiguous tensor given to a kernel".into(),
        ));
    }
    let start = layout.start_offset();
    let slice = storage.as_cuda_slice::<T>()?;
    Ok(slice.slice(start..start + layout.shape().elem_count()))
}

/// How the forward runs.
enum Pass {
    /// thicket's fused f16 pass.
    Fused(Box<FusedPass>),
    /// candle's ops around thicket's attention.
    Ops(Box<Model>),
}

/// A model on a CUDA device with a device-resident paged KV cache.
pub struct CudaBackend {
    gpu: Gpu,
    config: ModelConfig,
    pass: Pass,
    weights: String,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CudaBackend({:?}, {} slots)",
            self.gpu.device, self.gpu.num_slots
        )
    }
}

impl CudaBackend {
    /// `model` (loaded on a CUDA device) with a zeroed cache of `num_slots` rows per layer:
    /// the fused f16 pass where its weights are f16, candle's ops otherwise. A model its
    /// kernels do not take ([`kernels_take`]) is refused.
    pub fn new(model: Model, num_slots: usize) -> Result<Self> {
        let Device::Cuda(device) = model.device().clone() else {
            return Err(Error::Device(
                "the CUDA backend needs a model on a CUDA device".into(),
            ));
        };
        let config = model.config().clone();
        if let Err(why) = kernels_take(&config) {
            return Err(Error::Device(format!(
                "the CUDA backend does not take this model: {why}"
            )));
        }
        let gpu = Gpu::new(device, &config, num_slots)?;
        let weights = match model.quant_kernel() {
            Some(_) => "candle's CUDA quantized matmul".to_string(),
            None => {
                let dtype = model.weights().layers[0]
                    .attention()
                    .and_then(|a| a.q.dense_weight())
                    .map(Tensor::dtype);
                let dtype = dtype.map_or("dense".into(), |d| format!("{d:?}").to_lowercase());
                format!("cuBLAS {dtype}")
            }
        };
        let pass = match FusedPass::new(&model)? {
            Some(fused) => Pass::Fused(Box::new(fused)),
            None => Pass::Ops(Box::new(model)),
        };
        Ok(Self {
            gpu,
            config,
            pass,
            weights,
        })
    }
}

impl CudaBackend {
    /// Turns capturing steps as CUDA graphs on or off (on by default unless
    /// `THICKET_CUDA_GRAPHS=0`); off, every step runs launch by launch. Only the fused pass
    /// captures steps.
    pub fn set_graphs(&mut self, on: bool) {
        if let Pass::Fused(fused) = &mut self.pass {
            fused.set_graphs(on);
        }
    }

    /// Steps replayed from CUDA graphs, and graphs captured, so far.
    pub fn graph_counts(&self) -> (u64, u64) {
        match &self.pass {
            Pass::Fused(fused) => fused.graph_counts(),
            Pass::Ops(_) => (0, 0),
        }
    }
}

impl Backend for CudaBackend {
    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }

    fn num_slots(&self) -> usize {
        self.gpu.num_slots
    }

    fn describe(&self) -> String {
        let context = self.gpu.stream.context();
        let name = context.name().unwrap_or_else(|_| "unnamed GPU".into());
        let pass = match &self.pass {
            Pass::Fused(fused) if fused.graphs_enabled() => format!(
                "fused f16 pass, steps of up to {} rows replayed as CUDA graphs",
                GRAPH_ROWS[GRAPH_ROWS.len() - 1]
            ),
            Pass::Fused(_) => "fused f16 pass, launch by launch".into(),
            Pass::Ops(_) => "candle ops".into(),
        };
        format!(
            "cuda:{} ({name}), {pass}, thicket's paged tree attention, {}, device KV (f16)",
            context.ordinal(),
            self.weights
        )
    }

    fn forward(&mut self, batch: &TreeBatch) -> Result<Vec<Vec<f32>>> {
        batch.validate(
            self.config.vocab_size,
            self.config.max_position_embeddings,
            self.gpu.num_slots,
        )?;
        if !batch.hidden_outputs.is_empty() {
            return Err(Error::Device(
                "the CUDA backend returns logits only: pooling runs on the CPU backend".into(),
            ));
        }
        self.gpu.bind()?;
        let logits = match &mut self.pass {
            Pass::Fused(fused) => return fused.forward(&mut self.gpu, &self.config, batch),
            Pass::Ops(model) => super::ops::forward(&mut self.gpu, model, batch)?,
        };
        match logits {
            Some(logits) => self.gpu.logits_to_host(&logits),
            None => {
                self.gpu.synchronize()?;
                Ok(Vec::new())
            }
        }
    }

    fn move_kv(&mut self, moves: &[KvMove]) -> Result<()> {
        self.gpu.bind()?;
        self.gpu.move_kv(moves)
    }
}
