//! `ModelConfig`: the hyper-parameters of a decoder, whichever file format they came from, with
//! everything its family declares (`crate::model::arch`) resolved into plain values the forward
//! reads (`Variant`: QK norm, norm placement, activation, scales, soft-capping, each layer's
//! attention window and RoPE table, a mixture of experts in place of the MLP), plus the facts
//! that differ between formats and must travel with the weights: the RoPE pairing (GGUF llama
//! weights are permuted for interleaved pairs; HF and the other families use halves).

use crate::{Error, Result};

pub use crate::model::arch::Architecture;

/// How RoPE pairs the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Pairs (2i, 2i+1): llama weights as converted to GGUF.
    Interleaved,
    /// Pairs (i, i + d/2): HF checkpoints and GGUF qwen2 ("neox").
    Halves,
}

/// Hyper-parameters of one decoder.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// Family.
    pub architecture: Architecture,
    /// Vocabulary rows in the embedding and head.
    pub vocab_size: usize,
    /// Residual width.
    pub hidden_size: usize,
    /// MLP inner width.
    pub intermediate_size: usize,
    /// Decoder blocks.
    pub num_layers: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads (GQA groups).
    pub num_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// RoPE base.
    pub rope_theta: f32,
    /// RoPE pairing.
    pub rope_style: RopeStyle,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// Longest context the model was trained for.
    pub max_position_embeddings: usize,
    /// q/k/v projections carry biases (qwen2).
    pub attention_bias: bool,
    /// How the family departs from the llama baseline.
    pub variant: Variant,
}

/// The MLP's gate activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Activation {
    /// SiLU (SwiGLU).
    #[default]
    Silu,
    /// GELU with the tanh approximation (GeGLU, Gemma).
    GeluTanh,
    /// gpt-oss's clamped SwiGLU: with `g = min(gate, 7)`, `g * sigmoid(1.702 g) *
    /// (clamp(up, -7, 7) + 1)`.
    SwigluOai,
}

/// RoPE's frequency scaling for long contexts.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum RopeScaling {
    /// Plain RoPE.
    #[default]
    None,
    /// Positions divided by `factor` (frequencies divided by it).
    Linear {
        /// The divisor.
        factor: f32,
    },
    /// Llama 3.1's piecewise scaling of the frequencies.
    Llama3 {
        /// Divisor of the low frequencies.
        factor: f32,
        /// Wavelength bound (in original contexts) below which frequencies are low.
        low_freq_factor: f32,
        /// Wavelength bound above which frequencies are kept.
        high_freq_factor: f32,
        /// The context the model was first trained for.
        original_max_position_embeddings: usize,
    },
    /// Each frequency divided by its own factor (GGUF's `rope_freqs.weight`, which llama.cpp's
    /// converter computes from the Llama 3.1 parameters).
    Factors(Vec<f32>),
    /// YaRN (Qwen2.5 and Qwen3 long contexts, as their configs enable it): each frequency
    /// blended between itself (extrapolation, the fast-rotating ones) and itself divided by
    /// `factor` (interpolation, the slow ones), with a linear ramp between the pairs that turn
    /// `beta_fast` and `beta_slow` times over `original` positions; cos and sin multiplied by
    /// `attention_factor`.
    Yarn {
        /// The context's extension factor.
        factor: f32,
        /// The context the model was first trained for.
        original: usize,
        /// Rotations over `original` above which a pair is extrapolated.
        beta_fast: f32,
        /// Rotations below which a pair is interpolated.
        beta_slow: f32,
        /// Factor on cos and sin (so on queries and keys alike).
        attention_factor: f32,
        /// Whether the ramp's ends are rounded out to whole pairs (llama.cpp always rounds;
        /// transformers unless the config says `truncate: false`, as gpt-oss's does).
        truncate: bool,
    },
    /// Phi-3's LongRoPE: each frequency divided by its own factor, from the long set where the
    /// context in use exceeds `original` positions and from the short set otherwise (the
    /// choice is made once, for every position, as llama.cpp makes it by its context), and
    /// cos and sin multiplied by `attention_factor`.
    LongRope {
        /// Divisors for contexts up to `original`.
        short: Vec<f32>,
        /// Divisors for longer contexts.
        long: Vec<f32>,
        /// The context the model was first trained for.
        original: usize,
        /// Factor on cos and sin (so on queries and keys alike).
        attention_factor: f32,
        /// Whether the long set is in use.
        long_context: bool,
    },
}

/// One layer's attention: all positions, or the last `window` (the row's own included).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LayerAttention {
    /// Keys a row sees at most (`None`: every earlier position).
    pub window: Option<usize>,
    /// Whether the layer rotates with the local RoPE table (`Variant::local_rope_theta`).
    pub local_rope: bool,
    /// The earlier layer whose keys and values this one reads instead of writing its own
    /// (Gemma 4's last layers), where it shares them.
    pub kv_from: Option<usize>,
}

/// Which dimensions of a head RoPE turns and how: pairs `(i, i + offset)` for `i <
/// pairs` in the halves pairing (`(2i, 2i + 1)` interleaved), pair `i` turning at `theta^(-2i
/// / freq_dim)` per position; every other dimension passes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rotary {
    /// Width of the head.
    pub head_dim: usize,
    /// Pairs that turn (the table's width).
    pub pairs: usize,
    /// Distance between the two dimensions of a pair (halves pairing).
    pub offset: usize,
    /// The width in the frequencies' exponent.
    pub freq_dim: usize,
    /// The pairing.
    pub style: RopeStyle,
}

/// What mixes one layer's positions: attention over the paged KV (full or windowed, as the
/// layer's `LayerAttention` says), or a kind that carries per-sequence state instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LayerMixer {
    /// Attention.
    #[default]
    Attention,
    /// A gated short convolution over the last `kernel` positions (LFM2): `B, C, x` from one
    /// projection, `C * conv(B * x)` into the output projection.
    ShortConv {
        /// Positions the convolution spans, the row's own included.
        kernel: usize,
    },
    /// Gated DeltaNet (Qwen3.5, Qwen3-Next): a causal convolution over the last `kernel`
    /// positions of the projected queries, keys and values, then the gated delta rule with a
    /// recurrent state per value head, a gated RMSNorm of its output and the output
    /// projection.
    DeltaNet(DeltaNetShape),
    /// Mamba-2 (Granite 4.0-H): the same convolution over the projected `x, B, C`, then the
    /// selective state space with a state per head (`B` and `C` per group, in the shape's
    /// key heads; the state size as the key width), its skip, the gate `silu(z)` and an
    /// RMSNorm per group before the output projection.
    Mamba2(DeltaNetShape),
}

/// Positions a Gated DeltaNet layer keeps the inputs of, beyond its convolution's window: a
/// draft path accepted by verification is folded into the sequence's state from them at the
/// next forward, so they bound the tokens one verification can accept.
pub const UNFOLDED_POSITIONS: usize = 96;

/// The heads of a Gated DeltaNet layer, or of a Mamba-2 one (whose groups are its key heads,
/// state size its key width, heads its value heads and head width its value width).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DeltaNetShape {
    /// Positions the convolution spans, the row's own included.
    pub kernel: usize,
    /// Query and key heads.
    pub key_heads: usize,
    /// Value heads (each with its own state), a multiple of `key_heads`.
    pub value_heads: usize,
    /// Width of a query or key head (the state's rows).
    pub key_dim: usize,
    /// Width of a value head (the state's columns).
    pub value_dim: usize,
    /// Which key head each value head reads.
    pub key_heads_of_values: KeyHeadsOfValues,
}

impl DeltaNetShape {
    /// Channels of the convolution: queries, keys, then values.
    pub fn conv_channels(&self) -> usize {
        2 * self.key_heads * self.key_dim + self.value_heads * self.value_dim
    }

    /// Width of the values (and of the output gate).
    pub fn value_width(&self) -> usize {
        self.value_heads * self.value_dim
    }

    /// Floats of one sequence's state: a `key_dim x value_dim` matrix per value head.
    pub fn state_len(&self) -> usize {
        self.value_heads * self.key_dim * self.value_dim
    }

    /// The key head value head `head` reads.
    pub fn key_head_of(&self, head: usize) -> usize {
        match self.key_heads_of_values {
            KeyHeadsOfValues::Tiled => head % self.key_heads.max(1),
            KeyHeadsOfValues::Grouped => head / (self.value_heads / self.key_heads.max(1)).max(1),
        }
    }
}

/// How the value heads of a Gated DeltaNet layer share its key heads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeyHeadsOfValues {
    /// Value head `j` reads key head `j % key_heads` (Qwen3.5 as llama.cpp lays it out).
    #[default]
    Tiled,
    /// Value head `j` reads key head `j / (value_heads / key_heads)` (Qwen3-Next).
    Grouped,
}

/// What a family changes in the llama forward, resolved for one model. The default is the
/// llama baseline: pre-norms only, SiLU, no scales beyond `1/sqrt(head_dim)`, full attention.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Variant {
    /// Per-head RMSNorm of queries and keys before RoPE (`q_norm`, `k_norm`).
    pub qk_norm: bool,
    /// RMSNorm after attention and after the MLP, before each residual add (Gemma 2 / 3).
    pub post_norms: bool,
    /// The MLP's gate activation.
    pub activation: Activation,
    /// Factor on the embedding rows (Gemma: `sqrt(hidden)`).
    pub embedding_scale: Option<f32>,
    /// Factor on query-key products (`None`: `1/sqrt(head_dim)`).
    pub attention_scale: Option<f32>,
    /// `cap * tanh(score / cap)` on attention scores before the softmax (Gemma 2).
    pub attention_softcap: Option<f32>,
    /// `cap * tanh(logit / cap)` on the final logits (Gemma 2).
    pub final_softcap: Option<f32>,
    /// Factor on each mixer's and MLP's output before its residual add (Granite).
    pub residual_scale: Option<f32>,
    /// Divisor of the final logits (Granite's `logits_scaling`).
    pub logit_scale: Option<f32>,
    /// Per layer, bottom first; empty means every layer attends fully with the global table.
    pub layers: Vec<LayerAttention>,
    /// RoPE base of the layers marked `local_rope` (Gemma 3's windowed layers).
    pub local_rope_theta: Option<f32>,
    /// Scaling of the global RoPE table.
    pub rope_scaling: RopeScaling,
    /// Leading dimensions of each head that RoPE rotates (`None`: all of them; Phi-4-mini
    /// rotates three quarters and passes the rest through).
    pub rotary_dim: Option<usize>,
    /// A mixture of experts in place of the MLP, in the layers it marks sparse.
    pub moe: Option<Moe>,
    /// Per layer, bottom first, its token mixer; empty means every layer attends.
    pub mixers: Vec<LayerMixer>,
    /// The query projection gives each head's query and then its output gate; the head's
    /// attention output is multiplied by the sigmoid of the gate (Qwen3.5, Qwen3-Next).
    pub gated_attention: bool,
    /// The KV heads and head width of the layers that attend fully, where they differ from
    /// the windowed layers' (`num_kv_heads`, `head_dim`): Gemma 4's global layers.
    pub global_heads: Option<(usize, usize)>,
    /// Pairs RoPE turns in the global layers' heads, where only the leading ones turn with
    /// the frequencies of the whole head, each paired with the dimension half a head on
    /// (Gemma 4's proportional RoPE).
    pub proportional_pairs: Option<usize>,
    /// Values RMS-normalized per head (no weight) before they are stored (Gemma 4).
    pub value_norm: bool,
    /// Per layer, the MLP's inner width, where the layers differ (`intermediate_size`
    /// otherwise).
    pub mlp_widths: Vec<usize>,
}

/// A mixture-of-experts MLP: a softmax router over `num_experts` gated MLPs of width
/// `expert_width`, each row running the `experts_per_token` most probable, their outputs
/// summed with the router's probabilities as weights (divided by the chosen ones' sum where
/// `normalize`); Qwen2-MoE adds a shared expert every row runs, scaled by a sigmoid gate.
#[derive(Debug, Clone, PartialEq)]
pub struct Moe {
    /// Experts per layer.
    pub num_experts: usize,
    /// Experts each row runs (top-k).
    pub experts_per_token: usize,
    /// Inner width of one expert.
    pub expert_width: usize,
    /// The chosen experts' probabilities divided by their sum (`norm_topk_prob`).
    pub normalize: bool,
    /// Inner width of the shared expert, where the family has one.
    pub shared_width: Option<usize>,
    /// Per layer, bottom first, whether its MLP is the experts; empty means every layer's is
    /// (the others keep a dense MLP of `intermediate_size`).
    pub sparse_layers: Vec<bool>,
}

impl Moe {
    /// Whether layer `index`'s MLP is the experts.
    pub fn is_sparse(&self, index: usize) -> bool {
        self.sparse_layers.get(index).copied().unwrap_or(true)
    }
}

impl ModelConfig {
    /// Width of one K (or V) row in the KV store: `num_kv_heads * head_dim`.
    pub fn kv_row_width(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    /// Width of the concatenated query heads: `num_heads * head_dim` (not always the
    /// residual width: Qwen3 and Gemma 3 heads are wider).
    pub fn attention_width(&self) -> usize {
        self.num_heads * self.head_dim
    }

    /// Dimensions of each head that RoPE rotates (all, unless the file says fewer).
    pub fn rotary_dim(&self) -> usize {
        self.variant.rotary_dim.unwrap_or(self.head_dim)
    }

    /// Layer `index`'s KV heads and head width.
    pub fn layer_heads(&self, index: usize) -> (usize, usize) {
        match (
            self.variant.global_heads,
            self.layer_attention(index).window,
        ) {
            (Some(global), None) => global,
            _ => (self.num_kv_heads, self.head_dim),
        }
    }

    /// How RoPE turns layer `index`'s heads.
    pub fn layer_rotary(&self, index: usize) -> Rotary {
        let head_dim = self.layer_heads(index).1;
        let global = !self.layer_attention(index).local_rope;
        match self.variant.proportional_pairs {
            Some(pairs) if global => Rotary {
                head_dim,
                pairs,
                offset: head_dim / 2,
                freq_dim: head_dim,
                style: self.rope_style,
            },
            _ => {
                let rot = match self.variant.rotary_dim {
                    Some(rot) if head_dim == self.head_dim => rot,
                    _ => head_dim,
                };
                Rotary {
                    head_dim,
                    pairs: rot / 2,
                    offset: rot / 2,
                    freq_dim: rot,
                    style: self.rope_style,
                }
            }
        }
    }

    /// How RoPE turns the heads of the layers on the global table (of the windowed ones,
    /// `local`).
    pub fn table_rotary(&self, local: bool) -> Rotary {
        let index = (0..self.num_layers)
            .find(|&i| self.layer_attention(i).local_rope == local)
            .unwrap_or(0);
        self.layer_rotary(index)
    }

    /// Bytes of keys and values layer `index` keeps per position when it attends, at
    /// `value_bytes` a value: none where it reads another layer's.
    pub fn layer_kv_bytes_per_position(&self, index: usize, value_bytes: usize) -> usize {
        match self.layer_attention(index).kv_from {
            Some(_) => 0,
            None => {
                let (kv_heads, head_dim) = self.layer_heads(index);
                2 * kv_heads * head_dim * value_bytes
            }
        }
    }

    /// Layer `index`'s MLP inner width.
    pub fn layer_mlp_width(&self, index: usize) -> usize {
        self.variant
            .mlp_widths
            .get(index)
            .copied()
            .unwrap_or(self.intermediate_size)
    }

    /// Layer `index`'s attention (full with the global table where the family declares none).
    pub fn layer_attention(&self, index: usize) -> LayerAttention {
        self.variant.layers.get(index).copied().unwrap_or_default()
    }

    /// The first of the layers at the end that write nothing of their own (each reads an
    /// earlier layer's keys and values), where there are such layers after one that writes.
    pub fn reading_tail(&self) -> Option<usize> {
        let first = (0..self.num_layers)
            .rev()
            .take_while(|&i| self.layer_attention(i).kv_from.is_some())
            .last()?;
        (first > 0).then_some(first)
    }

    /// Layer `index`'s token mixer.
    pub fn layer_mixer(&self, index: usize) -> LayerMixer {
        self.variant.mixers.get(index).copied().unwrap_or_default()
    }

    /// Keys layer `index` keeps per position when it attends, or values it keeps otherwise
    /// (a short convolution's inputs, f32), and the window of positions it reads (`None`:
    /// all of them).
    pub fn layer_reach(&self, index: usize) -> Option<usize> {
        match self.layer_mixer(index) {
            LayerMixer::Attention => self.layer_attention(index).window,
            LayerMixer::ShortConv { kernel } => Some(kernel),
            LayerMixer::DeltaNet(shape) | LayerMixer::Mamba2(shape) => {
                Some(shape.kernel + UNFOLDED_POSITIONS)
            }
        }
    }

    /// The factor on query-key products.
    pub fn attention_scale(&self) -> f32 {
        self.variant
            .attention_scale
            .unwrap_or((1.0 / (self.head_dim as f64).sqrt()) as f32)
    }

    /// Checks the shape relations the forward relies on.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: &str| Err(Error::Metadata(what.to_string()));
        if self.num_heads == 0 || self.num_kv_heads == 0 || self.num_layers == 0 {
            return bad("head and layer counts must be positive");
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return bad("query heads must be a multiple of key/value heads");
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            return bad("head dimension must be even and positive");
        }
        let v = &self.variant;
        if !v.layers.is_empty() && v.layers.len() != self.num_layers {
            return bad("per-layer attention kinds must cover every layer");
        }
        if v.layers.iter().any(|l| l.window == Some(0)) {
            return bad("an attention window must be positive");
        }
        if v.layers.iter().any(|l| l.local_rope) && v.local_rope_theta.is_none() {
            return bad("layers use a local RoPE table but no local base is set");
        }
        for (i, l) in v.layers.iter().enumerate() {
            if let Some(from) = l.kv_from {
                let source = v.layers.get(from);
                if from >= i
                    || source.is_some_and(|s| s.kv_from.is_some() || s.window != l.window)
                    || self.layer_heads(from) != self.layer_heads(i)
                {
                    return bad(&format!(
                        "layer {i} reads the keys and values of layer {from}: a layer may only \
                         read an earlier one of its own kind that keeps its own"
                    ));
                }
            }
        }
        if let Some((kv_heads, head_dim)) = v.global_heads {
            if kv_heads == 0
                || !self.num_heads.is_multiple_of(kv_heads)
                || head_dim == 0
                || !head_dim.is_multiple_of(2)
            {
                return bad(&format!(
                    "global layers of {kv_heads} KV heads of {head_dim}: query heads must be a \
                     multiple of KV heads, and heads even and positive"
                ));
            }
        }
        if let Some(pairs) = v.proportional_pairs {
            let global = v.global_heads.map_or(self.head_dim, |g| g.1);
            if pairs == 0 || 2 * pairs > global {
                return bad(&format!(
                    "{pairs} turning pairs in heads of {global}: at least one and at most half"
                ));
            }
        }
        if !v.mlp_widths.is_empty() && v.mlp_widths.len() != self.num_layers {
            return bad("per-layer MLP widths must cover every layer");
        }
        if !v.mixers.is_empty() && v.mixers.len() != self.num_layers {
            return bad("per-layer token mixers must cover every layer");
        }
        if v.mixers
            .iter()
            .any(|m| matches!(m, LayerMixer::ShortConv { kernel: 0 }))
        {
            return bad("a short convolution must span at least one position");
        }
        for m in &v.mixers {
            if let LayerMixer::DeltaNet(d) | LayerMixer::Mamba2(d) = m {
                if d.kernel == 0
                    || d.key_heads == 0
                    || d.key_dim == 0
                    || d.value_dim == 0
                    || d.value_heads == 0
                    || !d.value_heads.is_multiple_of(d.key_heads)
                {
                    return bad(&format!(
                        "a recurrent layer of {} key heads (groups) and {} value heads of \
                         {}x{} with a convolution of {}: every size must be positive and value \
                         heads a multiple of key heads",
                        d.key_heads, d.value_heads, d.key_dim, d.value_dim, d.kernel
                    ));
                }
            }
        }
        if let Some(moe) = &v.moe {
            if moe.num_experts == 0
                || moe.experts_per_token == 0
                || moe.experts_per_token > moe.num_experts
            {
                return bad(&format!(
                    "{} experts used of {}: a mixture needs at least one expert per token and \
                     no more than it has",
                    moe.experts_per_token, moe.num_experts
                ));
            }
            if moe.expert_width == 0 || moe.shared_width == Some(0) {
                return bad("an expert's width must be positive");
            }
            if !moe.sparse_layers.is_empty() && moe.sparse_layers.len() != self.num_layers {
                return bad("per-layer MLP kinds must cover every layer");
            }
        }
        for (name, cap) in [
            ("attention soft-cap", v.attention_softcap),
            ("final logit soft-cap", v.final_softcap),
            ("residual scale", v.residual_scale),
            ("logit scale", v.logit_scale),
        ] {
            if cap.is_some_and(|c| !(c.is_finite() && c > 0.0)) {
                return bad(&format!("the {name} must be a positive number"));
            }
        }
        Ok(())
    }
}
