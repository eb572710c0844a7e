//! Paged tree attention through candle's ops, one sequence at a time, as the reference
//! models compute it: K/V gathered from the paged store in position order, a masked softmax,
//! two matmuls (a head's sink, where the model has them, one more logit in its softmax).
//! Chains reproduce the reference models bit for bit; trees are not exact.

use candle_core::{DType, Device, Tensor};

use super::HeadShape;
use crate::cpu::kv_store::{key_at, KvRows, KvValue, LayerKv, LayerView, KEY_TILE};
use crate::tree_batch::TreeBatch;
use crate::Result;

/// Attention with candle ops, one sequence at a time. `q` is `[1, heads, rows, dim]`
/// (rotated); the batch's own K/V rows must already be in `kv`. Returns `[rows, heads * dim]`.
///
/// Every sequence gets exactly the calls the reference makes for a prompt of its length
/// (or a single decode row), with K/V gathered in position order (context, then its tree
/// rows); a tree row's non-ancestors are masked to -inf, contribute exact zeros, and leave
/// the sum over its ancestors as a chain computes it.
pub fn gathered_tree_attention(
    q: &Tensor,
    kv: LayerView<'_>,
    batch: &TreeBatch,
    shape: HeadShape<'_>,
    device: &Device,
) -> Result<Tensor> {
    let hd = shape.head_dim;
    let group = shape.num_heads / shape.num_kv_heads;
    let mut outputs = Vec::with_capacity(batch.seqs.len());
    for seq in &batch.seqs {
        let n = seq.rows.len();
        let len = seq.context_len + n;
        let slots: Vec<usize> = seq
            .context_slots
            .iter()
            .copied()
            .chain(
                batch.slots[seq.rows.clone()]
                    .iter()
                    .map(|slot| slot.index()),
            )
            .collect();
        let (k, v) = match kv.kv {
            LayerKv::F16(kv) => (gather_keys(kv, &slots, shape), gather(kv, &slots, shape)),
            LayerKv::F32(kv) => (gather_keys(kv, &slots, shape), gather(kv, &slots, shape)),
        };
        let k = Tensor::from_vec(k, (1, shape.num_kv_heads, len, hd), device)?;
        let v = Tensor::from_vec(v, (1, shape.num_kv_heads, len, hd), device)?;
        let k = repeat_kv(k, group)?;
        let v = repeat_kv(v, group)?;
        let q = q.narrow(2, seq.rows.start, n)?.contiguous()?;
        let att = (q.matmul(&k.t()?)? * f64::from(shape.scale))?;
        let att = match shape.softcap {
            Some(cap) => ((att * (1.0 / f64::from(cap)))?.tanh()? * f64::from(cap))?,
            None => att,
        };
        let att = if n > 1 {
            let mask: Vec<u8> = (0..n)
                .flat_map(|i| {
                    (0..len).map(move |j| {
                        u8::from(j >= seq.context_len && !seq.mask.sees(i, j - seq.context_len))
                    })
                })
                .collect();
            let mask = Tensor::from_vec(mask, (n, len), device)?.broadcast_as(att.shape())?;
            let neg_inf = Tensor::new(f32::NEG_INFINITY, device)?.broadcast_as(att.shape())?;
            mask.where_cond(&neg_inf, &att)?
        } else {
            att
        };
        // A head's sink is one more logit in its softmax, with no value: appended, then its
        // probability dropped (as transformers' gpt-oss computes it).
        let att = match shape.sinks {
            Some(sinks) => {
                let column = Tensor::from_slice(sinks, (1, shape.num_heads, 1, 1), device)?
                    .broadcast_as((1, shape.num_heads, n, 1))?
                    .to_dtype(att.dtype())?;
                let with = Tensor::cat(&[&att, &column], 3)?.contiguous()?;
                candle_nn::ops::softmax_last_dim(&with)?
                    .narrow(3, 0, len)?
                    .contiguous()?
            }
            None => candle_nn::ops::softmax_last_dim(&att)?,
        };
        let y = att.matmul(&v.contiguous()?)?;
        outputs.push(y.transpose(1, 2)?.reshape((n, shape.num_heads * hd))?);
    }
    Ok(Tensor::cat(&outputs, 0)?.to_dtype(DType::F32)?)
}

/// The value rows at `slots` of every KV head (`[kv_head][slot][dim]` in the store), as f32
/// laid out `[kv_head][slot][dim]`.
fn gather<T: KvValue>(kv: &KvRows<T>, slots: &[usize], shape: HeadShape<'_>) -> Vec<f32> {
    let (hd, plane) = (shape.head_dim, kv.v.len() / shape.num_kv_heads.max(1));
    gather_with(slots, shape, |out, kh, slot| {
        let at = kh * plane + slot * hd;
        out.extend(kv.v[at..at + hd].iter().map(|x| x.to_f32()));
    })
}

/// The keys at `slots` of every KV head (tiled in the store, see `kv_store`), as f32 laid
/// out `[kv_head][slot][dim]`.
fn gather_keys<T: KvValue>(kv: &KvRows<T>, slots: &[usize], shape: HeadShape<'_>) -> Vec<f32> {
    let (hd, plane) = (shape.head_dim, kv.k.len() / shape.num_kv_heads.max(1));
    gather_with(slots, shape, |out, kh, slot| {
        let at = kh * plane + key_at(slot, hd);
        out.extend((0..hd).map(|d| kv.k[at + d * KEY_TILE].to_f32()));
    })
}

/// `push(out, kv_head, slot)` for every KV head and slot, in that order.
fn gather_with(
    slots: &[usize],
    shape: HeadShape<'_>,
    mut push: impl FnMut(&mut Vec<f32>, usize, usize),
) -> Vec<f32> {
    let mut out = Vec::with_capacity(shape.num_kv_heads * slots.len() * shape.head_dim);
    for kh in 0..shape.num_kv_heads {
        for &slot in slots {
            push(&mut out, kh, slot);
        }
    }
    out
}

/// `[b, kv_heads, len, d]` -> `[b, kv_heads * n_rep, len, d]`, query head h reading KV head
/// h / n_rep (the reference's layout, built the reference's way).
fn repeat_kv(xs: Tensor, n_rep: usize) -> Result<Tensor> {
    if n_rep == 1 {
        return Ok(xs);
    }
    let (b, kv_heads, len, d) = xs.dims4()?;
    Ok(Tensor::cat(&vec![&xs; n_rep], 2)?.reshape((b, kv_heads * n_rep, len, d))?)
}
