//! Paged tree attention launched on the device: [`AttendAt`] (where a step's plan is and its
//! shape) and [`Gpu::attend`], which runs a layer's attention for every row in one pass, or,
//! for rows that see more keys than one run holds (`Gpu::split`), in runs of keys (one
//! block each) merged by a second kernel.

use cudarc::driver::{CudaSlice, CudaView, LaunchArgs, PushKernelArg};
use half::f16;

use super::device::{device_err, grid, Gpu, ATTENTION_THREADS};
use crate::model::config::ModelConfig;
use crate::{Error, Result};

/// The arguments the attention kernels share, pushed in their order: `lead` before the
/// output, `tail` after it.
struct AttentionArgs {
    q_row: i64,
    q_head: i64,
    k_at: i64,
    v_at: i64,
    heads: i32,
    kv_heads: i32,
    dim: i32,
    block_size: i32,
    scale: f32,
}

impl AttentionArgs {
    /// q, its strides, the cache, the layer's planes and the plan.
    fn lead<'a>(
        &'a self,
        launch: &mut LaunchArgs<'a>,
        q: &'a CudaView<'_, f32>,
        cache: &'a CudaSlice<f16>,
        plan: &'a CudaSlice<i32>,
    ) {
        launch
            .arg(q)
            .arg(&self.q_row)
            .arg(&self.q_head)
            .arg(cache)
            .arg(&self.k_at)
            .arg(&self.v_at)
            .arg(plan);
    }

    /// The shape, block size and softmax scale.
    fn tail<'a>(&'a self, launch: &mut LaunchArgs<'a>) {
        launch
            .arg(&self.heads)
            .arg(&self.kv_heads)
            .arg(&self.dim)
            .arg(&self.block_size)
            .arg(&self.scale);
    }
}

/// Where attention reads a step's plan, and the step's shape.
pub(super) struct AttendAt<'a> {
    pub words: &'a CudaSlice<i32>,
    pub rows: usize,
    /// Runs of `Gpu::split` keys per (row, head): 1 for one pass, else split and merged.
    pub runs: usize,
    pub block_size: usize,
}

impl Gpu {
    /// Paged tree attention of layer `layer` for every row of `at` into `out`
    /// (`[rows, heads * dim]`, f32 or f16 by `out_f16`); q's element (row, head, d) is at
    /// `row * q_row + head * q_head + d`. Rows of more than `self.split` keys go through
    /// `parts` (allocated here when not given).
    #[allow(clippy::too_many_arguments)]
    pub fn attend<O: cudarc::driver::DeviceRepr>(
        &self,
        cfg: &ModelConfig,
        layer: usize,
        at: &AttendAt,
        q: &CudaView<f32>,
        (q_row, q_head): (i64, i64),
        out: &mut CudaSlice<O>,
        out_f16: bool,
        parts: Option<&mut CudaSlice<f32>>,
    ) -> Result<()> {
        let (k_at, v_at) = self.planes(layer);
        let args = AttentionArgs {
            q_row,
            q_head,
            k_at,
            v_at,
            heads: cfg.num_heads as i32,
            kv_heads: cfg.num_kv_heads as i32,
            dim: cfg.head_dim as i32,
            block_size: at.block_size as i32,
            scale: 1f32 / (cfg.head_dim as f32).sqrt(),
        };
        let (heads, rows) = (cfg.num_heads as u32, at.rows as u32);
        let runs = at.runs.max(1);
        if runs == 1 {
            let kernel = if out_f16 {
                &self.kernels.attention_f16
            } else {
                &self.kernels.attention
            };
            let mut launch = self.stream.launch_builder(kernel);
            args.lead(&mut launch, q, &self.cache, at.words);
            launch.arg(out);
            args.tail(&mut launch);
            // SAFETY: tree_attention's signature; the plan's block ids and slots were checked
            // against the cache by `TreeBatch::validate`, and out holds rows * heads * dim.
            unsafe { launch.launch(grid((heads, rows, 1), ATTENTION_THREADS)) }
                .map_err(device_err("tree_attention"))?;
            return Ok(());
        }
        let len = at.rows * cfg.num_heads * runs * (cfg.head_dim + 2);
        let mut own = None;
        let parts = match parts {
            Some(parts) if parts.len() >= len => parts,
            Some(_) => return Err(Error::Device("attention runs overrun their buffer".into())),
            None => own.insert(self.scratch::<f32>(len)?),
        };
        let split = self.split as i32;
        let mut launch = self.stream.launch_builder(&self.kernels.attention_part);
        args.lead(&mut launch, q, &self.cache, at.words);
        launch.arg(&mut *parts);
        args.tail(&mut launch);
        launch.arg(&split);
        // SAFETY: tree_attention_part's signature; as above, and parts holds a run's
        // dim + 2 values for every (row, head, run).
        unsafe { launch.launch(grid((heads, rows, runs as u32), ATTENTION_THREADS)) }
            .map_err(device_err("tree_attention_part"))?;
        let kernel = if out_f16 {
            &self.kernels.attention_merge_f16
        } else {
            &self.kernels.attention_merge
        };
        let runs_i = runs as i32;
        let mut launch = self.stream.launch_builder(kernel);
        launch
            .arg(&*parts)
            .arg(at.words)
            .arg(out)
            .arg(&args.heads)
            .arg(&args.dim)
            .arg(&split)
            .arg(&runs_i);
        // SAFETY: tree_attention_merge's signature; every run a row uses was written above.
        unsafe { launch.launch(grid((heads, rows, 1), 128)) }
            .map_err(device_err("tree_attention_merge"))?;
        Ok(())
    }
}
