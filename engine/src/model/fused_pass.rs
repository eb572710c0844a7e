//! `FusedWeights`: the decoder's forward on the CPU as thicket's own code, one pass per layer over
//! preallocated buffers. RMSNorm writes rows that are quantized once for the q/k/v products (and
//! once for gate/up) of thicket's quantized kernel, RoPE rotates Q straight into the head-major
//! layout the attention kernel reads and K in place, the MLP (`experts::fused`: a gated MLP whose
//! activation is computed row by row as the down projection quantizes its input, or a mixture of
//! experts, each chosen expert run once over its rows) follows, and the residual adds run over
//! the rows in place: where every projection is on thicket's kernel (the default for GGUF's
//! 32-value formats, and for Q4_K/Q6_K on AVX-512) there is no candle op dispatch and no tensor
//! allocation per layer, and the matmuls and attention spread over one team of the thread
//! pool's workers, recruited once per forward (`cpu::team`). Projections thicket's kernel does
//! not take (dense weights; Q4_K/Q6_K without AVX-512) run through their candle `Linear` inside
//! the same pass (`projection`). Every operation repeats the arithmetic of the candle-ops
//! forward in `Model::forward` (candle's expressions and order; SwiGLU's gate is thicket's
//! `silu` in both; a mixture's routes and sums are the same host code in both), so the logits
//! are bit-identical to it (tested), and a row's result still never depends on the other rows.
//! Every family's `Variant` is read here as in the candle-ops forward: QK norm, post norms, the
//! gate's activation, the embedding scale, each layer's RoPE table and window, soft-caps, the
//! mixture; the row-wise steps are `fused_rows`.

use std::cell::RefCell;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use candle_core::{Device, Tensor};

use crate::cpu::attention::{softcap, WindowViews};
use crate::cpu::kv_store::PagedKvStore;
use crate::cpu::qgemm::Activations;
use crate::model::config::ModelConfig;
use crate::model::experts::fused::{ExpertBuffers, FusedFfn};
use crate::model::fused_rows::{add_into, rms_norm};
use crate::model::mixer::{FusedAt, FusedMixer, MixerBuffers};
use crate::model::per_layer::{FusedLayerInput, FusedPerLayer, PerLayerBuffers};
use crate::model::projection::{project, Projection};
use crate::model::{ForwardOutput, ModelWeights};
use crate::tree_batch::TreeBatch;
use crate::{Error, Result};

#[derive(Debug, Clone)]
struct FusedLayer {
    attn_norm: Vec<f32>,
    /// Norms of the mixer and MLP outputs.
    post_norms: Option<(Vec<f32>, Vec<f32>)>,
    /// Attention, or another token mixer, in its fused form.
    mixer: Arc<dyn FusedMixer>,
    mlp_norm: Vec<f32>,
    mlp: FusedFfn,
    per_layer_input: Option<FusedLayerInput>,
    output_scale: Option<f32>,
}

/// The weights in the form the fused pass reads (projections shared with the model's).
#[derive(Debug, Clone)]
pub struct FusedWeights {
    layers: Vec<FusedLayer>,
    per_layer: Option<FusedPerLayer>,
    final_norm: Vec<f32>,
    lm_head: Projection,
    /// `[max_positions][head_dim / 2]`, the model's RoPE table.
    rope_cos: Vec<f32>,
    rope_sin: Vec<f32>,
    /// The windowed layers' own table, where they have one.
    rope_local: Option<(Vec<f32>, Vec<f32>)>,
    /// Whether every projection takes thicket's kernel: then nothing in a forward calls
    /// rayon beside the team's own loops (candle's matmul splits over the pool by itself).
    packed: bool,
}

/// Seconds spent in each part of fused forwards on this thread, when `profile` is on.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ForwardProfile {
    /// Quantized matrix products of the layers (activation quantization included).
    pub matmul: f64,
    /// Attention, K/V writes included.
    pub attention: f64,
    /// Norms, RoPE, SwiGLU, residual adds, embedding lookup.
    pub other: f64,
    /// The final norm and the vocabulary projection.
    pub head: f64,
}

impl ForwardProfile {
    /// Adds `other`'s times.
    pub fn add(&mut self, other: &ForwardProfile) {
        self.matmul += other.matmul;
        self.attention += other.attention;
        self.other += other.other;
        self.head += other.head;
    }

    /// Every time times `factor`.
    pub fn scaled(&self, factor: f64) -> ForwardProfile {
        ForwardProfile {
            matmul: self.matmul * factor,
            attention: self.attention * factor,
            other: self.other * factor,
            head: self.head * factor,
        }
    }

    /// The sum of the parts.
    pub fn total(&self) -> f64 {
        self.matmul + self.attention + self.other + self.head
    }
}

/// Reusable buffers of one thread's forwards.
#[derive(Default)]
struct Workspace {
    x: Vec<f32>,
    h: Vec<f32>,
    mixer: MixerBuffers,
    mlp: ExpertBuffers,
    out: Vec<f32>,
    rows: Activations,
    per_layer: PerLayerBuffers,
}

thread_local! {
    static WORKSPACE: RefCell<Workspace> = RefCell::new(Workspace::default());
}

/// What fused forwards measured while `profile` was on (`None` while off).
static PROFILE: Mutex<Option<ForwardProfile>> = Mutex::new(None);

/// Starts (or stops) timing the parts of every fused forward in this process, returning what
/// was measured since the last call. Timing costs a clock read per stage.
pub fn profile(on: bool) -> ForwardProfile {
    let mut profile = PROFILE.lock().unwrap_or_else(|e| e.into_inner());
    let taken = profile.take().unwrap_or_default();
    *profile = on.then(ForwardProfile::default);
    taken
}

fn profiling() -> bool {
    PROFILE.lock().map(|p| p.is_some()).unwrap_or(false)
}

/// A float tensor's values on the CPU.
pub(crate) fn host_values(t: &Tensor) -> Result<Vec<f32>> {
    Ok(t.flatten_all()?
        .to_dtype(candle_core::DType::F32)?
        .to_vec1::<f32>()?)
}

impl FusedWeights {
    /// The fused form of `weights`, or `None` off the CPU.
    pub fn build(
        weights: &ModelWeights,
        rope: (&Tensor, &Tensor),
        rope_local: Option<(&Tensor, &Tensor)>,
        device: &Device,
    ) -> Result<Option<Self>> {
        if !device.is_cpu() {
            return Ok(None);
        }
        let mut layers = Vec::with_capacity(weights.layers.len());
        for l in &weights.layers {
            let pair = |pair: &Option<(Tensor, Tensor)>| -> Result<Option<(Vec<f32>, Vec<f32>)>> {
                pair.as_ref()
                    .map(|(a, b)| Ok((host_values(a)?, host_values(b)?)))
                    .transpose()
            };
            layers.push(FusedLayer {
                attn_norm: host_values(&l.attn_norm)?,
                post_norms: pair(&l.post_norms)?,
                mixer: l.mixer.fused()?,
                mlp_norm: host_values(&l.mlp_norm)?,
                mlp: FusedFfn::new(&l.mlp)?,
                per_layer_input: l.per_layer_input.as_ref().map(|p| p.fused()).transpose()?,
                output_scale: l.output_scale,
            });
        }
        let lm_head = Projection::from_linear(&weights.lm_head)?;
        let per_layer = weights.per_layer.as_ref().map(|p| p.fused()).transpose()?;
        let packed = layers
            .iter()
            .flat_map(|l| {
                let mut all = l.mixer.projections();
                all.extend(l.mlp.projections());
                all.extend(l.per_layer_input.iter().flat_map(|p| p.projections()));
                all
            })
            .chain(per_layer.iter().map(|p| p.projection()))
            .chain([&lm_head])
            .all(|p| matches!(p, Projection::Packed { .. }));
        Ok(Some(Self {
            layers,
            per_layer,
            final_norm: host_values(&weights.final_norm)?,
            lm_head,
            rope_cos: host_values(rope.0)?,
            rope_sin: host_values(rope.1)?,
            rope_local: rope_local
                .map(|(c, s)| Ok::<_, Error>((host_values(c)?, host_values(s)?)))
                .transpose()?,
            packed,
        }))
    }

    /// Whether every projection takes thicket's kernel (see `packed`).
    pub fn all_packed(&self) -> bool {
        self.packed
    }

    /// The forward of `Model::forward` (already validated), on the calling thread.
    pub fn forward(
        &self,
        cfg: &ModelConfig,
        weights: &ModelWeights,
        batch: &TreeBatch,
        kv: &mut PagedKvStore,
    ) -> Result<ForwardOutput> {
        // The forward's parallel loops run on one team of the pool's workers, recruited once.
        crate::cpu::team::with_team(|| {
            WORKSPACE.with(|cell| match cell.try_borrow_mut() {
                Ok(mut w) => self.forward_in(cfg, weights, batch, kv, &mut w),
                // A forward of another engine run by this worker while it waits inside its
                // own (a rayon call of a candle projection): it gets buffers of its own.
                Err(_) => self.forward_in(cfg, weights, batch, kv, &mut Workspace::default()),
            })
        })
    }

    fn forward_in(
        &self,
        cfg: &ModelConfig,
        weights: &ModelWeights,
        batch: &TreeBatch,
        kv: &mut PagedKvStore,
        w: &mut Workspace,
    ) -> Result<ForwardOutput> {
        let mut rows = batch.num_rows();
        let hidden = cfg.hidden_size;
        let eps = cfg.rms_norm_eps as f32;
        let reaches = || (0..cfg.num_layers).filter_map(|i| cfg.layer_reach(i));
        let mut windows = WindowViews::new(batch, reaches())?;
        let full = batch;
        // Past the last layer that writes, only the rows that give logits (`cut_to_logit_rows`).
        let mut cut: Option<TreeBatch> = None;
        let tail = cfg.reading_tail();
        let mut clock = Clock::new(profiling());
        weights.embedding.rows_into(&batch.token_ids, &mut w.x)?;
        if let Some(scale) = cfg.variant.embedding_scale {
            for v in &mut w.x {
                *v *= scale;
            }
        }
        if let Some(p) = &self.per_layer {
            let ids = &batch.token_ids;
            p.inputs_fused(ids, &w.x, (hidden, eps), &mut w.per_layer, &mut w.rows)?;
        }
        w.h.resize(rows * hidden, 0.0);
        for (index, layer) in self.layers.iter().enumerate() {
            if Some(index) == tail {
                if full.logit_rows.is_empty() {
                    break;
                }
                if let Some((fewer, kept)) = full.cut_to_logit_rows() {
                    keep_rows(&mut w.x, &kept, hidden);
                    if let Some(p) = &self.per_layer {
                        keep_rows(&mut w.per_layer.inputs, &kept, p.width() * cfg.num_layers);
                    }
                    rows = fewer.num_rows();
                    w.h.resize(rows * hidden, 0.0);
                    windows = WindowViews::new(&fewer, reaches())?;
                    cut = Some(fewer);
                }
            }
            let batch = cut.as_ref().unwrap_or(full);
            rms_norm(&w.x, &layer.attn_norm, eps, &mut w.h);
            clock.lap(|p| &mut p.other);
            let at = FusedAt {
                cfg,
                index,
                batch,
                seen: windows.batch(cfg.layer_reach(index)).unwrap_or(batch),
                table: self.table(cfg.layer_attention(index).local_rope),
            };
            let (mixer, acts) = (&mut w.mixer, &mut w.rows);
            layer
                .mixer
                .run(&at, &w.h, kv, mixer, acts, &mut clock, &mut w.out)?;
            scale_residual(cfg, &mut w.out);
            if let Some((post_attn, _)) = &layer.post_norms {
                rms_norm(&w.out, post_attn, eps, &mut w.h);
                add_into(&w.h, &mut w.x);
            } else {
                add_into(&w.out, &mut w.x);
            }
            rms_norm(&w.x, &layer.mlp_norm, eps, &mut w.h);
            clock.lap(|p| &mut p.other);
            // The gated MLP, or the mixture (counted as matmul time).
            let act = cfg.variant.activation;
            layer
                .mlp
                .run(&w.x, &w.h, rows, act, &mut w.mlp, &mut w.rows, &mut w.out)?;
            scale_residual(cfg, &mut w.out);
            clock.lap(|p| &mut p.matmul);
            if let Some((_, post_mlp)) = &layer.post_norms {
                rms_norm(&w.out, post_mlp, eps, &mut w.h);
                add_into(&w.h, &mut w.x);
            } else {
                add_into(&w.out, &mut w.x);
            }
            if let (Some(input), Some(p)) = (&layer.per_layer_input, &self.per_layer) {
                let at = (index, p.width(), eps);
                input.apply_fused(&mut w.x, at, &mut w.per_layer, &mut w.rows)?;
            }
            if let Some(scale) = layer.output_scale {
                for v in &mut w.x {
                    *v *= scale;
                }
            }
            clock.lap(|p| &mut p.other);
        }
        let out = cut.as_ref().unwrap_or(full);
        let wanted = &out.logit_rows;
        let vocab = cfg.vocab_size;
        w.h.clear();
        for &r in wanted {
            w.h.extend_from_slice(&w.x[r * hidden..(r + 1) * hidden]);
        }
        let mut last = vec![0f32; w.h.len()];
        rms_norm(&w.h, &self.final_norm, eps, &mut last);
        // The states asked for leave here; the other rows go through the head.
        let mut states = Vec::with_capacity(out.hidden_outputs.len());
        if !out.hidden_outputs.is_empty() {
            let mut heads = Vec::with_capacity(last.len());
            for (i, row) in last.chunks_exact(hidden).enumerate() {
                match out.wants_hidden(i) {
                    true => states.push(row.to_vec()),
                    false => heads.extend_from_slice(row),
                }
            }
            last = heads;
        }
        let heads = last.len() / hidden;
        let mut logits = Vec::new();
        if heads > 0 {
            project(
                &last,
                heads,
                &mut [(&self.lm_head, &mut logits)],
                &mut w.rows,
            )?;
        }
        if let Some(scale) = cfg.variant.logit_scale {
            let inverse = 1.0 / scale;
            for v in &mut logits {
                *v *= inverse;
            }
        }
        if let Some(cap) = cfg.variant.final_softcap {
            for v in &mut logits {
                *v = softcap(*v, cap);
            }
        }
        let logits = Tensor::from_vec(logits, (heads, vocab), &Device::Cpu)?;
        clock.lap(|p| &mut p.head);
        Ok(ForwardOutput {
            logits,
            hidden: states,
        })
    }

    /// The RoPE table of global layers, or of windowed ones (`local`) where they have one.
    fn table(&self, local: bool) -> (&[f32], &[f32]) {
        match (&self.rope_local, local) {
            (Some((cos, sin)), true) => (cos, sin),
            _ => (&self.rope_cos, &self.rope_sin),
        }
    }
}

/// Times consecutive stages when profiling.
pub(crate) struct Clock(Option<(Instant, ForwardProfile)>);

impl Clock {
    fn new(on: bool) -> Self {
        Self(on.then(|| (Instant::now(), ForwardProfile::default())))
    }

    /// Charges the time since the last lap to `part`.
    pub(crate) fn lap(&mut self, part: fn(&mut ForwardProfile) -> &mut f64) {
        if let Some((started, profile)) = self.0.as_mut() {
            let now = Instant::now();
            *part(profile) += (now - *started).as_secs_f64();
            *started = now;
        }
    }
}

impl Drop for Clock {
    /// Adds this forward's times to the process's profile.
    fn drop(&mut self) {
        if let (Some((_, mine)), Ok(mut total)) = (self.0.take(), PROFILE.lock()) {
            if let Some(total) = total.as_mut() {
                total.add(&mine);
            }
        }
    }
}

/// A mixer's or MLP's output times the family's residual scale, where it has one (Granite).
/// Keeps rows `kept` (ascending) of `values` (`[rows, width]`), in order.
fn keep_rows(values: &mut Vec<f32>, kept: &[usize], width: usize) {
    for (to, &from) in kept.iter().enumerate() {
        values.copy_within(from * width..(from + 1) * width, to * width);
    }
    values.truncate(kept.len() * width);
}

fn scale_residual(cfg: &ModelConfig, out: &mut [f32]) {
    if let Some(scale) = cfg.variant.residual_scale {
        for v in out {
            *v *= scale;
        }
    }
}
