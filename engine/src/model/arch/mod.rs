//! The decoder families thicket runs, each declared in its own file as how it departs from the
//! llama baseline (`Family`): attention biases, QK norm, norm placement and weight convention,
//! activation, embedding scale, soft-capping, which layers attend through a sliding window and
//! with which RoPE base, which layers mix positions by something other than attention. The GGUF and HF loaders read a file's keys into `FileFacts` and the
//! family resolves them into the `Variant` of `ModelConfig` that every forward reads; there is
//! no forward per family. A key a family needs and the file lacks, or an option thicket does not
//! implement, is an error naming it.

mod gemma2;
mod gemma3;
mod gemma4;
mod gptoss;
mod granitehybrid;
mod lfm2;
mod llama;
mod mistral;
mod mixers;
mod mixtral;
mod phi3;
mod qwen2;
mod qwen2moe;
mod qwen3;
mod qwen35;
mod qwen35moe;
mod qwen3moe;
mod qwen3next;

use crate::model::config::{
    Activation, DeltaNetShape, KeyHeadsOfValues, LayerAttention, Moe, RopeScaling, RopeStyle,
    Variant,
};
use crate::{Error, Result};

/// Decoder family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    /// Llama 1-3 and SmolLM2: the baseline.
    Llama,
    /// Qwen2 / Qwen2.5: q/k/v biases.
    Qwen2,
    /// Qwen3 (dense): QK norm, no biases, heads wider than the residual.
    Qwen3,
    /// Mistral: llama with a sliding window where the config sets one.
    Mistral,
    /// Phi-3: fused q/k/v and gate/up projections, a window where set.
    Phi3,
    /// Gemma 2: pre and post norms, GeGLU, scaled embedding, soft-capped attention and
    /// logits, every other layer windowed.
    Gemma2,
    /// Gemma 3 (text): QK norm, pre and post norms, GeGLU, scaled embedding, five windowed
    /// layers to one global, a local RoPE base for the windowed ones.
    Gemma3,
    /// Gemma 4 (text): Gemma 3's block with unit-scaled attention, normed values, global
    /// layers of wider heads with proportional RoPE, keys and values shared by the last
    /// layers, per-layer embeddings.
    Gemma4,
    /// Qwen3-MoE: Qwen3's attention, a mixture of experts in every layer.
    Qwen3Moe,
    /// Mixtral: Mistral's block with a mixture of experts (GGUF files say `llama`).
    Mixtral,
    /// Qwen2-MoE: Qwen2's attention, experts beside a gated shared expert.
    Qwen2Moe,
    /// LFM2: short convolutions in most layers, attention with QK norm in the others.
    Lfm2,
    /// Qwen3.5 / Qwen3.6 dense hybrids.
    Qwen35,
    /// Qwen3.5 / Qwen3.6 mixtures of experts.
    Qwen35Moe,
    /// Qwen3-Next.
    Qwen3Next,
    /// Granite 4.0-H: Mamba-2 layers and attention without RoPE, µP scales.
    GraniteHybrid,
    /// gpt-oss: biased attention with sinks, alternate windowed layers, biased experts
    /// with a clamped SwiGLU.
    GptOss,
}

/// Every family, for lookups and error messages.
const FAMILIES: &[&Family] = &[
    &llama::FAMILY,
    &qwen2::FAMILY,
    &qwen3::FAMILY,
    &mistral::FAMILY,
    &phi3::FAMILY,
    &gemma2::FAMILY,
    &gemma3::FAMILY,
    &gemma4::FAMILY,
    &qwen3moe::FAMILY,
    &mixtral::FAMILY,
    &qwen2moe::FAMILY,
    &lfm2::FAMILY,
    &qwen35::FAMILY,
    &qwen35moe::FAMILY,
    &qwen3next::FAMILY,
    &granitehybrid::FAMILY,
    &gptoss::FAMILY,
];

impl Architecture {
    /// Parses a GGUF `general.architecture`, an HF `architectures` entry or `model_type`.
    pub fn parse(name: &str) -> Result<Self> {
        FAMILIES
            .iter()
            .find(|f| f.gguf == name || f.hf.contains(&name))
            .map(|f| f.architecture)
            .ok_or_else(|| Error::UnsupportedArchitecture(name.to_string()))
    }

    /// Name as written in GGUF metadata keys.
    pub fn as_str(self) -> &'static str {
        self.family().gguf
    }

    /// The family's declaration.
    pub fn family(self) -> &'static Family {
        FAMILIES
            .iter()
            .find(|f| f.architecture == self)
            .copied()
            .unwrap_or(&llama::FAMILY)
    }

    /// The names `parse` accepts, for error messages.
    pub fn supported() -> Vec<&'static str> {
        FAMILIES.iter().map(|f| f.gguf).collect()
    }
}

/// Which layers attend through a sliding window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Windows {
    /// None: every layer attends fully (a window in the file is an error).
    Never,
    /// Every layer, where the file sets a window.
    WhereSet,
    /// Every layer but each `period`-th (layers `period - 1`, `2 * period - 1`, ... are
    /// global); the window is required.
    AllButEvery(usize),
}

/// Which layers mix positions by something other than attention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mixers {
    /// None: every layer attends (a layer without KV heads is an error).
    Attention,
    /// A layer the file gives no KV heads is a short convolution as wide as the file says
    /// (LFM2); the others attend.
    ShortConvWhereNoKv,
    /// Gated DeltaNet layers, and gated attention (`Variant::gated_attention`) in every
    /// `interval`-th layer unless the file lists the recurrent layers (Qwen3.5, Qwen3-Next);
    /// the value heads read their key heads as `key_heads_of_values` says.
    DeltaNet {
        /// Every this many layers, the last attends (where the file does not say).
        interval: usize,
        /// How value heads share key heads.
        key_heads_of_values: KeyHeadsOfValues,
    },
    /// A layer the file gives no KV heads is Mamba-2 in the file's shape (`ssm.*`), its
    /// consecutive heads sharing a group (Granite 4.0-H); the others attend.
    Mamba2WhereNoKv,
}

/// How one family departs from the llama baseline.
#[derive(Debug, Clone, Copy)]
pub struct Family {
    /// The enum value.
    pub architecture: Architecture,
    /// GGUF `general.architecture` (and the prefix of its keys).
    pub gguf: &'static str,
    /// HF `architectures` / `model_type` names.
    pub hf: &'static [&'static str],
    /// q/k/v projections carry biases (HF `attention_bias` may override).
    pub attention_bias: bool,
    /// Per-head RMSNorm of queries and keys before RoPE.
    pub qk_norm: bool,
    /// q/k/v and gate/up projections stored fused, split at load.
    pub fused_projections: bool,
    /// RMSNorm after attention and after the MLP.
    pub post_norms: bool,
    /// The MLP's gate activation.
    pub activation: Activation,
    /// Embedding rows times `sqrt(hidden)`.
    pub scaled_embedding: bool,
    /// RoPE pairing of GGUF weights (HF weights always pair halves).
    pub gguf_rope_style: RopeStyle,
    /// Added to RMSNorm weights of HF checkpoints (Gemma stores `weight - 1`; GGUF files
    /// have the 1 added at conversion).
    pub hf_norm_offset: f32,
    /// Which layers are windowed.
    pub windows: Windows,
    /// RoPE base of the windowed layers where the file gives none (`None`: the global base).
    pub local_rope_theta: Option<f32>,
    /// Layer counts at which a GGUF file's queries are scaled by `1/sqrt(hidden / heads)`
    /// rather than `1/sqrt(head_dim)`: Gemma's 27B models, whose `query_pre_attn_scalar`
    /// GGUF does not carry (llama.cpp recognises them by their layer count the same way).
    pub gguf_residual_query_scale_at: &'static [usize],
    /// Whether a GGUF file's `rope.scaling.finetuned` switches the attending layers' RoPE
    /// (false: no rotation; absent: rotation), as llama.cpp reads Granite 4.0-H's.
    pub gguf_rope_switch: bool,
    /// Whether the MLP may be a mixture of experts, and how (`None`: never).
    pub experts: Option<Experts>,
    /// Which layers attend and which mix positions otherwise.
    pub mixers: Mixers,
    /// A fixed factor on query-key products (Gemma 4: 1, its QK norms doing the scaling),
    /// where the family sets one.
    pub attention_scale: Option<f32>,
    /// Values RMS-normalized per head, without a weight, before they are stored (Gemma 4).
    pub value_norm: bool,
    /// How the family's HF checkpoints name what transformers' llama calls otherwise:
    /// `(llama's part of a tensor name, this family's)`, e.g. LFM2's `operator_norm` for
    /// `input_layernorm`.
    pub hf_renames: &'static [(&'static str, &'static str)],
}

/// How a family's mixture of experts is declared.
#[derive(Debug, Clone, Copy)]
pub struct Experts {
    /// Whether every file of the family has experts (`false`: where the file declares them,
    /// as llama GGUF files of Mixtral do).
    pub required: bool,
    /// A shared expert beside the routed ones, scaled by a sigmoid gate (Qwen2-MoE).
    pub shared_expert: bool,
    /// Whether the chosen probabilities are divided by their sum where an HF config does
    /// not say (`norm_topk_prob`: transformers' default for the family).
    pub hf_normalize: bool,
    /// The same for GGUF files, which never say: llama.cpp's choice for the family.
    pub gguf_normalize: bool,
}

/// The mixture a file declares.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExpertFacts {
    /// Experts per layer.
    pub count: usize,
    /// Experts per token.
    pub used: usize,
    /// Inner width of one expert.
    pub width: usize,
    /// Inner width of the shared expert.
    pub shared_width: Option<usize>,
    /// `norm_topk_prob`, where the file gives it (a GGUF loader gives the family's
    /// `gguf_normalize`).
    pub normalize: Option<bool>,
    /// Per layer whether its MLP is the experts, where the file says some are dense.
    pub sparse_layers: Option<Vec<bool>>,
}

/// What a file says about the options a family may take, whichever format it came in.
#[derive(Debug, Clone, Default)]
pub struct FileFacts {
    /// Layers.
    pub num_layers: usize,
    /// Residual width.
    pub hidden_size: usize,
    /// Sliding window length.
    pub window: Option<usize>,
    /// Explicit per-layer kinds (`true`: windowed), as HF's `layer_types` gives them.
    pub windowed_layers: Option<Vec<bool>>,
    /// The period of global layers, where the file overrides the family's.
    pub window_period: Option<usize>,
    /// RoPE base of the windowed layers.
    pub local_rope_theta: Option<f32>,
    /// Factor on query-key products.
    pub attention_scale: Option<f32>,
    /// Attention score soft-cap.
    pub attention_softcap: Option<f32>,
    /// Final logit soft-cap.
    pub final_softcap: Option<f32>,
    /// RoPE scaling.
    pub rope_scaling: RopeScaling,
    /// Rotated dimensions per head, where fewer than the head.
    pub rotary_dim: Option<usize>,
    /// A mixture of experts, where the file declares one.
    pub experts: Option<ExpertFacts>,
    /// KV heads of each layer, where the file gives them per layer (0: the layer does not
    /// attend).
    pub kv_heads_per_layer: Option<Vec<usize>>,
    /// Positions a short convolution spans, where the file gives it.
    pub conv_kernel: Option<usize>,
    /// A Gated DeltaNet layer's shape, where the file gives one (its `key_heads_of_values`
    /// is the family's to say).
    pub delta_net: Option<DeltaNetShape>,
    /// Per layer, whether it is recurrent, where the file lists them.
    pub recurrent_layers: Option<Vec<bool>>,
    /// Every this many layers the last attends, where the file says.
    pub full_attention_interval: Option<usize>,
    /// Which key head each value head reads, where the file's layout says (an HF
    /// checkpoint groups them; the family's GGUF layout otherwise).
    pub key_heads_of_values: Option<KeyHeadsOfValues>,
    /// The attending layers do not rotate (Granite 4.0-H's files turn RoPE off).
    pub no_rope: bool,
    /// Factor on the embedding rows, where the file gives one.
    pub embedding_scale: Option<f32>,
    /// Factor on each mixer's and MLP's output before its residual add.
    pub residual_scale: Option<f32>,
    /// Divisor of the final logits.
    pub logit_scale: Option<f32>,
    /// The KV heads and head width of the global layers, where they differ.
    pub global_heads: Option<(usize, usize)>,
    /// Pairs of a global head that RoPE turns, proportionally (Gemma 4).
    pub proportional_pairs: Option<usize>,
    /// The last layers that read an earlier layer's keys and values instead of their own.
    pub shared_kv_layers: usize,
    /// Per layer, the MLP's inner width, where the file gives them per layer.
    pub mlp_widths: Option<Vec<usize>>,
}

/// Has the last `shared` layers read the keys and values of the last layer of their own kind
/// (windowed or global) before them, as transformers' Gemma 4 assigns them.
fn share_kv(
    mut layers: Vec<LayerAttention>,
    shared: usize,
    name: &str,
) -> Result<Vec<LayerAttention>> {
    if shared == 0 {
        return Ok(layers);
    }
    let n = layers.len();
    if shared >= n {
        return Err(Error::Metadata(format!(
            "{name}: {shared} layers sharing keys and values of {n} leaves none to keep them"
        )));
    }
    let first = n - shared;
    for i in first..n {
        let window = layers[i].window;
        let source = (0..first).rev().find(|&j| layers[j].window == window);
        let Some(source) = source else {
            return Err(Error::Metadata(format!(
                "{name}: layer {i} shares keys and values, but no earlier layer of its kind \
                 keeps any"
            )));
        };
        layers[i].kv_from = Some(source);
    }
    Ok(layers)
}

impl Family {
    /// The forward's `Variant` for a file with `facts`.
    pub fn variant(&self, facts: &FileFacts) -> Result<Variant> {
        let n = facts.num_layers;
        let layers: Vec<LayerAttention> = match (self.windows, facts.window) {
            (Windows::Never, Some(_)) => {
                return Err(Error::Metadata(format!(
                    "{}: a sliding window is set, but this family has none",
                    self.gguf
                )))
            }
            (Windows::Never, None) | (Windows::WhereSet, None) => Vec::new(),
            (Windows::WhereSet, Some(w)) => vec![
                LayerAttention {
                    window: Some(w),
                    local_rope: false,
                    kv_from: None,
                };
                n
            ],
            (Windows::AllButEvery(_), None) => {
                return Err(Error::Metadata(format!(
                    "{}: missing the sliding window length",
                    self.gguf
                )))
            }
            (Windows::AllButEvery(period), Some(w)) => {
                let windowed: Vec<bool> = match &facts.windowed_layers {
                    Some(kinds) if kinds.len() != n => {
                        return Err(Error::Metadata(format!(
                            "{} layer kinds for {n} layers",
                            kinds.len()
                        )))
                    }
                    Some(kinds) => kinds.clone(),
                    None => {
                        let period = facts.window_period.unwrap_or(period).max(1);
                        (0..n).map(|i| (i + 1) % period != 0).collect()
                    }
                };
                windowed
                    .into_iter()
                    .map(|on| LayerAttention {
                        window: on.then_some(w),
                        local_rope: on && self.local_rope_theta.is_some(),
                        kv_from: None,
                    })
                    .collect()
            }
        };
        let layers = share_kv(layers, facts.shared_kv_layers, self.gguf)?;
        Ok(Variant {
            qk_norm: self.qk_norm,
            post_norms: self.post_norms,
            activation: self.activation,
            embedding_scale: facts.embedding_scale.or(self
                .scaled_embedding
                .then(|| (facts.hidden_size as f32).sqrt())),
            residual_scale: facts.residual_scale,
            logit_scale: facts.logit_scale,
            attention_scale: self.attention_scale.or(facts.attention_scale),
            attention_softcap: facts.attention_softcap,
            final_softcap: facts.final_softcap,
            local_rope_theta: layers
                .iter()
                .any(|l| l.local_rope)
                .then(|| facts.local_rope_theta.or(self.local_rope_theta))
                .flatten(),
            layers,
            rope_scaling: facts.rope_scaling.clone(),
            rotary_dim: match facts.no_rope {
                true => Some(0),
                false => facts.rotary_dim,
            },
            moe: self.moe(facts)?,
            mixers: self.mixers(facts)?,
            gated_attention: matches!(self.mixers, Mixers::DeltaNet { .. }),
            global_heads: facts.global_heads,
            proportional_pairs: facts.proportional_pairs,
            value_norm: self.value_norm,
            mlp_widths: facts.mlp_widths.clone().unwrap_or_default(),
        })
    }

    /// The mixture of experts a file with `facts` has, checked against the declaration.
    fn moe(&self, facts: &FileFacts) -> Result<Option<Moe>> {
        let name = self.gguf;
        let (declared, found) = match (&self.experts, &facts.experts) {
            (None, None) => return Ok(None),
            (None, Some(found)) => {
                return Err(Error::Metadata(format!(
                    "{name}: the file declares {} experts, but this family has none",
                    found.count
                )))
            }
            (Some(declared), None) if declared.required => {
                return Err(Error::Metadata(format!(
                    "{name}: missing the expert count (a mixture of experts is required)"
                )))
            }
            (Some(_), None) => return Ok(None),
            (Some(declared), Some(found)) => (declared, found),
        };
        match (declared.shared_expert, found.shared_width) {
            (true, None) => {
                return Err(Error::Metadata(format!(
                    "{name}: missing the shared expert's width"
                )))
            }
            (false, Some(_)) => {
                return Err(Error::Metadata(format!(
                    "{name}: the file declares a shared expert, but this family has none"
                )))
            }
            _ => {}
        }
        Ok(Some(Moe {
            num_experts: found.count,
            experts_per_token: found.used,
            expert_width: found.width,
            normalize: found.normalize.unwrap_or(declared.hf_normalize),
            shared_width: found.shared_width,
            sparse_layers: found.sparse_layers.clone().unwrap_or_default(),
        }))
    }
}
