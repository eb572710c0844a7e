//! Tiny random-weight Granite 4.0-H models, written as llama.cpp's converter writes
//! `granitehybrid`: per-layer `head_count_kv` with 0 for a Mamba-2 layer, `ssm_in` (gate,
//! `x B C`, steps), `ssm_conv1d` with its bias, `ssm_dt.bias`, `ssm_a` (`-exp(A_log)`), `ssm_d`,
//! `ssm_norm` in groups, `ssm_out`, the µP scales, and `rope.scaling.finetuned` false (no
//! RoPE, as for every converted hybrid) or absent (RoPE, llama.cpp's default).

use std::path::Path;

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::{GgmlDType, QTensor};

use super::qwen35::Drawer;
use super::{SplitMix, TinyExperts};
use crate::{Error, Result};

/// Shape of a tiny Granite 4.0-H.
#[derive(Debug, Clone)]
pub struct TinyGranite {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Residual width (the Mamba-2 layers' channels are twice it, as llama.cpp requires).
    pub hidden_size: usize,
    /// MLP width.
    pub intermediate_size: usize,
    /// Blocks.
    pub num_layers: usize,
    /// The blocks that attend (the others are Mamba-2).
    pub attention_layers: Vec<usize>,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads of the attending layers.
    pub num_kv_heads: usize,
    /// Mamba-2 heads.
    pub ssm_heads: usize,
    /// Mamba-2 groups (heads per group share `B` and `C`).
    pub ssm_groups: usize,
    /// Mamba-2 state size.
    pub ssm_state: usize,
    /// Positions the convolution spans.
    pub conv_kernel: usize,
    /// Whether the attending layers rotate (the file then carries no
    /// `rope.scaling.finetuned`).
    pub rope: bool,
    /// `embedding_scale`, `residual_scale`, `attention.scale`, `logit_scale`.
    pub scales: [f32; 4],
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// A mixture of experts with an ungated shared expert in place of the MLP (H-Tiny,
    /// H-Small; the experts as wide as `intermediate_size`, the file's
    /// `feed_forward_length`).
    pub experts: Option<TinyExperts>,
    /// Seed of the weight generator.
    pub seed: u64,
}

impl Default for TinyGranite {
    fn default() -> Self {
        Self {
            vocab_size: 300,
            hidden_size: 32,
            intermediate_size: 48,
            num_layers: 4,
            attention_layers: vec![2],
            num_heads: 4,
            num_kv_heads: 2,
            ssm_heads: 8,
            ssm_groups: 2,
            ssm_state: 16,
            conv_kernel: 4,
            rope: false,
            scales: [1.5, 0.6, 0.3, 2.0],
            rms_eps: 1e-5,
            experts: None,
            seed: 45,
        }
    }
}

impl TinyGranite {
    /// Channels of a Mamba-2 layer's `x`.
    pub fn inner(&self) -> usize {
        2 * self.hidden_size
    }

    /// Channels of its convolution: `x`, `B`, `C`.
    pub fn conv_channels(&self) -> usize {
        self.inner() + 2 * self.ssm_groups * self.ssm_state
    }
}

/// Every tensor of `spec`, drawn from its seed.
pub(super) fn draw(spec: &TinyGranite) -> Result<Vec<super::qwen35::Named>> {
    let (h, v) = (spec.hidden_size, spec.vocab_size);
    let mut d = Drawer {
        rng: SplitMix(spec.seed),
        all: Vec::new(),
    };
    d.put("token_embd.weight".into(), &[v, h], 1.0, 0.0, false)?;
    d.norm("output_norm.weight".into(), h)?;
    d.put("output.weight".into(), &[v, h], 0.3, 0.0, false)?;
    for i in 0..spec.num_layers {
        let t = |name: &str| format!("blk.{i}.{name}");
        d.norm(t("attn_norm.weight"), h)?;
        d.norm(t("ffn_norm.weight"), h)?;
        if spec.attention_layers.contains(&i) {
            let hd = h / spec.num_heads;
            d.proj(t("attn_q.weight"), spec.num_heads * hd, h, 2.0)?;
            d.proj(t("attn_k.weight"), spec.num_kv_heads * hd, h, 2.0)?;
            d.proj(t("attn_v.weight"), spec.num_kv_heads * hd, h, 2.0)?;
            d.proj(t("attn_output.weight"), h, spec.num_heads * hd, 1.0)?;
        } else {
            let (inner, nh) = (spec.inner(), spec.ssm_heads);
            d.proj(
                t("ssm_in.weight"),
                inner + spec.conv_channels() + nh,
                h,
                2.0,
            )?;
            // Taps drawn wide enough that every position of the window moves the output.
            d.put(
                t("ssm_conv1d.weight"),
                &[spec.conv_channels(), spec.conv_kernel],
                0.8,
                0.0,
                true,
            )?;
            d.put(
                t("ssm_conv1d.bias"),
                &[spec.conv_channels()],
                0.3,
                0.0,
                true,
            )?;
            d.put(t("ssm_dt.bias"), &[nh], 0.5, 0.0, true)?;
            // -exp(A_log): a decay rate in -(0.3 .. 1.5), stored as the converter does, [1, nh]
            // in GGUF's order.
            d.put(t("ssm_a"), &[nh, 1], 0.6, -0.9, true)?;
            d.put(t("ssm_d"), &[nh, 1], 0.5, 0.5, true)?;
            d.put(
                t("ssm_norm.weight"),
                &[spec.ssm_groups, inner / spec.ssm_groups],
                0.2,
                1.0,
                true,
            )?;
            d.proj(t("ssm_out.weight"), h, inner, 1.0)?;
        }
        let f = spec.intermediate_size;
        let (shared, fs) = match &spec.experts {
            None => ("", f),
            Some(moe) => {
                let (e, w) = (moe.count, 1.0 / (h as f32).sqrt());
                // Router logits spread over about one unit, so the choice and the weights
                // both vary.
                d.put(t("ffn_gate_inp.weight"), &[e, h], 2.0 * w, 0.0, true)?;
                d.put(t("ffn_gate_exps.weight"), &[e, f, h], 2.0 * w, 0.0, false)?;
                d.put(t("ffn_up_exps.weight"), &[e, f, h], 2.0 * w, 0.0, false)?;
                let down = 1.0 / (f as f32).sqrt();
                d.put(t("ffn_down_exps.weight"), &[e, h, f], down, 0.0, false)?;
                ("_shexp", moe.shared_width.unwrap_or(f))
            }
        };
        d.proj(t(&format!("ffn_gate{shared}.weight")), fs, h, 2.0)?;
        d.proj(t(&format!("ffn_up{shared}.weight")), fs, h, 2.0)?;
        d.proj(t(&format!("ffn_down{shared}.weight")), h, fs, 1.0)?;
    }
    Ok(d.all)
}

/// Writes `spec` as a `granitehybrid` GGUF, projections in `dtype`, the rest f32.
pub fn write_tiny_granite_gguf(path: &Path, spec: &TinyGranite, dtype: GgmlDType) -> Result<()> {
    if !spec.ssm_heads.is_multiple_of(spec.ssm_groups)
        || !spec.hidden_size.is_multiple_of(spec.num_heads)
    {
        return Err(Error::Metadata(format!(
            "an inconsistent tiny Granite: {spec:?}"
        )));
    }
    let mut tensors: Vec<(String, QTensor)> = Vec::new();
    for t in draw(spec)? {
        let dt = if t.f32 { GgmlDType::F32 } else { dtype };
        tensors.push((t.name, QTensor::quantize(&t.values, dt)?));
    }
    let name = "granitehybrid";
    let u32_of = |v: usize| Value::U32(v as u32);
    let [embedding, residual, attention, logit] = spec.scales;
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
            format!("{name}.feed_forward_length"),
            u32_of(spec.intermediate_size),
        ),
        (
            format!("{name}.attention.head_count"),
            u32_of(spec.num_heads),
        ),
        (
            format!("{name}.attention.head_count_kv"),
            Value::Array(
                (0..spec.num_layers)
                    .map(|i| match spec.attention_layers.contains(&i) {
                        true => u32_of(spec.num_kv_heads),
                        false => u32_of(0),
                    })
                    .collect(),
            ),
        ),
        (format!("{name}.rope.freq_base"), Value::F32(10_000.0)),
        (
            format!("{name}.attention.layer_norm_rms_epsilon"),
            Value::F32(spec.rms_eps),
        ),
        (format!("{name}.embedding_scale"), Value::F32(embedding)),
        (format!("{name}.residual_scale"), Value::F32(residual)),
        (format!("{name}.attention.scale"), Value::F32(attention)),
        (format!("{name}.logit_scale"), Value::F32(logit)),
        (format!("{name}.ssm.conv_kernel"), u32_of(spec.conv_kernel)),
        (format!("{name}.ssm.state_size"), u32_of(spec.ssm_state)),
        (format!("{name}.ssm.group_count"), u32_of(spec.ssm_groups)),
        (format!("{name}.ssm.time_step_rank"), u32_of(spec.ssm_heads)),
        (format!("{name}.ssm.inner_size"), u32_of(spec.inner())),
    ];
    if let Some(moe) = &spec.experts {
        metadata.push((format!("{name}.expert_count"), u32_of(moe.count)));
        metadata.push((format!("{name}.expert_used_count"), u32_of(moe.used)));
        metadata.push((
            format!("{name}.expert_shared_feed_forward_length"),
            u32_of(moe.shared_width.unwrap_or(spec.intermediate_size)),
        ));
    }
    if !spec.rope {
        metadata.push((format!("{name}.rope.scaling.finetuned"), Value::Bool(false)));
    }
    super::gguf::write_file(path, &metadata, &tensors)
}
