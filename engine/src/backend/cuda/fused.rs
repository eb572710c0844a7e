//! The CUDA backend's fused f16 pass, for models whose projections are f16 (GGUF weights
//! dequantized at load, the default on a GPU). q, k and v are one projection, gate and up
//! another; everything between the four cuBLAS products per layer is one thicket kernel:
//! the residual add with the next RMSNorm, RoPE with the K/V write into the cache, paged
//! tree attention, SwiGLU. Nine launches a layer, against about thirty for candle's ops
//! (each of which also converts f32 activations to f16 and back around every product).
//! Activations between kernels are f16 (what the f16 products read anyway); the residual
//! stream, norms, RoPE, softmax and SwiGLU are f32. The products are cuBLAS calls on the
//! pass's own buffers (`arena`), so a step allocates nothing and can be captured as a CUDA
//! graph (`graphs`): a decode or tree step is then one launch.

use candle_core::{DType, Tensor};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, PushKernelArg};
use half::f16;

use super::arena::{Arena, Buffers, Room};
use super::attend::AttendAt;
use super::device::{device_err, grid, view, Gpu, ROW_THREADS};
use super::graphs::{Graphs, Shape};
use super::plan::{attention_runs, graph_rows, graph_runs, AttentionPlan};
use crate::model::config::{ModelConfig, RopeStyle};
use crate::model::linear::Linear;
use crate::model::Model;
use crate::tree_batch::TreeBatch;
use crate::{Error, Result};

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

/// The fused pass: its weights, the buffers its steps reuse and its captured steps.
pub(super) struct FusedPass {
    weights: Weights,
    buffers: Buffers,
    graphs: Graphs,
}

/// The fused pass's weights, each product's `[out, in]` f16 and contiguous.
struct Weights {
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
        .and_then(|w| w.contiguous().ok())
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
            let Some(a) = layer.attention() else {
                return Ok(None);
            };
            let qkv: Option<Vec<Tensor>> = [&a.q, &a.k, &a.v]
                .iter()
                .map(|l| {
                    l.dense_weight()
                        .filter(|w| w.dtype() == DType::F16)
                        .cloned()
                })
                .collect();
            let Some(mlp) = layer.mlp.dense() else {
                return Ok(None);
            };
            let (Some(qkv), Some(o), Some(gate), Some(up), Some(down)) = (
                qkv,
                f16_weight(&a.o),
                f16_weight(&mlp.gate),
                f16_weight(&mlp.up),
                f16_weight(&mlp.down),
            ) else {
                return Ok(None);
            };
            let qkv_bias = if [&a.q, &a.k, &a.v].iter().any(|l| l.bias().is_some()) {
                let parts: Vec<Tensor> = [&a.q, &a.k, &a.v]
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
        let weights = Weights {
            embedding: f32_contiguous(&weights.embedding.dense()?.to_device(model.device())?)?,
            layers,
            final_norm: f32_contiguous(&weights.final_norm)?,
            lm_head,
            cos: f32_contiguous(cos)?,
            sin: f32_contiguous(sin)?,
            interleaved: i32::from(model.config().rope_style == RopeStyle::Interleaved),
            no_bias,
        };
        Ok(Some(Self {
            weights,
            buffers: Buffers::default(),
            graphs: Graphs::new(),
        }))
    }

    /// Turns capturing steps as graphs on or off.
    pub fn set_graphs(&mut self, on: bool) {
        self.graphs.set_enabled(on);
    }

    /// Whether steps are captured as graphs.
    pub fn graphs_enabled(&self) -> bool {
        self.graphs.enabled()
    }

    /// Steps replayed from graphs and graphs captured so far.
    pub fn graph_counts(&self) -> (u64, u64) {
        (self.graphs.replays, self.graphs.captures)
    }

    /// Runs `batch`; the f32 logits of its logit rows (none when it asks for none). A batch
    /// of up to `GRAPH_ROWS`' largest rows runs padded to its captured size, from a CUDA
    /// graph once its shape has recurred; a larger one runs launch by launch.
    pub fn forward(
        &mut self,
        gpu: &mut Gpu,
        cfg: &ModelConfig,
        batch: &TreeBatch,
    ) -> Result<Vec<Vec<f32>>> {
        let wanted = batch.logit_rows.len();
        let padded = if self.graphs.enabled() {
            graph_rows(batch.num_rows())
        } else {
            None
        };
        let (plan, rows, runs, logits) = match padded {
            Some(rows) => {
                let plan = AttentionPlan::padded(batch, rows, gpu.spare_slot())?;
                let runs = graph_runs(plan.max_keys, gpu.split);
                (plan, rows, runs, if wanted > 0 { rows } else { 0 })
            }
            None => {
                let plan = AttentionPlan::new(batch)?;
                let runs = attention_runs(plan.max_keys, gpu.split);
                (plan, batch.num_rows(), runs, wanted)
            }
        };
        let room = Room {
            rows,
            logits,
            runs,
            words: plan.words.len(),
        };
        let stream = gpu.stream.clone();
        let (arena, grown) = self.buffers.hold(&stream, cfg, room)?;
        if grown {
            self.graphs.clear();
        }
        let mut words = arena.plan.slice_mut(..plan.words.len());
        stream
            .memcpy_htod(plan.words.as_slice(), &mut words)
            .map_err(device_err("uploading the step's plan"))?;
        let step = Step {
            rows,
            runs,
            logits,
            logits_at: plan.logits_at as i32,
            block_size: batch.block_size,
        };
        let weights = &self.weights;
        let replayed = match padded {
            Some(_) => {
                let shape = Shape {
                    rows,
                    runs,
                    logits: logits > 0,
                };
                self.graphs
                    .run(&stream, shape, || weights.record(gpu, arena, cfg, &step))?
            }
            None => false,
        };
        if !replayed {
            weights.record(gpu, arena, cfg, &step)?;
        }
        if wanted == 0 {
            gpu.synchronize()?;
            return Ok(Vec::new());
        }
        let logits = arena.logits.slice(..wanted * cfg.vocab_size);
        gpu.copy_logits(&logits, wanted, cfg.vocab_size)
    }
}

/// One step's shape as the launches see it.
struct Step {
    rows: usize,
    runs: usize,
    /// Rows through the LM head (the first of the plan's logit list).
    logits: usize,
    logits_at: i32,
    block_size: usize,
}

impl Weights {
    /// Queues `step`'s launches: the embedding, every layer, the final norm, and the LM head
    /// over the rows of the plan's logit list, into `arena.logits`. Queued on the stream as
    /// they are (launch by launch) or into a capture (a graph), alike.
    fn record(&self, gpu: &Gpu, arena: &mut Arena, cfg: &ModelConfig, step: &Step) -> Result<()> {
        let rows = step.rows;
        let (hidden, heads, kv_heads, dim) = (
            cfg.hidden_size,
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
        );
        let ffn = cfg.intermediate_size;
        let by_rows = grid((rows as u32, 1, 1), ROW_THREADS);
        let (hidden_i, heads_i, kv_i, dim_i, ffn_i) = (
            hidden as i32,
            heads as i32,
            kv_heads as i32,
            dim as i32,
            ffn as i32,
        );
        let eps = cfg.rms_norm_eps as f32;
        let Arena {
            plan,
            x,
            h,
            qkv,
            q,
            attn,
            delta,
            gate_up,
            gated,
            parts,
            picked,
            logits,
            ..
        } = arena;
        {
            let (table, layout) = self.embedding.storage_and_layout();
            let table = view::<f32>(&table, layout)?;
            let mut launch = gpu.stream.launch_builder(&gpu.kernels.embed);
            launch.arg(&table).arg(&*plan).arg(&mut *x).arg(&hidden_i);
            // SAFETY: embed's signature; every token was checked against the vocabulary
            // (padding rows read token 0).
            unsafe { launch.launch(by_rows) }.map_err(device_err("embed"))?;
        }
        let at = AttendAt {
            words: &*plan,
            rows,
            runs: step.runs,
            block_size: step.block_size,
        };
        for (index, layer) in self.layers.iter().enumerate() {
            let first = index == 0;
            norm(
                gpu,
                x,
                (!first).then_some(&*delta),
                &layer.attn_norm,
                h,
                rows,
                (hidden_i, eps),
            )?;
            let qkv_n = (heads + 2 * kv_heads) * dim;
            gemm(gpu, h, &layer.qkv, qkv, false, (rows, qkv_n, hidden))?;
            let (k_at, v_at) = gpu.planes(index);
            {
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
                    .arg(&*qkv)
                    .arg(&bias)
                    .arg(&has_bias)
                    .arg(&cos)
                    .arg(&sin)
                    .arg(at.words)
                    .arg(&mut *q)
                    .arg(&gpu.cache)
                    .arg(&k_at)
                    .arg(&v_at)
                    .arg(&heads_i)
                    .arg(&kv_i)
                    .arg(&dim_i)
                    .arg(&self.interleaved);
                // SAFETY: rope_kv's signature; slots and positions were checked by
                // `TreeBatch::validate` (positions below the RoPE table's length; padding
                // rows write the spare slot at position 0).
                unsafe { launch.launch(by_rows) }.map_err(device_err("rope_kv"))?;
            }
            // q is [rows, heads, dim].
            let strides = ((heads * dim) as i64, dim as i64);
            gpu.attend(
                cfg,
                index,
                &at,
                &q.slice(..),
                strides,
                attn,
                true,
                Some(&mut *parts),
            )?;
            gemm(
                gpu,
                attn,
                &layer.o,
                delta,
                false,
                (rows, hidden, heads * dim),
            )?;
            norm(
                gpu,
                x,
                Some(&*delta),
                &layer.mlp_norm,
                h,
                rows,
                (hidden_i, eps),
            )?;
            gemm(
                gpu,
                h,
                &layer.gate_up,
                gate_up,
                false,
                (rows, 2 * ffn, hidden),
            )?;
            {
                let mut launch = gpu.stream.launch_builder(&gpu.kernels.swiglu);
                launch.arg(&*gate_up).arg(&mut *gated).arg(&ffn_i);
                // SAFETY: swiglu's signature; gate_up holds rows * 2 * ffn values.
                unsafe { launch.launch(by_rows) }.map_err(device_err("swiglu"))?;
            }
            gemm(gpu, gated, &layer.down, delta, false, (rows, hidden, ffn))?;
        }
        norm(
            gpu,
            x,
            Some(&*delta),
            &self.final_norm,
            h,
            rows,
            (hidden_i, eps),
        )?;
        if step.logits == 0 {
            return Ok(());
        }
        {
            let mut launch = gpu.stream.launch_builder(&gpu.kernels.gather_rows);
            launch
                .arg(&*h)
                .arg(&*plan)
                .arg(&step.logits_at)
                .arg(&mut *picked)
                .arg(&hidden_i);
            // SAFETY: gather_rows's signature; the logit list holds `logits` row indices
            // below `rows`, and picked holds logits * hidden values.
            unsafe { launch.launch(grid((step.logits as u32, 1, 1), ROW_THREADS)) }
                .map_err(device_err("gather_rows"))?;
        }
        gemm(
            gpu,
            picked,
            &self.lm_head,
            logits,
            true,
            (step.logits, cfg.vocab_size, hidden),
        )
    }
}

/// `out[m, n] = x[m, k] · w[n, k]ᵀ` (row-major), f16 operands accumulated in f32 by cuBLAS
/// (as candle's f16 matmul does), `out` f16 or, with `out_f32`, f32.
fn gemm<T: cudarc::driver::DeviceRepr>(
    gpu: &Gpu,
    x: &CudaSlice<f16>,
    w: &Tensor,
    out: &mut CudaSlice<T>,
    out_f32: bool,
    (m, n, k): (usize, usize, usize),
) -> Result<()> {
    use cudarc::cublas::sys::{
        cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType_t,
    };
    let (store, layout) = w.storage_and_layout();
    let w = view::<f16>(&store, layout)?;
    if x.len() < m * k || w.len() < n * k || out.len() < m * n {
        return Err(Error::Device(format!(
            "a product of {m}x{k} by {k}x{n} overruns its buffers"
        )));
    }
    let stream = &gpu.stream;
    let (x_ptr, _x) = x.device_ptr(stream);
    let (w_ptr, _w) = w.device_ptr(stream);
    let (out_ptr, _out) = out.device_ptr_mut(stream);
    let (alpha, beta) = (1f32, 0f32);
    let out_type = if out_f32 {
        cudaDataType_t::CUDA_R_32F
    } else {
        cudaDataType_t::CUDA_R_16F
    };
    let int = |v: usize| i32::try_from(v).map_err(|_| Error::Device(format!("{v} overflows i32")));
    // SAFETY: the pointers are live device buffers of the sizes checked above on the
    // handle's stream; column-major, out^T [n, m] = w [n, k] · x^T [k, m].
    unsafe {
        cudarc::cublas::result::gemm_strided_batched_ex(
            *gpu.blas.handle(),
            cublasOperation_t::CUBLAS_OP_T,
            cublasOperation_t::CUBLAS_OP_N,
            int(n)?,
            int(m)?,
            int(k)?,
            (&alpha as *const f32).cast(),
            w_ptr as *const std::ffi::c_void,
            cudaDataType_t::CUDA_R_16F,
            int(k)?,
            (n * k) as i64,
            x_ptr as *const std::ffi::c_void,
            cudaDataType_t::CUDA_R_16F,
            int(k)?,
            (m * k) as i64,
            (&beta as *const f32).cast(),
            out_ptr as *mut std::ffi::c_void,
            out_type,
            int(n)?,
            (m * n) as i64,
            1,
            cublasComputeType_t::CUBLAS_COMPUTE_32F,
            cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT_TENSOR_OP,
        )
    }
    .map_err(|e| Error::Device(format!("cuBLAS product: {e:?}")))
}

/// `x += delta` (when given), then RMSNorm of `x` with `gamma` into `out` as f16 rows.
#[allow(clippy::too_many_arguments)]
fn norm(
    gpu: &Gpu,
    x: &mut CudaSlice<f32>,
    delta: Option<&CudaSlice<f16>>,
    gamma: &Tensor,
    out: &mut CudaSlice<f16>,
    rows: usize,
    (hidden, eps): (i32, f32),
) -> Result<()> {
    let (gamma_store, gamma_layout) = gamma.storage_and_layout();
    let gamma = view::<f32>(&gamma_store, gamma_layout)?;
    let config = grid((rows as u32, 1, 1), ROW_THREADS);
    match delta {
        Some(delta) => {
            let mut launch = gpu.stream.launch_builder(&gpu.kernels.add_rms_norm);
            launch
                .arg(x)
                .arg(delta)
                .arg(&gamma)
                .arg(out)
                .arg(&hidden)
                .arg(&eps);
            // SAFETY: add_rms_norm's signature; x, delta and out hold rows * hidden.
            unsafe { launch.launch(config) }.map_err(device_err("add_rms_norm"))?;
        }
        None => {
            let mut launch = gpu.stream.launch_builder(&gpu.kernels.rms_norm);
            launch.arg(x).arg(&gamma).arg(out).arg(&hidden).arg(&eps);
            // SAFETY: rms_norm's signature; x and out hold rows * hidden values.
            unsafe { launch.launch(config) }.map_err(device_err("rms_norm"))?;
        }
    }
    Ok(())
}
