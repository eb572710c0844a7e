//! LFM2's gated short convolution as a token mixer: one projection gives `B`, `C` and `x`
//! (each as wide as the residual), the row keeps `B * x` at its slot (one f32 row per
//! position: `LayerStorage::Rows`), each channel is convolved causally over the last `kernel`
//! such rows along the row's path (its own, its parent's, ... then the context's, newest
//! first; before position 0 there is nothing), gated by `C`, and projected out. The path is
//! what the layer's window view of the batch gives the row (`kernel` positions), so a draft
//! node convolves its ancestors' inputs, never a sibling's, and a chunk boundary inside the
//! window reads the previous chunk's rows from the store: the chunked form and the recurrent
//! one are the same sum. The convolution itself (`convolve`) is shared by the candle-ops form
//! and the fused one, which therefore agree bit for bit.

use std::sync::Arc;

use candle_core::{Device, Tensor};

use super::{CandleAt, FusedAt, FusedMixer, MixerBuffers, TokenMixer};
use crate::cpu::kv_store::{LayerStorage, PagedKvStore};
use crate::cpu::qgemm::Activations;
use crate::model::config::LayerMixer;
use crate::model::fused_pass::Clock;
use crate::model::linear::Linear;
use crate::model::projection::{project, Projection};
use crate::tree_batch::TreeBatch;
use crate::{Error, Result};

/// One layer's short convolution.
#[derive(Debug, Clone)]
pub struct ShortConvWeights {
    /// `[3 * hidden, hidden]`: `B`, `C` and `x`, in that order.
    pub in_proj: Linear,
    /// Each channel's taps, oldest position first: `[hidden][kernel]`.
    pub taps: Arc<Vec<f32>>,
    /// Positions the convolution spans.
    pub kernel: usize,
    /// `[hidden, hidden]`.
    pub out_proj: Linear,
}

impl ShortConvWeights {
    /// The weights, checking the taps against `hidden` channels: `conv` is `[hidden, kernel]`
    /// or `[hidden, 1, kernel]` (HF's Conv1d), any float type.
    pub fn new(in_proj: Linear, conv: &Tensor, out_proj: Linear, hidden: usize) -> Result<Self> {
        let dims = conv.dims().to_vec();
        let kernel = match dims.as_slice() {
            [h, k] | [h, 1, k] if *h == hidden && *k > 0 => *k,
            _ => {
                return Err(Error::Metadata(format!(
                    "a short convolution's weight is {dims:?}; [{hidden}, kernel] expected"
                )))
            }
        };
        let taps = conv
            .to_device(&Device::Cpu)?
            .to_dtype(candle_core::DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        Ok(Self {
            in_proj,
            taps: Arc::new(taps),
            kernel,
            out_proj,
        })
    }
}

impl TokenMixer for ShortConvWeights {
    fn kind(&self) -> LayerMixer {
        LayerMixer::ShortConv {
            kernel: self.kernel,
        }
    }

    fn storage(&self) -> LayerStorage {
        LayerStorage::Rows(self.taps.len() / self.kernel)
    }

    fn projections(&self) -> Vec<&Linear> {
        vec![&self.in_proj, &self.out_proj]
    }

    fn projections_mut(&mut self) -> Vec<&mut Linear> {
        vec![&mut self.in_proj, &mut self.out_proj]
    }

    fn forward_candle(
        &self,
        at: &CandleAt<'_>,
        h: &Tensor,
        kv: &mut PagedKvStore,
    ) -> Result<Tensor> {
        let (rows, hidden) = h.dims2()?;
        let bcx = self.in_proj.forward(h)?;
        let b = bcx.narrow(1, 0, hidden)?;
        let c = bcx.narrow(1, hidden, hidden)?;
        let x = bcx.narrow(1, 2 * hidden, hidden)?;
        let bx = (b * x)?.flatten_all()?.to_vec1::<f32>()?;
        kv.write_rows(at.index, &at.seen.slots, &bx)?;
        let mut conv = Vec::new();
        convolve(
            at.seen,
            kv.rows(at.index)?,
            &self.taps,
            self.kernel,
            &mut conv,
        )?;
        let conv = Tensor::from_vec(conv, (rows, hidden), h.device())?;
        self.out_proj.forward(&(c * conv)?)
    }

    fn fused(&self) -> Result<Arc<dyn FusedMixer>> {
        Ok(Arc::new(FusedShortConv {
            in_proj: Projection::from_linear(&self.in_proj)?,
            taps: self.taps.clone(),
            kernel: self.kernel,
            out_proj: Projection::from_linear(&self.out_proj)?,
        }))
    }

    fn clone_box(&self) -> Box<dyn TokenMixer> {
        Box::new(self.clone())
    }
}

/// Each row of `seen` convolved over the rows its path keeps in `stored` (`[slot][width]`):
/// `out[r][c] = sum_t taps[c][kernel - 1 - t] * stored[path_r(t)][c]`, `path_r(0)` the row's
/// own slot, `path_r(1)` its parent's or the last context position's, and so on; the terms
/// are added oldest first, as the recurrent form adds its window. Taps before the sequence's
/// first position add nothing.
pub(crate) fn convolve(
    seen: &TreeBatch,
    (stored, width): (&[f32], usize),
    taps: &[f32],
    kernel: usize,
    out: &mut Vec<f32>,
) -> Result<()> {
    if taps.len() != width * kernel {
        return Err(Error::InvalidBatch(format!(
            "{} taps for {width} channels of {kernel}",
            taps.len()
        )));
    }
    out.clear();
    out.resize(seen.num_rows() * width, 0.0);
    let mut path: Vec<usize> = Vec::with_capacity(kernel);
    for seq in &seen.seqs {
        for (local, row) in seq.rows.clone().enumerate() {
            // The row's own slot, then its ancestors', then the context's, newest first.
            path.clear();
            path.extend(
                std::iter::once(local)
                    .chain(seq.mask.ancestors_nearest_first(local))
                    .take(kernel)
                    .map(|j| seen.slots[seq.rows.start + j].index()),
            );
            let more = kernel - path.len();
            path.extend(seq.context_slots.iter().rev().take(more));
            if let Some(&bad) = path.iter().find(|&&s| (s + 1) * width > stored.len()) {
                return Err(Error::InvalidBatch(format!(
                    "slot {bad} outside the convolution's rows"
                )));
            }
            let dst = &mut out[row * width..(row + 1) * width];
            for t in (0..path.len()).rev() {
                let src = &stored[path[t] * width..(path[t] + 1) * width];
                let tap = kernel - 1 - t;
                for (c, (d, s)) in dst.iter_mut().zip(src).enumerate() {
                    *d += taps[c * kernel + tap] * *s;
                }
            }
        }
    }
    Ok(())
}

/// The short convolution in the fused pass.
#[derive(Debug)]
struct FusedShortConv {
    in_proj: Projection,
    taps: Arc<Vec<f32>>,
    kernel: usize,
    out_proj: Projection,
}

impl FusedMixer for FusedShortConv {
    fn projections(&self) -> Vec<&Projection> {
        vec![&self.in_proj, &self.out_proj]
    }

    fn run(
        &self,
        at: &FusedAt<'_>,
        h: &[f32],
        kv: &mut PagedKvStore,
        w: &mut MixerBuffers,
        acts: &mut Activations,
        clock: &mut Clock,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let rows = at.batch.num_rows();
        let hidden = at.cfg.hidden_size;
        project(h, rows, &mut [(&self.in_proj, &mut w.mixed)], acts)?;
        clock.lap(|p| &mut p.matmul);
        let bcx = &w.mixed;
        w.q.clear();
        for r in 0..rows {
            let row = &bcx[r * 3 * hidden..(r + 1) * 3 * hidden];
            let (b, x) = (&row[..hidden], &row[2 * hidden..]);
            w.q.extend(b.iter().zip(x).map(|(b, x)| b * x));
        }
        kv.write_rows(at.index, &at.seen.slots, &w.q)?;
        convolve(
            at.seen,
            kv.rows(at.index)?,
            &self.taps,
            self.kernel,
            &mut w.k,
        )?;
        w.v.clear();
        for r in 0..rows {
            let c = &bcx[r * 3 * hidden + hidden..r * 3 * hidden + 2 * hidden];
            let conv = &w.k[r * hidden..(r + 1) * hidden];
            w.v.extend(c.iter().zip(conv).map(|(c, y)| c * y));
        }
        clock.lap(|p| &mut p.attention);
        project(&w.v, rows, &mut [(&self.out_proj, out)], acts)?;
        clock.lap(|p| &mut p.matmul);
        Ok(())
    }
}
