//! The decoder's forward as candle ops, on any device and any weights: the reference the fused
//! CPU pass (`fused_pass`) is tested against bit for bit, and the path of dense or off-CPU
//! weights. Every family runs through it, reading its `Variant`: each layer's token mixer
//! (attention or a kind with state, `mixer`, each with its window's view), QK norm, post norms, the
//! gate's activation, scaled embeddings, per-layer RoPE tables and sliding windows (a view of
//! the batch, `cpu::attention::windowed_batch`), soft-capped attention and logits, and a
//! mixture of experts in place of the MLP (`experts::candle`).

use candle_core::{DType, Tensor};

use crate::cpu::attention::{softcap, AttentionKernel, WindowViews};
use crate::cpu::kv_store::PagedKvStore;
use crate::model::config::Activation;
use crate::model::mixer::CandleAt;
use crate::model::{ForwardOutput, Mlp, Model};
use crate::tree_batch::TreeBatch;
use crate::Result;

impl Model {
    /// The forward as candle ops (any device, any weights).
    pub(crate) fn forward_candle(
        &self,
        batch: &TreeBatch,
        kv: &mut PagedKvStore,
    ) -> Result<ForwardOutput> {
        let cfg = self.config();
        let variant = &cfg.variant;
        let weights = self.weights();
        let device = self.device();
        let positions = Tensor::new(batch.positions.as_slice(), device)?;
        let global = self.rope_rows_of(&positions, false)?;
        let local = self.rope_rows_of(&positions, true)?;
        let eps = cfg.rms_norm_eps as f32;
        let reaches = (0..cfg.num_layers).filter_map(|i| cfg.layer_reach(i));
        let windows = WindowViews::new(batch, reaches)?;

        let mut x = weights.embedding.lookup(&batch.token_ids, device)?;
        if let Some(scale) = variant.embedding_scale {
            x = (x * f64::from(scale))?;
        }
        let per_layer = weights
            .per_layer
            .as_ref()
            .map(|p| p.inputs_candle(&batch.token_ids, &x, eps, device))
            .transpose()?;
        for (index, layer) in weights.layers.iter().enumerate() {
            let (cos, sin) = match cfg.layer_attention(index).local_rope {
                true => &local,
                false => &global,
            };
            let h = candle_nn::ops::rms_norm(&x, &layer.attn_norm, eps)?;
            let at = CandleAt {
                model: self,
                index,
                batch,
                seen: windows.batch(cfg.layer_reach(index)).unwrap_or(batch),
                rope: (cos, sin),
            };
            let mut out = layer.mixer.forward_candle(&at, &h, kv)?;
            if let Some((post_attn, _)) = &layer.post_norms {
                out = candle_nn::ops::rms_norm(&out, post_attn, eps)?;
            }
            if let Some(scale) = variant.residual_scale {
                out = (out * f64::from(scale))?;
            }
            x = (out + x)?;

            let h = candle_nn::ops::rms_norm(&x, &layer.mlp_norm, eps)?;
            let gated = |g: &Tensor, u: &Tensor| self.gated(variant.activation, g, u);
            let mut out = match &layer.mlp {
                Mlp::Dense(mlp) => crate::model::experts::candle_mlp(mlp, &h, &gated)?,
                Mlp::Experts(moe) => moe.forward_candle(&x, &h, &gated)?,
            };
            if let Some((_, post_mlp)) = &layer.post_norms {
                out = candle_nn::ops::rms_norm(&out, post_mlp, eps)?;
            }
            if let Some(scale) = variant.residual_scale {
                out = (out * f64::from(scale))?;
            }
            x = (out + x)?;
            if let (Some(input), Some(all), Some(p)) =
                (&layer.per_layer_input, &per_layer, &weights.per_layer)
            {
                let mine = all.narrow(1, index * p.width, p.width)?.contiguous()?;
                let gelu = |g: &Tensor, u: &Tensor| self.gated(Activation::GeluTanh, g, u);
                x = input.apply_candle(&x, &mine, eps, &gelu)?;
            }
            if let Some(scale) = layer.output_scale {
                x = (x * f64::from(scale))?;
            }
        }
        if batch.logit_rows.is_empty() {
            let logits = Tensor::zeros((0, cfg.vocab_size), DType::F32, device)?;
            return Ok(ForwardOutput {
                logits,
                hidden: Vec::new(),
            });
        }
        let wanted: Vec<u32> = batch.logit_rows.iter().map(|&r| r as u32).collect();
        let wanted = Tensor::new(wanted.as_slice(), device)?;
        let x = x.index_select(&wanted, 0)?;
        let x = candle_nn::ops::rms_norm(&x, &weights.final_norm, eps)?;
        // The states asked for leave here; the other rows go through the head.
        let mut hidden = Vec::with_capacity(batch.hidden_outputs.len());
        let heads: Vec<u32> = (0..batch.logit_rows.len())
            .filter(|&i| !batch.wants_hidden(i))
            .map(|i| i as u32)
            .collect();
        for &i in &batch.hidden_outputs {
            hidden.push(x.get(i)?.to_dtype(DType::F32)?.to_vec1::<f32>()?);
        }
        let x = match heads.len() == batch.logit_rows.len() {
            true => x,
            false => x.index_select(&Tensor::new(heads.as_slice(), device)?, 0)?,
        };
        if heads.is_empty() {
            let logits = Tensor::zeros((0, cfg.vocab_size), DType::F32, device)?;
            return Ok(ForwardOutput { logits, hidden });
        }
        let mut logits = weights.lm_head.forward(&x)?;
        if let Some(scale) = variant.logit_scale {
            // As llama.cpp scales: times the f32 reciprocal.
            logits = (logits * f64::from(1.0 / scale))?;
        }
        let logits = match variant.final_softcap {
            Some(cap) => {
                let (n, vocab) = logits.dims2()?;
                let mut values = logits.flatten_all()?.to_vec1::<f32>()?;
                for v in &mut values {
                    *v = softcap(*v, cap);
                }
                Tensor::from_vec(values, (n, vocab), device)?
            }
            None => logits,
        };
        Ok(ForwardOutput { logits, hidden })
    }

    /// `act(gate) * up`: thicket's own activations (`cpu::silu`: what the fused pass computes)
    /// on the CPU with thicket's attention, candle's ops where the arithmetic is the
    /// reference's or off the CPU.
    fn gated(&self, activation: Activation, gate: &Tensor, up: &Tensor) -> Result<Tensor> {
        if self.attention() == AttentionKernel::Fused
            && gate.device().is_cpu()
            && gate.dtype() == DType::F32
            && up.dtype() == DType::F32
        {
            let mut values = gate.flatten_all()?.to_vec1::<f32>()?;
            let up = up.flatten_all()?.to_vec1::<f32>()?;
            crate::cpu::silu::gated(activation, &mut values, &up);
            return Ok(Tensor::from_vec(values, gate.shape(), gate.device())?);
        }
        Ok(match activation {
            Activation::Silu => (candle_nn::ops::silu(gate)? * up)?,
            Activation::GeluTanh => (gate.gelu()? * up)?,
            Activation::SwigluOai => {
                let g = gate.minimum(7.0)?;
                let sigmoid = candle_nn::ops::sigmoid(&(&g * 1.702)?)?;
                ((g * sigmoid)? * (up.clamp(-7.0, 7.0)? + 1.0)?)?
            }
        })
    }
}
