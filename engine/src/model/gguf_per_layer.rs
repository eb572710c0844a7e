//! GGUF tensors of the block parts Gemma 4 adds, by llama.cpp's names: per-layer embeddings
//! (`per_layer_token_embd`, `per_layer_model_proj`, `per_layer_proj_norm`, and each block's
//! `inp_gate`, `proj`, `post_norm`), each block's output scale (`layer_output_scale`), and the
//! attention of a layer that reads an earlier layer's keys and values (`attn_q`, its norm and
//! `attn_output` only; keys and values the file may still carry for it are not read), and the
//! 26B's mixture of experts beside each layer's dense MLP.

use candle_core::quantized::QTensor;
use candle_core::DType;
use candle_core::Tensor;

use crate::model::embedding::Embedding;
use crate::model::experts::{Beside, DenseMlp, ExpertMlp, SharedExpert};
use crate::model::linear::Linear;
use crate::model::per_layer::{PerLayerEmbedding, PerLayerInput};
use crate::model::shapes::{Role, Shapes};
use crate::model::{ModelConfig, SharedKvAttention};
use crate::{Error, Result};

/// How the loader reads a tensor: by name, whether the file has it, and dequantized.
pub(super) struct Reader<'a> {
    pub tensor: &'a dyn Fn(&str) -> Result<QTensor>,
    pub has: &'a dyn Fn(&str) -> bool,
    pub dense: &'a dyn Fn(QTensor) -> Result<Tensor>,
    /// The dtype dense weights take (`None`: kept quantized).
    pub dtype: Option<DType>,
    /// Whether the embedding tables stay in their blocks.
    pub quantized_tables: bool,
}

impl Reader<'_> {
    /// A `[rows, cols]` projection named `name`, checked.
    fn linear(&self, name: &str, dims: [usize; 2]) -> Result<Linear> {
        let t = (self.tensor)(name)?;
        check(name, t.shape().dims(), &dims)?;
        Linear::from_qtensor(t, None, self.dtype)
    }

    /// A vector of `len` values named `name`, checked.
    fn vector(&self, name: &str, len: usize) -> Result<Tensor> {
        let t = (self.dense)((self.tensor)(name)?)?;
        check(name, t.dims(), &[len])?;
        Ok(t)
    }
}

fn check(name: &str, dims: &[usize], want: &[usize]) -> Result<()> {
    match dims == want {
        true => Ok(()),
        false => Err(Error::Metadata(format!(
            "tensor {name} has shape {dims:?}, but the config implies {want:?}"
        ))),
    }
}

/// `{arch}.embedding_length_per_layer_input`: the per-layer embeddings' width (0: none).
pub(super) fn width(
    md: &std::collections::HashMap<String, candle_core::quantized::gguf_file::Value>,
    arch: &str,
) -> Result<usize> {
    let name = format!("{arch}.embedding_length_per_layer_input");
    Ok(md
        .get(&name)
        .map(|v| crate::model::gguf_keys::as_u64(v, &name))
        .transpose()?
        .unwrap_or(0) as usize)
}

/// The per-layer embeddings of a file whose `embedding_length_per_layer_input` is `width`
/// (none where it is 0 or absent).
pub(super) fn per_layer_embedding(
    r: &Reader<'_>,
    cfg: &ModelConfig,
    width: usize,
) -> Result<Option<PerLayerEmbedding>> {
    if width == 0 {
        return Ok(None);
    }
    let all = width * cfg.num_layers;
    let name = "per_layer_token_embd.weight";
    let table = (r.tensor)(name)?;
    check(name, table.shape().dims(), &[cfg.vocab_size, all])?;
    let table = match r.quantized_tables {
        true => Embedding::Quantized(std::sync::Arc::new(table)),
        false => Embedding::Dense((r.dense)(table)?),
    };
    Ok(Some(PerLayerEmbedding {
        table,
        projection: r.linear("per_layer_model_proj.weight", [all, cfg.hidden_size])?,
        norm: r.vector("per_layer_proj_norm.weight", width)?,
        width,
    }))
}

/// Block `p`'s per-layer input (where the model has per-layer embeddings of `width`) and
/// output scale (where the file has one).
pub(super) fn block_parts(
    r: &Reader<'_>,
    p: &str,
    hidden: usize,
    width: Option<usize>,
) -> Result<(Option<PerLayerInput>, Option<f32>)> {
    let input = match width {
        Some(width) => Some(PerLayerInput {
            gate: r.linear(&format!("{p}.inp_gate.weight"), [width, hidden])?,
            projection: r.linear(&format!("{p}.proj.weight"), [hidden, width])?,
            norm: r.vector(&format!("{p}.post_norm.weight"), hidden)?,
        }),
        None => None,
    };
    let name = format!("{p}.layer_output_scale.weight");
    let scale = match (r.has)(&name) {
        true => {
            let t = r.vector(&name, 1)?;
            Some(t.to_vec1::<f32>()?[0])
        }
        false => None,
    };
    Ok((input, scale))
}

/// The attention of block `p` (layer `index`), which reads layer `source`'s keys and values.
pub(super) fn shared_attention(
    r: &Reader<'_>,
    cfg: &ModelConfig,
    (p, index, source): (&str, usize, usize),
) -> Result<SharedKvAttention> {
    let shapes = Shapes::of_layer(cfg, index);
    let proj = |name: &str, role: Role| {
        let want = shapes.expected(role);
        r.linear(&format!("{p}.{name}.weight"), [want[0], want[1]])
    };
    let q_norm = match cfg.variant.qk_norm {
        true => Some(r.vector(&format!("{p}.attn_q_norm.weight"), cfg.layer_heads(index).1)?),
        false => None,
    };
    Ok(SharedKvAttention {
        source,
        q_norm,
        q: proj("attn_q", Role::Q)?,
        o: proj("attn_output", Role::O)?,
    })
}

/// Where block `p` (layer `index`) has a router scale (`ffn_gate_inp.scale`), sets its
/// mixture beside the layer's dense MLP as Gemma 4 has it (`experts::Beside`): the dense
/// MLP (`ffn_gate`, `ffn_up`, `ffn_down`) as its shared expert, the three norms of the halves
/// (`pre_ffw_norm_2`, `post_ffw_norm_1`, `post_ffw_norm_2`), and each expert's output scale
/// (`ffn_down_exps.scale`) where the file has them.
pub(super) fn place_beside(
    r: &Reader<'_>,
    cfg: &ModelConfig,
    (p, index): (&str, usize),
    mixture: &mut ExpertMlp,
) -> Result<()> {
    let scale_name = format!("{p}.ffn_gate_inp.scale");
    if !(r.has)(&scale_name) {
        return Ok(());
    }
    let hidden = cfg.hidden_size;
    let width = cfg.layer_mlp_width(index);
    let host = |t: Tensor| -> Result<Vec<f32>> { Ok(t.to_vec1::<f32>()?) };
    let norm = |name: &str| host(r.vector(&format!("{p}.{name}.weight"), hidden)?);
    let scales_name = format!("{p}.ffn_down_exps.scale");
    let expert_scales = match (r.has)(&scales_name) {
        true => Some(host(r.vector(&scales_name, mixture.experts.len())?)?),
        false => None,
    };
    let dense = DenseMlp {
        gate: r.linear(&format!("{p}.ffn_gate.weight"), [width, hidden])?,
        up: r.linear(&format!("{p}.ffn_up.weight"), [width, hidden])?,
        down: r.linear(&format!("{p}.ffn_down.weight"), [hidden, width])?,
    };
    mixture.shared = Some(SharedExpert {
        mlp: dense,
        gate: None,
    });
    mixture.beside = Some(Box::new(Beside {
        experts_in: norm("pre_ffw_norm_2")?,
        experts_out: norm("post_ffw_norm_2")?,
        dense_out: norm("post_ffw_norm_1")?,
        router_scale: host(r.vector(&scale_name, hidden)?)?,
        expert_scales,
        eps: cfg.rms_norm_eps as f32,
    }));
    Ok(())
}
