//! Granite 4.0-H from an HF checkpoint (`GraniteMoeHybridForCausalLM`, model type
//! `granitemoehybrid`), as transformers reads it: which layers are Mamba-2 (`layer_types`
//! `mamba` or `linear_attention`; the others `attention` / `full_attention`), their shape
//! (`mamba_n_heads`, `mamba_n_groups`, `mamba_d_state`, `mamba_d_head` or `auto`,
//! `mamba_d_conv`, `mamba_expand`), RoPE only where `position_embedding_type` is `rope`, the
//! µP factors (`embedding_multiplier`, `residual_multiplier`, `attention_multiplier` as the
//! whole query scale, logits divided by `logits_scaling`); the tensors of a Mamba-2 layer
//! (`mamba.in_proj` cut into the gate, `x B C` and the steps; `conv1d` with its bias,
//! `dt_bias`, `A_log`, `D`, `norm`, `out_proj`) and the MLP (`shared_mlp.input_linear`, gate
//! rows then up rows, and `output_linear`; with experts, `block_sparse_moe.router.layer`,
//! `input_linear` `[experts, 2 * width, hidden]` and `output_linear`, the shared MLP beside
//! them without a gate). A bias on the input projection, or a clamp on the step, is refused
//! by name.

use candle_core::{DType, Tensor};
use serde::Deserialize;

use crate::model::arch::FileFacts;
use crate::model::config::{DeltaNetShape, KeyHeadsOfValues, Moe};
use crate::model::experts::{DenseMlp, ExpertMlp, Mlp, SharedExpert};
use crate::model::hf_delta_net::f32_vector;
use crate::model::linear::Linear;
use crate::model::mixer::Mamba2Parts;
use crate::model::shapes::split_dense;
use crate::{Error, Result};

/// Granite's keys of `config.json`.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct HfGranite {
    #[serde(default)]
    mamba_n_heads: Option<usize>,
    #[serde(default)]
    mamba_n_groups: Option<usize>,
    #[serde(default)]
    mamba_d_state: Option<usize>,
    #[serde(default)]
    mamba_d_head: Option<serde_json::Value>,
    #[serde(default)]
    mamba_d_conv: Option<usize>,
    #[serde(default)]
    mamba_expand: Option<usize>,
    #[serde(default)]
    mamba_conv_bias: Option<bool>,
    #[serde(default)]
    mamba_proj_bias: Option<bool>,
    #[serde(default)]
    time_step_limit: Option<Vec<f64>>,
    #[serde(default)]
    embedding_multiplier: Option<f64>,
    #[serde(default)]
    residual_multiplier: Option<f64>,
    #[serde(default)]
    attention_multiplier: Option<f64>,
    #[serde(default)]
    logits_scaling: Option<f64>,
    #[serde(default)]
    shared_intermediate_size: Option<usize>,
    #[serde(default)]
    position_embedding_type: Option<String>,
}

/// transformers' defaults where the config is silent.
const DEFAULT_HEADS: usize = 128;
const DEFAULT_STATE: usize = 256;

impl HfGranite {
    /// What the keys say, into `facts` (whose layer count and width are set): the layers'
    /// kinds from `layer_types`, each attending one with `kv_heads`.
    pub(crate) fn apply(
        &self,
        layer_types: Option<&[String]>,
        kv_heads: usize,
        facts: &mut FileFacts,
    ) -> Result<()> {
        let kinds = layer_types.ok_or_else(|| {
            Error::Metadata("config.json: missing layer_types (which layers are Mamba-2)".into())
        })?;
        facts.kv_heads_per_layer = Some(
            kinds
                .iter()
                .map(|k| match k.as_str() {
                    "mamba" | "linear_attention" => Ok(0),
                    "attention" | "full_attention" => Ok(kv_heads),
                    other => Err(Error::Metadata(format!(
                        "config.json: layer type '{other}' (mamba or attention expected)"
                    ))),
                })
                .collect::<Result<Vec<usize>>>()?,
        );
        if self.mamba_proj_bias == Some(true) {
            return Err(Error::Metadata(
                "mamba_proj_bias: a Mamba-2 input projection with a bias is not supported".into(),
            ));
        }
        if let Some(limit) = &self.time_step_limit {
            if limit.first().is_some_and(|&lo| lo > 0.0)
                || limit.get(1).is_some_and(|&hi| hi.is_finite())
            {
                return Err(Error::Metadata(format!(
                    "time_step_limit = {limit:?}: a clamped Mamba-2 step is not supported"
                )));
            }
        }
        let heads = self.mamba_n_heads.unwrap_or(DEFAULT_HEADS);
        let inner = self.mamba_expand.unwrap_or(2) * facts.hidden_size;
        let head_dim = match &self.mamba_d_head {
            None => inner / heads.max(1),
            Some(serde_json::Value::String(s)) if s == "auto" => inner / heads.max(1),
            Some(v) => v.as_u64().map(|d| d as usize).ok_or_else(|| {
                Error::Metadata(format!("config.json: mamba_d_head = {v} is not a width"))
            })?,
        };
        if head_dim * heads != inner {
            return Err(Error::Metadata(format!(
                "config.json: {heads} Mamba-2 heads of {head_dim} for {inner} channels \
                 (mamba_expand * hidden_size)"
            )));
        }
        facts.delta_net = Some(DeltaNetShape {
            kernel: self.mamba_d_conv.unwrap_or(4),
            key_heads: self.mamba_n_groups.unwrap_or(1),
            value_heads: heads,
            key_dim: self.mamba_d_state.unwrap_or(DEFAULT_STATE),
            value_dim: head_dim,
            key_heads_of_values: KeyHeadsOfValues::Grouped,
        });
        facts.no_rope = self.position_embedding_type.as_deref() != Some("rope");
        let factor = |x: Option<f64>| x.filter(|&x| x != 1.0).map(|x| x as f32);
        facts.embedding_scale = factor(self.embedding_multiplier);
        facts.residual_scale = factor(self.residual_multiplier);
        facts.logit_scale = factor(self.logits_scaling);
        facts.attention_scale = Some(self.attention_multiplier.unwrap_or(1.0) as f32);
        if let Some(experts) = &mut facts.experts {
            experts.shared_width = self.shared_intermediate_size;
        }
        Ok(())
    }

    /// The dense MLP's width (the shared MLP is the MLP of a model without experts).
    pub(crate) fn dense_width(&self) -> Option<usize> {
        self.shared_intermediate_size
    }

    /// Whether a convolution has a bias (transformers' default: yes).
    fn conv_bias(&self) -> bool {
        self.mamba_conv_bias.unwrap_or(true)
    }

    /// Layer `p`'s (`model.layers.N`) Mamba-2 tensors from `load`.
    pub(crate) fn mamba2_parts(
        &self,
        p: &str,
        shape: DeltaNetShape,
        hidden: usize,
        load: &dyn Fn(&str) -> Result<Tensor>,
        dtype: Option<DType>,
    ) -> Result<Mamba2Parts> {
        let m = format!("{p}.mamba");
        let (width, channels, heads) = (
            shape.value_width(),
            shape.conv_channels(),
            shape.value_heads,
        );
        let vector = |name: &str, len: usize| f32_vector(load, &format!("{m}.{name}"), len);
        let matrix =
            |name: &str, dims: [usize; 2]| shaped(load, &format!("{m}.{name}.weight"), &dims);
        let input = matrix("in_proj", [width + channels + heads, hidden])?;
        let [gate, xbc, dt] =
            <[Tensor; 3]>::try_from(split_dense(&input, &[width, channels, heads])?)
                .map_err(|_| Error::Metadata(format!("tensor {m}.in_proj split wrongly")))?;
        let linear = |t: Tensor| Linear::from_dense(t, None, dtype);
        // transformers keeps `A_log`; the decay factor is `-exp(A_log)`.
        let decay = vector("A_log", heads)?
            .into_iter()
            .map(|x| -x.exp())
            .collect();
        Ok(Mamba2Parts {
            gate: linear(gate)?,
            xbc: linear(xbc)?,
            dt: linear(dt)?,
            conv: load(&format!("{m}.conv1d.weight"))?.to_dtype(DType::F32)?,
            conv_bias: match self.conv_bias() {
                true => vector("conv1d.bias", channels)?,
                false => vec![0.0; channels],
            },
            dt_bias: vector("dt_bias", heads)?,
            decay,
            skip: vector("D", heads)?,
            norm: vector("norm.weight", width)?,
            out: linear(matrix("out_proj", [hidden, width])?)?,
        })
    }

    /// Layer `p`'s MLP: the shared MLP of `width`, or the mixture `moe` beside it.
    pub(crate) fn mlp(
        &self,
        p: &str,
        moe: Option<&Moe>,
        (hidden, width): (usize, usize),
        load: &dyn Fn(&str) -> Result<Tensor>,
        dtype: Option<DType>,
    ) -> Result<Mlp> {
        let linear = |t: Tensor| Linear::from_dense(t.contiguous()?, None, dtype);
        let checked = |name: &str, dims: &[usize]| shaped(load, name, dims);
        let shared_width = moe.and_then(|m| m.shared_width).unwrap_or(width);
        let s = format!("{p}.shared_mlp");
        let both = checked(
            &format!("{s}.input_linear.weight"),
            &[2 * shared_width, hidden],
        )?;
        let shared = DenseMlp {
            gate: linear(both.narrow(0, 0, shared_width)?)?,
            up: linear(both.narrow(0, shared_width, shared_width)?)?,
            down: linear(checked(
                &format!("{s}.output_linear.weight"),
                &[hidden, shared_width],
            )?)?,
        };
        let Some(moe) = moe else {
            return Ok(Mlp::Dense(shared));
        };
        let (n, w) = (moe.num_experts, moe.expert_width);
        let b = format!("{p}.block_sparse_moe");
        let router = checked(&format!("{b}.router.layer.weight"), &[n, hidden])?
            .to_dtype(DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        let gate_up = checked(&format!("{b}.input_linear.weight"), &[n, 2 * w, hidden])?;
        let down = checked(&format!("{b}.output_linear.weight"), &[n, hidden, w])?;
        let experts = (0..n)
            .map(|e| {
                let both = gate_up.get(e)?;
                Ok(DenseMlp {
                    gate: linear(both.narrow(0, 0, w)?)?,
                    up: linear(both.narrow(0, w, w)?)?,
                    down: linear(down.get(e)?)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Mlp::Experts(Box::new(ExpertMlp {
            router,
            router_bias: None,
            experts,
            shared: Some(SharedExpert {
                mlp: shared,
                gate: None,
            }),
            top_k: moe.experts_per_token,
            normalize: moe.normalize,
            beside: None,
        })))
    }
}

/// Tensor `name` from `load`, an error naming it unless it is `dims`.
fn shaped(load: &dyn Fn(&str) -> Result<Tensor>, name: &str, dims: &[usize]) -> Result<Tensor> {
    let w = load(name)?;
    if w.dims() != dims {
        return Err(Error::Metadata(format!(
            "tensor {name} has shape {:?}, but the config implies {dims:?}",
            w.dims()
        )));
    }
    Ok(w)
}
