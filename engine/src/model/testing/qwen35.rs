//! Tiny random-weight Qwen3.5 models, written straight as GGUF files the way llama.cpp's
//! converter writes them: `qwen35` (dense MLP) and `qwen35moe` (routed experts and a gated
//! shared expert), both hybrids of Gated DeltaNet layers (`blk.N.attn_qkv`, `attn_gate`,
//! `ssm_conv1d`, `ssm_dt.bias`, `ssm_a`, `ssm_beta`, `ssm_alpha`, `ssm_norm`, `ssm_out`) and
//! gated attention layers (`attn_q` holding each head's query and output gate, `attn_k`,
//! `attn_v`, `attn_output`, `attn_q_norm`, `attn_k_norm`), every `full_attention_interval`-th
//! layer attending. Norms are stored with Qwen's one already added (the converter's `+ 1`),
//! except `ssm_norm`, a plain weight; `ssm_a` is `-exp(A_log)`. No tokenizer (`no_vocab`).
//! These files are the ones checked against llama.cpp's recorded runs.
//!
//! The same drawn model can also be written as `qwen3next` (Qwen3-Next, [`Qwen35Family`]):
//! its value heads grouped by key head instead of tiled, beta and alpha fused per key head
//! (`ssm_ba`), either as today's converter splits the DeltaNet input projection (`attn_qkv`,
//! `attn_gate`) or fused per key head as the first converter left it (`ssm_in`), plain NeoX
//! RoPE (no sections). The rearrangement is exact: llama.cpp gives the same logits for a
//! `qwen35moe` and a `qwen3next` written from one spec.

use std::path::Path;

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

use super::{SplitMix, TinyExperts};
use crate::{Error, Result};

/// The llama.cpp architecture a tiny Qwen3.5-like model is written as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Qwen35Family {
    /// `qwen35` without experts, `qwen35moe` with: value heads tiled over the key heads
    /// (value head `j` reads key head `j % key_heads`), `ssm_beta` and `ssm_alpha` apart,
    /// multimodal RoPE sections.
    #[default]
    Qwen35,
    /// `qwen3next` (experts required) as llama.cpp's converter writes it now: value heads
    /// grouped by key head (value head `j` reads key head `j / (value_heads / key_heads)`),
    /// `attn_qkv` and `attn_gate` as for `qwen35`, `ssm_ba` holding for each key head its
    /// value heads' beta rows then their alpha rows, plain RoPE.
    Qwen3Next,
    /// `qwen3next` as llama.cpp's first converter for it wrote it (the files published
    /// then): the DeltaNet input one matrix `ssm_in` (for each key head: its query, its key,
    /// its value heads' values, their gates z) and, like files older than that key, no
    /// `attention.recurrent_layers` (the layers follow `full_attention_interval`); otherwise
    /// as [`Qwen35Family::Qwen3Next`].
    Qwen3NextSsmIn,
}

impl Qwen35Family {
    /// Whether the file is a `qwen3next`.
    pub fn is_next(self) -> bool {
        self != Self::Qwen35
    }
}

/// Shape of a tiny Qwen3.5.
#[derive(Debug, Clone)]
pub struct TinyQwen35 {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Residual width.
    pub hidden_size: usize,
    /// Width of the dense MLP (`qwen35`; unused with experts).
    pub intermediate_size: usize,
    /// Blocks.
    pub num_layers: usize,
    /// Layer `i` attends when `(i + 1) % full_attention_interval == 0`; the others are
    /// Gated DeltaNet layers.
    pub full_attention_interval: usize,
    /// Query heads of the attending layers.
    pub num_heads: usize,
    /// Key/value heads of the attending layers.
    pub num_kv_heads: usize,
    /// Width of one attention head (`attention.key_length` and `value_length`).
    pub head_dim: usize,
    /// Leading dimensions of a head that RoPE turns (`rope.dimension_count`).
    pub rotary_dim: usize,
    /// Multimodal RoPE sections (`rope.dimension_sections`), summing to `rotary_dim / 2`.
    pub rope_sections: [usize; 4],
    /// RoPE base.
    pub rope_theta: f32,
    /// Epsilon of every RMS norm (and of the delta rule's L2 norms).
    pub rms_eps: f32,
    /// Taps of the causal convolution over the delta rule's q|k|v channels
    /// (`ssm.conv_kernel`).
    pub conv_kernel: usize,
    /// Key (and query) heads of a DeltaNet layer (`ssm.group_count`).
    pub linear_key_heads: usize,
    /// Value heads of a DeltaNet layer (`ssm.time_step_rank`), a multiple of the key heads.
    pub linear_value_heads: usize,
    /// Width of one key head (`ssm.state_size`).
    pub linear_key_head_dim: usize,
    /// Width of one value head (`ssm.inner_size / ssm.time_step_rank`); llama.cpp needs it
    /// equal to the key head's.
    pub linear_value_head_dim: usize,
    /// `None`: `qwen35`, a dense MLP in every layer. `Some`: `qwen35moe`, experts in every
    /// layer (normalized top-k) and a shared expert (`shared_width` required).
    pub experts: Option<TinyExperts>,
    /// The architecture the file is written as (`qwen35`/`qwen35moe` unless told).
    pub family: Qwen35Family,
    /// Seed of the weight generator.
    pub seed: u64,
}

impl Default for TinyQwen35 {
    fn default() -> Self {
        Self {
            vocab_size: 300,
            hidden_size: 64,
            intermediate_size: 128,
            num_layers: 4,
            full_attention_interval: 2,
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 32,
            rotary_dim: 8,
            rope_sections: [2, 1, 1, 0],
            rope_theta: 10_000_000.0,
            rms_eps: 1e-6,
            conv_kernel: 4,
            linear_key_heads: 2,
            linear_value_heads: 4,
            linear_key_head_dim: 16,
            linear_value_head_dim: 16,
            experts: None,
            family: Qwen35Family::Qwen35,
            seed: 35,
        }
    }
}

impl TinyQwen35 {
    /// Whether layer `i` attends (otherwise it is a Gated DeltaNet layer).
    pub fn attends(&self, i: usize) -> bool {
        (i + 1).is_multiple_of(self.full_attention_interval)
    }

    /// The GGUF architecture: `qwen3next` for that family, else `qwen35moe` with experts,
    /// `qwen35` without.
    pub fn architecture(&self) -> &'static str {
        match (self.family.is_next(), &self.experts) {
            (true, _) => "qwen3next",
            (false, Some(_)) => "qwen35moe",
            (false, None) => "qwen35",
        }
    }

    /// Channels the DeltaNet convolution runs over: queries, keys and values concatenated.
    pub fn conv_channels(&self) -> usize {
        2 * self.linear_key_heads * self.linear_key_head_dim
            + self.linear_value_heads * self.linear_value_head_dim
    }

    /// What llama.cpp would refuse, or this writer does not produce.
    pub(super) fn check(&self) -> Result<()> {
        let bad = |why: &str| Err(Error::Metadata(format!("tiny qwen35: {why}")));
        let counts = [
            self.full_attention_interval,
            self.num_kv_heads,
            self.linear_key_heads,
        ];
        if counts.contains(&0) {
            return bad("interval and head counts must be positive");
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return bad("query heads must be a multiple of key/value heads");
        }
        if !self
            .linear_value_heads
            .is_multiple_of(self.linear_key_heads)
        {
            return bad("value heads must be a multiple of key heads");
        }
        if self.linear_value_head_dim != self.linear_key_head_dim {
            return bad("llama.cpp needs value heads as wide as key heads");
        }
        if self.rotary_dim > self.head_dim || !self.rotary_dim.is_multiple_of(2) {
            return bad("rotary_dim must be even and at most head_dim");
        }
        if !self.family.is_next() && 2 * self.rope_sections.iter().sum::<usize>() != self.rotary_dim
        {
            return bad("rope sections must sum to rotary_dim / 2");
        }
        if self.family.is_next() && self.experts.is_none() {
            return bad("qwen3next needs experts");
        }
        if let Some(moe) = &self.experts {
            if moe.used == 0 || moe.used > moe.count {
                return bad("experts used must be in 1..=count");
            }
            if moe.shared_width.is_none() || !moe.normalize || !moe.dense_layers.is_empty() {
                return bad("qwen35moe has a shared expert, normalized top-k, no dense layers");
            }
        }
        Ok(())
    }
}

/// One tensor: its GGUF name, its values (candle's row-major shape, the reverse of GGUF's
/// `ne`), and whether it stays f32 whatever the projections' type.
pub(super) struct Named {
    pub(super) name: String,
    pub(super) values: Tensor,
    pub(super) f32: bool,
}

/// Draws tensors from one seeded stream, in the order they are asked for.
pub(super) struct Drawer {
    pub(super) rng: SplitMix,
    pub(super) all: Vec<Named>,
}

impl Drawer {
    /// `offset + scale * u`, `u` uniform in [-1, 1), shaped `shape`.
    pub(super) fn put(
        &mut self,
        name: String,
        shape: &[usize],
        scale: f32,
        offset: f32,
        f32: bool,
    ) -> Result<()> {
        let n: usize = shape.iter().product();
        let data: Vec<f32> = (0..n)
            .map(|_| offset + scale * self.rng.next_centered())
            .collect();
        let values = Tensor::from_vec(data, shape, &Device::Cpu)?;
        self.all.push(Named { name, values, f32 });
        Ok(())
    }

    /// A projection in the file's type: `[rows, cols]`, scaled by `gain / sqrt(cols)`.
    pub(super) fn proj(&mut self, name: String, rows: usize, cols: usize, gain: f32) -> Result<()> {
        self.put(name, &[rows, cols], gain / (cols as f32).sqrt(), 0.0, false)
    }

    /// A norm weight around one, in f32.
    pub(super) fn norm(&mut self, name: String, width: usize) -> Result<()> {
        self.put(name, &[width], 0.2, 1.0, true)
    }
}

/// Every tensor of `spec`, drawn from its seed.
pub(super) fn draw(spec: &TinyQwen35) -> Result<Vec<Named>> {
    let (h, v) = (spec.hidden_size, spec.vocab_size);
    let mut d = Drawer {
        rng: SplitMix(spec.seed),
        all: Vec::new(),
    };
    d.put("token_embd.weight".into(), &[v, h], 1.0, 0.0, false)?;
    d.norm("output_norm.weight".into(), h)?;
    // An untied head: tied to the embeddings, a tiny model mostly repeats its last token.
    d.put("output.weight".into(), &[v, h], 0.3, 0.0, false)?;
    for i in 0..spec.num_layers {
        let t = |name: &str| format!("blk.{i}.{name}");
        d.norm(t("attn_norm.weight"), h)?;
        d.norm(t("post_attention_norm.weight"), h)?;
        if spec.attends(i) {
            draw_attention(&mut d, spec, i)?;
        } else {
            draw_delta_net(&mut d, spec, i)?;
        }
        match &spec.experts {
            None => {
                let f = spec.intermediate_size;
                d.proj(t("ffn_gate.weight"), f, h, 2.0)?;
                d.proj(t("ffn_up.weight"), f, h, 2.0)?;
                d.proj(t("ffn_down.weight"), h, f, 1.0)?;
            }
            Some(moe) => draw_experts(&mut d, spec, moe, i)?,
        }
    }
    Ok(d.all)
}

/// Layer `i`'s gated attention: `attn_q` gives each head `2 * head_dim` rows, its query
/// then its output gate.
fn draw_attention(d: &mut Drawer, spec: &TinyQwen35, i: usize) -> Result<()> {
    let (h, hd) = (spec.hidden_size, spec.head_dim);
    let t = |name: &str| format!("blk.{i}.{name}");
    d.proj(t("attn_q.weight"), 2 * spec.num_heads * hd, h, 2.0)?;
    d.proj(t("attn_k.weight"), spec.num_kv_heads * hd, h, 2.0)?;
    d.proj(t("attn_v.weight"), spec.num_kv_heads * hd, h, 2.0)?;
    d.proj(t("attn_output.weight"), h, spec.num_heads * hd, 1.0)?;
    d.norm(t("attn_q_norm.weight"), hd)?;
    d.norm(t("attn_k_norm.weight"), hd)?;
    Ok(())
}

/// Layer `i`'s Gated DeltaNet.
fn draw_delta_net(d: &mut Drawer, spec: &TinyQwen35, i: usize) -> Result<()> {
    let h = spec.hidden_size;
    let hv = spec.linear_value_heads;
    let value_dim = hv * spec.linear_value_head_dim;
    let t = |name: &str| format!("blk.{i}.{name}");
    // Rows: all query heads, then all key heads, then all value heads.
    d.proj(t("attn_qkv.weight"), spec.conv_channels(), h, 2.0)?;
    // The output gate z, one row block per value head.
    d.proj(t("attn_gate.weight"), value_dim, h, 2.0)?;
    // Taps drawn wide enough that every position of the window moves the output.
    d.put(
        t("ssm_conv1d.weight"),
        &[spec.conv_channels(), spec.conv_kernel],
        0.8,
        0.0,
        true,
    )?;
    d.put(t("ssm_dt.bias"), &[hv], 0.5, 0.0, true)?;
    // -exp(A_log): a decay rate in -(0.3 .. 1.5).
    d.put(t("ssm_a"), &[hv], 0.6, -0.9, true)?;
    d.proj(t("ssm_beta.weight"), hv, h, 2.0)?;
    d.proj(t("ssm_alpha.weight"), hv, h, 1.0)?;
    d.norm(t("ssm_norm.weight"), spec.linear_value_head_dim)?;
    d.proj(t("ssm_out.weight"), h, value_dim, 1.0)?;
    Ok(())
}

/// Layer `i`'s mixture: the router (f32), each projection's experts stacked
/// `[experts, rows, cols]`, the shared expert and its one-row gate (f32).
fn draw_experts(d: &mut Drawer, spec: &TinyQwen35, moe: &TinyExperts, i: usize) -> Result<()> {
    let (h, e, fe) = (spec.hidden_size, moe.count, moe.width);
    let fs = moe.shared_width.unwrap_or(spec.intermediate_size);
    let w = 1.0 / (h as f32).sqrt();
    let t = |name: &str| format!("blk.{i}.{name}");
    // Router logits spread over about one unit, so the choice and the weights both vary.
    d.put(t("ffn_gate_inp.weight"), &[e, h], 2.0 * w, 0.0, true)?;
    d.put(t("ffn_gate_exps.weight"), &[e, fe, h], 2.0 * w, 0.0, false)?;
    d.put(t("ffn_up_exps.weight"), &[e, fe, h], 2.0 * w, 0.0, false)?;
    d.put(
        t("ffn_down_exps.weight"),
        &[e, h, fe],
        1.0 / (fe as f32).sqrt(),
        0.0,
        false,
    )?;
    d.put(t("ffn_gate_inp_shexp.weight"), &[h], 2.0 * w, 0.0, true)?;
    d.proj(t("ffn_gate_shexp.weight"), fs, h, 2.0)?;
    d.proj(t("ffn_up_shexp.weight"), fs, h, 2.0)?;
    d.proj(t("ffn_down_shexp.weight"), h, fs, 1.0)?;
    Ok(())
}

/// Indices of `value_heads` blocks of `block` rows (or columns) in `qwen3next`'s order,
/// grouped by key head, into `qwen35`'s, tiled: grouped head `k * r + i` (`r` value heads per
/// key head) is tiled head `i * key_heads + k`.
pub(super) fn grouped_from_tiled(spec: &TinyQwen35, block: usize) -> Vec<u32> {
    let nk = spec.linear_key_heads;
    let r = spec.linear_value_heads / nk;
    (0..nk * r)
        .flat_map(|g| {
            let tiled = (g % r) * nk + g / r;
            (tiled * block..(tiled + 1) * block).map(|x| x as u32)
        })
        .collect()
}

/// `values` with its entries along `dim` taken at `index`.
pub(super) fn pick(values: &Tensor, index: Vec<u32>, dim: usize) -> Result<Tensor> {
    let n = index.len();
    let index = Tensor::from_vec(index, n, &Device::Cpu)?;
    Ok(values.index_select(&index, dim)?)
}

/// `all`, drawn as for `qwen35moe`, laid out as `qwen3next` holds the same model: every
/// value-head dimension reordered from tiled to grouped, `ssm_beta` and `ssm_alpha` fused
/// into `ssm_ba` (for each key head: its value heads' beta rows, then their alpha rows) and,
/// for [`Qwen35Family::Qwen3NextSsmIn`], `attn_qkv` and `attn_gate` into `ssm_in` (for each
/// key head: its query rows, its key rows, its value heads' value rows, their z rows).
fn relayout_next(spec: &TinyQwen35, all: Vec<Named>) -> Result<Vec<Named>> {
    let (nk, hk, hv) = (
        spec.linear_key_heads,
        spec.linear_key_head_dim,
        spec.linear_value_head_dim,
    );
    let nv = spec.linear_value_heads;
    let r = nv / nk;
    let qk = 2 * nk * hk;
    let heads = grouped_from_tiled(spec, hv);
    let channels: Vec<u32> = (0..qk as u32)
        .chain(heads.iter().map(|&x| x + qk as u32))
        .collect();
    let ba: Vec<u32> = (0..nk)
        .flat_map(|k| {
            let beta = (0..r).map(move |i| (i * nk + k) as u32);
            let alpha = (0..r).map(move |i| (nv + i * nk + k) as u32);
            beta.chain(alpha)
        })
        .collect();
    let fused: Vec<u32> = (0..nk)
        .flat_map(|k| {
            let rows = |start: usize, n: usize| (start..start + n).map(|x| x as u32);
            rows(k * hk, hk)
                .chain(rows(nk * hk + k * hk, hk))
                .chain(rows(qk + k * r * hv, r * hv))
                .chain(rows(qk + nv * hv + k * r * hv, r * hv))
        })
        .collect();
    let mut out = Vec::with_capacity(all.len());
    let mut held: Option<Tensor> = None;
    for t in all {
        // `blk.N.role`: the layer's prefix and the role.
        let role = match t.name.strip_prefix("blk.").and_then(|r| r.split_once('.')) {
            Some((_, role)) => role.to_string(),
            None => String::new(),
        };
        let prefix = &t.name[..t.name.len() - role.len()];
        let renamed = |role: &str| format!("{prefix}{role}");
        let values = match role.as_str() {
            "attn_qkv.weight" => pick(&t.values, channels.clone(), 0)?,
            "attn_gate.weight" => pick(&t.values, heads.clone(), 0)?,
            "ssm_conv1d.weight" => pick(&t.values, channels.clone(), 0)?,
            "ssm_dt.bias" | "ssm_a" => pick(&t.values, grouped_from_tiled(spec, 1), 0)?,
            "ssm_out.weight" => pick(&t.values, heads.clone(), 1)?,
            "ssm_beta.weight" => {
                held = Some(t.values);
                continue;
            }
            "ssm_alpha.weight" => {
                let beta = held.take().expect("ssm_beta is drawn before ssm_alpha");
                let both = Tensor::cat(&[beta, t.values], 0)?;
                out.push(Named {
                    name: renamed("ssm_ba.weight"),
                    values: pick(&both, ba.clone(), 0)?,
                    f32: t.f32,
                });
                continue;
            }
            _ => t.values,
        };
        let ssm_in = spec.family == Qwen35Family::Qwen3NextSsmIn;
        match role.as_str() {
            "attn_qkv.weight" if ssm_in => held = Some(values),
            "attn_gate.weight" if ssm_in => {
                let qkv = held.take().expect("attn_qkv is drawn before attn_gate");
                let both = Tensor::cat(&[qkv, values], 0)?;
                out.push(Named {
                    name: renamed("ssm_in.weight"),
                    values: pick(&both, fused.clone(), 0)?,
                    f32: t.f32,
                });
            }
            _ => out.push(Named {
                name: t.name,
                values,
                f32: t.f32,
            }),
        }
    }
    Ok(out)
}

/// Writes `spec` as a `qwen35` (or, with experts, `qwen35moe`; or, as its family says,
/// `qwen3next`) GGUF at `path`: projections, the embedding and the head in `dtype`; norms,
/// convolution taps, `ssm_dt.bias`, `ssm_a`, the router and the shared expert's gate in f32;
/// no tokenizer (`no_vocab`).
pub fn write_tiny_qwen35_gguf(path: &Path, spec: &TinyQwen35, dtype: GgmlDType) -> Result<()> {
    spec.check()?;
    let mut drawn = draw(spec)?;
    if spec.family.is_next() {
        drawn = relayout_next(spec, drawn)?;
    }
    let mut tensors: Vec<(String, QTensor)> = Vec::new();
    for t in drawn {
        let dt = if t.f32 { GgmlDType::F32 } else { dtype };
        tensors.push((t.name, QTensor::quantize(&t.values, dt)?));
    }
    let name = spec.architecture();
    let u32_of = |v: usize| Value::U32(v as u32);
    let mut metadata: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(name.into())),
        (
            "tokenizer.ggml.model".into(),
            Value::String("no_vocab".into()),
        ),
        (format!("{name}.context_length"), u32_of(1024)),
        (format!("{name}.vocab_size"), u32_of(spec.vocab_size)),
        (format!("{name}.embedding_length"), u32_of(spec.hidden_size)),
        (format!("{name}.block_count"), u32_of(spec.num_layers)),
        (
            format!("{name}.attention.head_count"),
            u32_of(spec.num_heads),
        ),
        (
            format!("{name}.attention.head_count_kv"),
            u32_of(spec.num_kv_heads),
        ),
        (
            format!("{name}.attention.key_length"),
            u32_of(spec.head_dim),
        ),
        (
            format!("{name}.attention.value_length"),
            u32_of(spec.head_dim),
        ),
        (
            format!("{name}.rope.freq_base"),
            Value::F32(spec.rope_theta),
        ),
        (
            format!("{name}.rope.dimension_count"),
            u32_of(spec.rotary_dim),
        ),
        (
            format!("{name}.rope.dimension_sections"),
            Value::Array(
                spec.rope_sections
                    .iter()
                    .map(|&s| Value::I32(s as i32))
                    .collect(),
            ),
        ),
        (
            format!("{name}.attention.layer_norm_rms_epsilon"),
            Value::F32(spec.rms_eps),
        ),
        (format!("{name}.ssm.conv_kernel"), u32_of(spec.conv_kernel)),
        (
            format!("{name}.ssm.state_size"),
            u32_of(spec.linear_key_head_dim),
        ),
        (
            format!("{name}.ssm.group_count"),
            u32_of(spec.linear_key_heads),
        ),
        (
            format!("{name}.ssm.time_step_rank"),
            u32_of(spec.linear_value_heads),
        ),
        (
            format!("{name}.ssm.inner_size"),
            u32_of(spec.linear_value_heads * spec.linear_value_head_dim),
        ),
        (
            format!("{name}.full_attention_interval"),
            u32_of(spec.full_attention_interval),
        ),
        // As the converter writes `layer_types`: true for a DeltaNet layer.
        (
            format!("{name}.attention.recurrent_layers"),
            Value::Array(
                (0..spec.num_layers)
                    .map(|i| Value::Bool(!spec.attends(i)))
                    .collect(),
            ),
        ),
    ];
    match &spec.experts {
        None => metadata.push((
            format!("{name}.feed_forward_length"),
            u32_of(spec.intermediate_size),
        )),
        Some(moe) => {
            metadata.push((format!("{name}.expert_count"), u32_of(moe.count)));
            metadata.push((format!("{name}.expert_used_count"), u32_of(moe.used)));
            metadata.push((
                format!("{name}.expert_feed_forward_length"),
                u32_of(moe.width),
            ));
            metadata.push((
                format!("{name}.expert_shared_feed_forward_length"),
                u32_of(moe.shared_width.unwrap_or(spec.intermediate_size)),
            ));
        }
    }
    match spec.family {
        Qwen35Family::Qwen35 => {}
        family => {
            // Plain NeoX RoPE; the first converter wrote no `recurrent_layers`. Like the
            // converter, the dense width (`intermediate_size`, used by no layer) as well.
            let sections = format!("{name}.rope.dimension_sections");
            let recurrent = format!("{name}.attention.recurrent_layers");
            metadata.retain(|(key, _)| {
                *key != sections && (*key != recurrent || family != Qwen35Family::Qwen3NextSsmIn)
            });
            metadata.push((
                format!("{name}.feed_forward_length"),
                u32_of(spec.intermediate_size),
            ));
        }
    }
    super::gguf::write_file(path, &metadata, &tensors)
}
