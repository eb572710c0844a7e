//! A tiny random gpt-oss as a GGUF in llama.cpp's names and shapes (`gpt-oss.*` keys, biased
//! q/k/v/o, `attn_sinks`, a biased router, stacked biased experts), for checking the family
//! against llama.cpp: every other layer windowed (a short window, so a short prompt passes
//! it), YaRN, the experts in MXFP4 as the converter writes them or in the file's type; with
//! no tokenizer, or the one it is given (gpt-oss's real o200k_harmony).

use std::path::Path;

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::{GgmlDType, QTensor};

use super::qwen35::{Drawer, Named};
use super::retype::{retype_gguf, Blocks};
use super::SplitMix;
use crate::{Error, Result};

/// The tiny gpt-oss's shape.
#[derive(Debug, Clone)]
pub struct TinyGptOss {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Residual width.
    pub hidden_size: usize,
    /// Blocks (even ones windowed).
    pub num_layers: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads.
    pub num_kv_heads: usize,
    /// Width of a head.
    pub head_dim: usize,
    /// Experts per layer.
    pub experts: usize,
    /// Experts per token.
    pub used: usize,
    /// Width of one expert.
    pub expert_width: usize,
    /// The windowed layers' window.
    pub window: usize,
    /// Which layers are windowed, written as `attention.sliding_window_pattern` (`None`: the
    /// key is left out, and the even layers are).
    pub window_pattern: Option<Vec<bool>>,
    /// YaRN's factor over `original_context` (`None`: plain RoPE).
    pub yarn: Option<(f32, usize)>,
    /// Whether the experts are MXFP4 (else in the file's type).
    pub mxfp4: bool,
    /// Seed of every weight.
    pub seed: u64,
    /// The tokenizer's `tokenizer.*` metadata (such as `o200k_harmony_metadata`'s), written
    /// in place of `tokenizer.ggml.model = no_vocab`; its token list must be `vocab_size`
    /// long (`None`: no tokenizer).
    pub tokenizer: Option<Vec<(String, Value)>>,
}

impl Default for TinyGptOss {
    fn default() -> Self {
        Self {
            vocab_size: 300,
            hidden_size: 64,
            num_layers: 4,
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 32,
            experts: 4,
            used: 2,
            expert_width: 64,
            window: 16,
            window_pattern: None,
            yarn: Some((4.0, 256)),
            mxfp4: true,
            seed: 71,
            tokenizer: None,
        }
    }
}

impl TinyGptOss {
    /// Residual, vocabulary, head, query heads, key/value heads, experts, expert width.
    fn widths(&self) -> [usize; 7] {
        [
            self.hidden_size,
            self.vocab_size,
            self.head_dim,
            self.num_heads,
            self.num_kv_heads,
            self.experts,
            self.expert_width,
        ]
    }
}

/// Every tensor of `spec` by its GGUF name, drawn from its seed (norms, biases, sinks and the
/// router marked f32).
pub(super) fn draw(spec: &TinyGptOss) -> Result<Vec<Named>> {
    let [h, v, hd, heads, kv, e, f] = spec.widths();
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
        d.norm(t("post_attention_norm.weight"), h)?;
        d.proj(t("attn_q.weight"), heads * hd, h, 2.0)?;
        d.proj(t("attn_k.weight"), kv * hd, h, 2.0)?;
        d.proj(t("attn_v.weight"), kv * hd, h, 2.0)?;
        d.proj(t("attn_output.weight"), h, heads * hd, 1.0)?;
        for (name, width) in [
            ("attn_q.bias", heads * hd),
            ("attn_k.bias", kv * hd),
            ("attn_v.bias", kv * hd),
            ("attn_output.bias", h),
        ] {
            d.put(t(name), &[width], 0.2, 0.0, true)?;
        }
        // Sinks from well below the scores to above them.
        d.put(t("attn_sinks.weight"), &[heads], 2.0, 0.0, true)?;
        let w = 1.0 / (h as f32).sqrt();
        d.put(t("ffn_gate_inp.weight"), &[e, h], 2.0 * w, 0.0, true)?;
        d.put(t("ffn_gate_inp.bias"), &[e], 0.5, 0.0, true)?;
        // Gates and ups wide enough that some pass the clamp at 7.
        d.put(t("ffn_gate_exps.weight"), &[e, f, h], 6.0 * w, 0.0, false)?;
        d.put(t("ffn_up_exps.weight"), &[e, f, h], 6.0 * w, 0.0, false)?;
        d.put(
            t("ffn_down_exps.weight"),
            &[e, h, f],
            1.0 / (f as f32).sqrt(),
            0.0,
            false,
        )?;
        d.put(t("ffn_gate_exps.bias"), &[e, f], 0.5, 0.0, true)?;
        d.put(t("ffn_up_exps.bias"), &[e, f], 0.5, 0.0, true)?;
        d.put(t("ffn_down_exps.bias"), &[e, h], 0.1, 0.0, true)?;
    }
    Ok(d.all)
}

/// Writes `spec` as a `gpt-oss` GGUF, the projections (and the experts, unless MXFP4) in
/// `dtype`, norms, biases, sinks and the router in f32.
pub fn write_tiny_gptoss_gguf(path: &Path, spec: &TinyGptOss, dtype: GgmlDType) -> Result<()> {
    let [h, v, hd, heads, kv, e, f] = spec.widths();
    let mut tensors: Vec<(String, QTensor)> = Vec::new();
    for t in draw(spec)? {
        let dt = if t.f32 { GgmlDType::F32 } else { dtype };
        tensors.push((t.name, QTensor::quantize(&t.values, dt)?));
    }
    let name = "gpt-oss";
    let u32_of = |v: usize| Value::U32(v as u32);
    let tokenizer = match &spec.tokenizer {
        Some(entries) => {
            let tokens = entries
                .iter()
                .find(|(key, _)| key == "tokenizer.ggml.tokens")
                .and_then(|(_, tokens)| tokens.to_vec().ok())
                .map_or(0, Vec::len);
            if tokens != v {
                return Err(Error::Metadata(format!(
                    "the tokenizer has {tokens} tokens for a vocabulary of {v}"
                )));
            }
            entries.clone()
        }
        None => vec![(
            "tokenizer.ggml.model".into(),
            Value::String("no_vocab".into()),
        )],
    };
    let mut metadata: Vec<(String, Value)> =
        vec![("general.architecture".into(), Value::String(name.into()))];
    metadata.extend(tokenizer);
    metadata.extend([
        (format!("{name}.context_length"), u32_of(1024)),
        (format!("{name}.vocab_size"), u32_of(v)),
        (format!("{name}.embedding_length"), u32_of(h)),
        (format!("{name}.block_count"), u32_of(spec.num_layers)),
        (format!("{name}.feed_forward_length"), u32_of(f)),
        (format!("{name}.expert_feed_forward_length"), u32_of(f)),
        (format!("{name}.expert_count"), u32_of(e)),
        (format!("{name}.expert_used_count"), u32_of(spec.used)),
        (format!("{name}.attention.head_count"), u32_of(heads)),
        (format!("{name}.attention.head_count_kv"), u32_of(kv)),
        (format!("{name}.attention.key_length"), u32_of(hd)),
        (format!("{name}.attention.value_length"), u32_of(hd)),
        (
            format!("{name}.attention.sliding_window"),
            u32_of(spec.window),
        ),
        (
            format!("{name}.attention.layer_norm_rms_epsilon"),
            Value::F32(1e-5),
        ),
        (format!("{name}.rope.freq_base"), Value::F32(10_000.0)),
    ]);
    if let Some(pattern) = &spec.window_pattern {
        metadata.push((
            format!("{name}.attention.sliding_window_pattern"),
            Value::Array(pattern.iter().map(|&b| Value::Bool(b)).collect()),
        ));
    }
    if let Some((factor, original)) = spec.yarn {
        metadata.push((
            format!("{name}.rope.scaling.type"),
            Value::String("yarn".into()),
        ));
        metadata.push((format!("{name}.rope.scaling.factor"), Value::F32(factor)));
        metadata.push((
            format!("{name}.rope.scaling.original_context_length"),
            u32_of(original),
        ));
    }
    if !spec.mxfp4 {
        return super::gguf::write_file(path, &metadata, &tensors);
    }
    let plain = path.with_extension("plain.gguf");
    super::gguf::write_file(&plain, &metadata, &tensors)?;
    let retyped = retype_gguf(&plain, path, |tensor, values| {
        tensor
            .ends_with("_exps.weight")
            .then(|| Blocks::mxfp4(values))
    });
    std::fs::remove_file(&plain)
        .map_err(|e| Error::io(format!("removing {}", plain.display()), e))?;
    retyped
}
