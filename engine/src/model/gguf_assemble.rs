//! Assembling a model's weights from tensors by llama.cpp's GGUF names, wherever they come
//! from (a GGUF file, or a Hugging Face checkpoint whose names are translated): the embedding,
//! final norm and head, then every block (its token mixer, MLP or mixture, norms, per-layer
//! parts), each checked against the shapes the config implies.

use candle_core::quantized::QTensor;
use candle_core::{DType, Device, Tensor};

use crate::model::config::{LayerMixer, ModelConfig};
use crate::model::experts::load::GgufTensors;
use crate::model::experts::prepared::PreparedExperts;
use crate::model::gguf_header::RawBlocks;
use crate::model::gguf_per_layer;
use crate::model::linear::Linear;
use crate::model::shapes::{deal_quantized, split_quantized, unfused, Role, Shapes};
use crate::model::{
    AttentionWeights, DeltaNetWeights, DenseMlp, Embedding, LayerWeights, Mamba2Weights, Mlp,
    ModelWeights, ShortConvWeights, TokenMixer,
};
use crate::{Error, Result};

/// Where the tensors come from, by their GGUF names.
pub(crate) struct Source<'a> {
    /// A tensor by name (an error naming it where it is missing).
    pub tensor: &'a dyn Fn(&str) -> Result<QTensor>,
    /// Whether the source has a tensor.
    pub has: &'a dyn Fn(&str) -> bool,
    /// A tensor made dense f32.
    pub dense: &'a dyn Fn(QTensor) -> Result<Tensor>,
    /// A tensor candle does not read but thicket's kernels do (see `GgufTensors::blocks`).
    pub blocks: &'a dyn Fn(&str) -> Option<Result<RawBlocks>>,
    /// The dtype dense weights take (`None`: kept quantized).
    pub dtype: Option<DType>,
    pub device: &'a Device,
    /// Whether the embedding tables stay in their blocks.
    pub quantized_tables: bool,
    /// The experts prepared for the SIMD kernels, where they are.
    pub prepared: Option<&'a PreparedExperts>,
    /// The per-layer embeddings' width (0: none).
    pub per_layer_width: usize,
}

/// The weights of `config`'s model from `src`.
pub(crate) fn assemble(config: &ModelConfig, src: &Source<'_>) -> Result<ModelWeights> {
    let (tensor, has, dense, dtype, device) =
        (src.tensor, src.has, src.dense, src.dtype, src.device);
    let family = config.architecture.family();
    let embedding_q = tensor("token_embd.weight")?;
    // Kept in its blocks where the weights stay quantized on the CPU; dense otherwise.
    let embedding = if src.quantized_tables {
        Embedding::Quantized(std::sync::Arc::new(tensor("token_embd.weight")?))
    } else {
        Embedding::Dense(embedding_q.dequantize(src.device)?.to_dtype(DType::F32)?)
    };
    // LFM2's converter names the final norm after the embedding.
    let final_norm = match has("token_embd_norm.weight") {
        true if !has("output_norm.weight") => dense(tensor("token_embd_norm.weight")?)?,
        _ => dense(tensor("output_norm.weight")?)?,
    };
    let lm_head_q = if has("output.weight") {
        tensor("output.weight")?
    } else {
        embedding_q
    };
    let lm_head = Linear::from_qtensor(lm_head_q, None, dtype)?;
    let parts = gguf_per_layer::Reader {
        tensor,
        has,
        dense,
        dtype,
        quantized_tables: src.quantized_tables,
    };
    let ple_width = src.per_layer_width;
    let per_layer = gguf_per_layer::per_layer_embedding(&parts, config, ple_width)?;
    let expert_tensors = GgufTensors {
        read: tensor,
        has,
        blocks: src.blocks,
        dtype,
        device,
        prepared: src.prepared,
    };
    let mut layers = Vec::with_capacity(config.num_layers);
    for i in 0..config.num_layers {
        let p = format!("blk.{i}");
        let shapes = Shapes::of_layer(config, i);
        let proj = |name: &str, role: Role, biased: bool| -> Result<Linear> {
            let bias = if biased {
                Some(dense(tensor(&format!("{p}.{name}.bias"))?)?)
            } else {
                None
            };
            let full = format!("{p}.{name}.weight");
            let weight = tensor(&full)?;
            shapes.check(&full, role, weight.shape().dims())?;
            Linear::from_qtensor(weight, bias, dtype)
        };
        let bias = config.attention_bias;
        let norm = |name: &str, role: Role| -> Result<Tensor> {
            let full = format!("{p}.{name}.weight");
            let t = dense(tensor(&full)?)?;
            shapes.check(&full, role, t.dims())?;
            Ok(t)
        };
        let attends = config.layer_mixer(i) == LayerMixer::Attention;
        let (mixer, mlp): (Box<dyn TokenMixer>, Mlp) = if family.fused_projections {
            let fused = |name: &str, role: Role| -> Result<Vec<Linear>> {
                let full = format!("{p}.{name}.weight");
                let weight = tensor(&full)?;
                shapes.check(&full, role, weight.shape().dims())?;
                split_quantized(&weight, &shapes.parts(role))?
                    .into_iter()
                    .map(|part| Linear::from_qtensor(part, None, dtype))
                    .collect()
            };
            let qkv = fused("attn_qkv", Role::Qkv)?;
            let gate_up = fused("ffn_up", Role::GateUp)?;
            let (q, k, v, gate, up) = unfused(qkv, gate_up)?;
            let down = proj("ffn_down", Role::Down, false)?;
            let o = proj("attn_output", Role::O, false)?;
            let attention = AttentionWeights {
                qk_norm: None,
                q,
                k,
                v,
                o,
                output_gate: None,
                sinks: None,
            };
            (Box::new(attention), Mlp::Dense(DenseMlp { gate, up, down }))
        } else {
            let mlp = match &config.variant.moe {
                Some(moe) if moe.is_sparse(i) => {
                    let mut mixture = expert_tensors.mixture(&p, moe, config.hidden_size)?;
                    gguf_per_layer::place_beside(&parts, config, (&p, i), &mut mixture)?;
                    Mlp::Experts(Box::new(mixture))
                }
                _ => Mlp::Dense(DenseMlp {
                    gate: proj("ffn_gate", Role::Up, false)?,
                    up: proj("ffn_up", Role::Up, false)?,
                    down: proj("ffn_down", Role::Down, false)?,
                }),
            };
            let mixer: Box<dyn TokenMixer> = if let Some(source) = config.layer_attention(i).kv_from
            {
                Box::new(gguf_per_layer::shared_attention(
                    &parts,
                    config,
                    (&p, i, source),
                )?)
            } else if attends {
                let qk_norm = if config.variant.qk_norm {
                    Some((
                        norm("attn_q_norm", Role::HeadNorm)?,
                        norm("attn_k_norm", Role::HeadNorm)?,
                    ))
                } else {
                    None
                };
                let linear = |t: QTensor| Linear::from_qtensor(t, None, dtype);
                let fused_qkv = format!("{p}.attn_qkv.weight");
                let (q, k, v, output_gate) = match config.variant.gated_attention {
                    // Each head's query and gate, then keys and values, in one tensor.
                    true if has(&fused_qkv) => {
                        let weight = tensor(&fused_qkv)?;
                        let kv = config.kv_row_width();
                        let parts = [2 * config.attention_width(), kv, kv];
                        let [qg, k, v] = <[QTensor; 3]>::try_from(split_quantized(
                            &weight, &parts,
                        )?)
                        .map_err(|_| Error::Metadata(format!("{fused_qkv} split wrongly")))?;
                        let [q, gate] = deal_quantized(&qg, config.head_dim)?;
                        (linear(q)?, linear(k)?, linear(v)?, Some(linear(gate)?))
                    }
                    true => {
                        let full = format!("{p}.attn_q.weight");
                        let weight = tensor(&full)?;
                        shapes.check(&full, Role::GatedQ, weight.shape().dims())?;
                        let [q, gate] = deal_quantized(&weight, config.head_dim)?;
                        let (k, v) = (
                            proj("attn_k", Role::Kv, bias)?,
                            proj("attn_v", Role::Kv, bias)?,
                        );
                        (linear(q)?, k, v, Some(linear(gate)?))
                    }
                    false => {
                        let k = proj("attn_k", Role::Kv, bias)?;
                        // Gemma 4's global layers of 26B and 31B read their keys' projection
                        // as values (which are then normed, not rotated).
                        let v = match has(&format!("{p}.attn_v.weight")) {
                            false if config.variant.value_norm => k.clone(),
                            _ => proj("attn_v", Role::Kv, bias)?,
                        };
                        (proj("attn_q", Role::Q, bias)?, k, v, None)
                    }
                };
                // gpt-oss: a bias on the output projection, and a sink logit per query head.
                let o_bias = has(&format!("{p}.attn_output.bias"));
                let sinks_name = format!("{p}.attn_sinks.weight");
                let sinks = match has(&sinks_name) {
                    true => {
                        let values = dense(tensor(&sinks_name)?)?
                            .flatten_all()?
                            .to_vec1::<f32>()?;
                        if values.len() != config.num_heads {
                            return Err(Error::Metadata(format!(
                                "tensor {sinks_name} holds {} sinks for {} query heads",
                                values.len(),
                                config.num_heads
                            )));
                        }
                        Some(values)
                    }
                    false => None,
                };
                Box::new(AttentionWeights {
                    qk_norm,
                    q,
                    k,
                    v,
                    o: proj("attn_output", Role::O, o_bias)?,
                    output_gate,
                    sinks,
                })
            } else if let LayerMixer::DeltaNet(shape) = config.layer_mixer(i) {
                Box::new(DeltaNetWeights::new(
                    shape,
                    expert_tensors.delta_net(&p, shape, &shapes)?,
                )?)
            } else if let LayerMixer::Mamba2(shape) = config.layer_mixer(i) {
                Box::new(Mamba2Weights::new(
                    shape,
                    expert_tensors.mamba2(&p, shape, &shapes)?,
                )?)
            } else {
                let conv = dense(tensor(&format!("{p}.shortconv.conv.weight"))?)?;
                let in_proj = proj("shortconv.in_proj", Role::ConvIn, false)?;
                let out_proj = proj("shortconv.out_proj", Role::ConvOut, false)?;
                let h = config.hidden_size;
                Box::new(ShortConvWeights::new(in_proj, &conv, out_proj, h)?)
            };
            (mixer, mlp)
        };
        let post_norms = if config.variant.post_norms {
            Some((
                norm("post_attention_norm", Role::Norm)?,
                norm("post_ffw_norm", Role::Norm)?,
            ))
        } else {
            None
        };
        let width = (ple_width > 0).then_some(ple_width);
        let (per_layer_input, output_scale) =
            gguf_per_layer::block_parts(&parts, &p, config.hidden_size, width)?;
        layers.push(LayerWeights {
            attn_norm: norm("attn_norm", Role::Norm)?,
            post_norms,
            mixer,
            mlp_norm: match has(&format!("{p}.ffn_norm.weight")) {
                true => norm("ffn_norm", Role::Norm)?,
                // Qwen3.5's converter names the norm before the MLP after the attention.
                false => norm("post_attention_norm", Role::Norm)?,
            },
            mlp,
            per_layer_input,
            output_scale,
        });
    }
    let weights = ModelWeights {
        per_layer,
        embedding,
        layers,
        final_norm,
        lm_head,
    };
    Ok(weights)
}
