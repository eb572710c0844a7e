//! The decoder's forward as candle ops, on any device and any weights: the reference the fused
//! CPU pass (`fused_pass`) is tested against bit for bit, and the path of dense or off-CPU
//! weights. Every family runs through it, reading its `Variant`: QK norm, post norms, the
//! gate's activation, scaled embeddings, per-layer RoPE tables and sliding windows (a view of
//! the batch, `cpu::attention::windowed_batch`), soft-capped attention and logits, and a
//! mixture of experts in place of the MLP (`experts::candle`).

use candle_core::{DType, Tensor};

use crate::cpu::attention::{
    gathered_tree_attention, paged_tree_attention, softcap, AttentionKernel, HeadShape, WindowViews,
};
use crate::cpu::kv_store::PagedKvStore;
use crate::model::config::Activation;
use crate::model::{Mlp, Model};
use crate::tree_batch::TreeBatch;
use crate::Result;

impl Model {
    /// The forward as candle ops (any device, any weights).
    pub(crate) fn forward_candle(
        &self,
        batch: &TreeBatch,
        kv: &mut PagedKvStore,
    ) -> Result<Tensor> {
        let cfg = self.config();
        let variant = &cfg.variant;
        let weights = self.weights();
        let rows = batch.num_rows();
        let device = self.device();
        let positions = Tensor::new(batch.positions.as_slice(), device)?;
        let global = self.rope_rows_of(&positions, false)?;
        let local = self.rope_rows_of(&positions, true)?;
        let shape = HeadShape {
            scale: cfg.attention_scale(),
            softcap: variant.attention_softcap,
            ..HeadShape::plain(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)
        };
        let eps = cfg.rms_norm_eps as f32;
        let windows = WindowViews::new(batch, cfg.variant.layers.iter().filter_map(|l| l.window))?;

        let mut x = weights.embedding.lookup(&batch.token_ids, device)?;
        if let Some(scale) = variant.embedding_scale {
            x = (x * f64::from(scale))?;
        }
        for (index, layer) in weights.layers.iter().enumerate() {
            let kind = cfg.layer_attention(index);
            let (cos, sin) = if kind.local_rope { &local } else { &global };
            let h = candle_nn::ops::rms_norm(&x, &layer.attn_norm, eps)?;
            let mut q = layer.q.forward(&h)?;
            let mut k = layer.k.forward(&h)?;
            if let Some((q_norm, k_norm)) = &layer.qk_norm {
                q = head_norm(&q, q_norm, cfg.head_dim, eps)?;
                k = head_norm(&k, k_norm, cfg.head_dim, eps)?;
            }
            let q = self.rotate(&q, cfg.num_heads, cos, sin)?;
            let k = self.rotate(&k, cfg.num_kv_heads, cos, sin)?;
            let v = layer.v.forward(&h)?;
            // K back to row-major [rows][kv_heads][dim] for the store; Q stays head-major.
            let k = k.squeeze(0)?.transpose(0, 1)?.contiguous()?;
            let seen = windows.batch(kind.window).unwrap_or(batch);
            kv.write(
                index,
                &seen.slots,
                &k.flatten_all()?.to_vec1::<f32>()?,
                &v.flatten_all()?.to_vec1::<f32>()?,
            )?;
            let attn = match self.attention() {
                AttentionKernel::Reference => {
                    gathered_tree_attention(&q, kv.layer(index), seen, shape, device)?
                }
                AttentionKernel::Fused => {
                    let q = q.flatten_all()?.to_vec1::<f32>()?;
                    let attn = paged_tree_attention(&q, kv.layer(index), seen, shape);
                    Tensor::from_vec(attn, (rows, cfg.attention_width()), device)?
                }
            };
            let mut out = layer.o.forward(&attn)?;
            if let Some((post_attn, _)) = &layer.post_norms {
                out = candle_nn::ops::rms_norm(&out, post_attn, eps)?;
            }
            x = (out + x)?;

            let h = candle_nn::ops::rms_norm(&x, &layer.mlp_norm, eps)?;
            let activate = |g: &Tensor| self.activate(variant.activation, g);
            let mut out = match &layer.mlp {
                Mlp::Dense(mlp) => crate::model::experts::candle_mlp(mlp, &h, &activate)?,
                Mlp::Experts(moe) => moe.forward_candle(&h, &activate)?,
            };
            if let Some((_, post_mlp)) = &layer.post_norms {
                out = candle_nn::ops::rms_norm(&out, post_mlp, eps)?;
            }
            x = (out + x)?;
        }
        if batch.logit_rows.is_empty() {
            return Ok(Tensor::zeros((0, cfg.vocab_size), DType::F32, device)?);
        }
        let wanted: Vec<u32> = batch.logit_rows.iter().map(|&r| r as u32).collect();
        let wanted = Tensor::new(wanted.as_slice(), device)?;
        let x = x.index_select(&wanted, 0)?;
        let x = candle_nn::ops::rms_norm(&x, &weights.final_norm, eps)?;
        let logits = weights.lm_head.forward(&x)?;
        match variant.final_softcap {
            Some(cap) => {
                let (n, vocab) = logits.dims2()?;
                let mut values = logits.flatten_all()?.to_vec1::<f32>()?;
                for v in &mut values {
                    *v = softcap(*v, cap);
                }
                Ok(Tensor::from_vec(values, (n, vocab), device)?)
            }
            None => Ok(logits),
        }
    }

    /// The gate's activation: thicket's own (`silu`, `gelu_tanh`: what the fused pass
    /// computes) on the CPU with thicket's attention, candle's where the arithmetic is the
    /// reference's or off the CPU.
    fn activate(&self, activation: Activation, x: &Tensor) -> Result<Tensor> {
        if self.attention() == AttentionKernel::Fused
            && x.device().is_cpu()
            && x.dtype() == DType::F32
        {
            let f = match activation {
                Activation::Silu => crate::cpu::silu::silu,
                Activation::GeluTanh => crate::cpu::silu::gelu_tanh,
            };
            let mut values = x.flatten_all()?.to_vec1::<f32>()?;
            for v in &mut values {
                *v = f(*v);
            }
            return Ok(Tensor::from_vec(values, x.shape(), x.device())?);
        }
        Ok(match activation {
            Activation::Silu => candle_nn::ops::silu(x)?,
            Activation::GeluTanh => x.gelu()?,
        })
    }
}

/// RMSNorm of each head of `x` (`[rows, heads * dim]`) with the per-head weight `alpha`.
fn head_norm(x: &Tensor, alpha: &Tensor, head_dim: usize, eps: f32) -> Result<Tensor> {
    let (rows, width) = x.dims2()?;
    let heads = x.reshape((rows * width / head_dim, head_dim))?;
    Ok(candle_nn::ops::rms_norm(&heads, alpha, eps)?.reshape((rows, width))?)
}
