//! Tiny random-weight LFM2 models, written straight as GGUF files the way llama.cpp's converter
//! writes LFM2 (`blk.N.shortconv.{in_proj,conv,out_proj}`, per-layer `head_count_kv` with 0
//! for a convolution layer, `shortconv.l_cache`, the final norm as `token_embd_norm`): the
//! hybrid checked against candle-transformers' `quantized_lfm2` and against llama.cpp.

use std::path::Path;

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

use super::SplitMix;
use crate::{Error, Result};

/// Shape of a tiny LFM2.
#[derive(Debug, Clone)]
pub struct TinyLfm2 {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Residual width.
    pub hidden_size: usize,
    /// MLP width.
    pub intermediate_size: usize,
    /// Blocks.
    pub num_layers: usize,
    /// The blocks that attend (the others convolve).
    pub attention_layers: Vec<usize>,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads of the attending layers.
    pub num_kv_heads: usize,
    /// Positions a convolution spans.
    pub kernel: usize,
    /// Seed of the weight generator.
    pub seed: u64,
}

impl Default for TinyLfm2 {
    fn default() -> Self {
        Self {
            vocab_size: 256,
            hidden_size: 64,
            intermediate_size: 128,
            num_layers: 4,
            attention_layers: vec![1, 3],
            num_heads: 4,
            num_kv_heads: 2,
            kernel: 3,
            seed: 11,
        }
    }
}

/// One tensor of a tiny LFM2: its GGUF name, its HF name, and its values (shaped as GGUF
/// lays them out; HF's convolution weight has a middle axis of one).
struct Named {
    gguf: String,
    hf: String,
    values: Tensor,
    /// Kept in f32 whatever the projections' type (norms, taps).
    f32: bool,
}

/// Every tensor of `spec`, drawn from its seed.
fn draw(spec: &TinyLfm2) -> Result<Vec<Named>> {
    let (h, f, v) = (spec.hidden_size, spec.intermediate_size, spec.vocab_size);
    let hd = h / spec.num_heads;
    let kvw = spec.num_kv_heads * hd;
    let mut rng = SplitMix(spec.seed);
    let mut all = Vec::new();
    let mut put =
        |gguf: String, hf: String, shape: &[usize], scale: f32, offset: f32, f32: bool| {
            let n: usize = shape.iter().product();
            let data: Vec<f32> = (0..n)
                .map(|_| offset + scale * rng.next_centered())
                .collect();
            let values = Tensor::from_vec(data, shape, &Device::Cpu)?;
            all.push(Named {
                gguf,
                hf,
                values,
                f32,
            });
            Ok::<(), Error>(())
        };
    let w = 1.0 / (h as f32).sqrt();
    let s = |x: &str| x.to_string();
    put(
        s("token_embd.weight"),
        s("model.embed_tokens.weight"),
        &[v, h],
        1.0,
        0.0,
        false,
    )?;
    put(
        s("token_embd_norm.weight"),
        s("model.embedding_norm.weight"),
        &[h],
        0.2,
        1.0,
        true,
    )?;
    // An untied head: tied to these embeddings, a tiny model mostly repeats its last token.
    put(
        s("output.weight"),
        s("lm_head.weight"),
        &[v, h],
        0.3,
        0.0,
        false,
    )?;
    for i in 0..spec.num_layers {
        let (b, p) = (format!("blk.{i}"), format!("model.layers.{i}"));
        let mut layer = |g: &str, hf: &str, shape: &[usize], scale: f32, offset: f32, f32: bool| {
            put(
                format!("{b}.{g}.weight"),
                format!("{p}.{hf}.weight"),
                shape,
                scale,
                offset,
                f32,
            )
        };
        layer("attn_norm", "operator_norm", &[h], 0.2, 1.0, true)?;
        layer("ffn_norm", "ffn_norm", &[h], 0.2, 1.0, true)?;
        layer("ffn_gate", "feed_forward.w1", &[f, h], 2.0 * w, 0.0, false)?;
        layer("ffn_up", "feed_forward.w3", &[f, h], 2.0 * w, 0.0, false)?;
        layer("ffn_down", "feed_forward.w2", &[h, f], w, 0.0, false)?;
        if spec.attention_layers.contains(&i) {
            layer("attn_q", "self_attn.q_proj", &[h, h], 2.0 * w, 0.0, false)?;
            layer("attn_k", "self_attn.k_proj", &[kvw, h], 2.0 * w, 0.0, false)?;
            layer("attn_v", "self_attn.v_proj", &[kvw, h], 2.0 * w, 0.0, false)?;
            layer("attn_output", "self_attn.out_proj", &[h, h], w, 0.0, false)?;
            layer(
                "attn_q_norm",
                "self_attn.q_layernorm",
                &[hd],
                0.2,
                1.0,
                true,
            )?;
            layer(
                "attn_k_norm",
                "self_attn.k_layernorm",
                &[hd],
                0.2,
                1.0,
                true,
            )?;
        } else {
            // Taps drawn wide enough that every position of the window moves the output.
            layer(
                "shortconv.conv",
                "conv.conv",
                &[h, spec.kernel],
                0.8,
                0.0,
                true,
            )?;
            layer(
                "shortconv.in_proj",
                "conv.in_proj",
                &[3 * h, h],
                2.0 * w,
                0.0,
                false,
            )?;
            layer(
                "shortconv.out_proj",
                "conv.out_proj",
                &[h, h],
                w,
                0.0,
                false,
            )?;
        }
    }
    Ok(all)
}

/// Writes `spec` as an LFM2 GGUF at `path`: projections, the embedding and the head in
/// `dtype`, norms and convolution taps in f32, no tokenizer (`no_vocab`).
pub fn write_tiny_lfm2_gguf(path: &Path, spec: &TinyLfm2, dtype: GgmlDType) -> Result<()> {
    let (h, f, v) = (spec.hidden_size, spec.intermediate_size, spec.vocab_size);
    let mut tensors: Vec<(String, QTensor)> = Vec::new();
    for t in draw(spec)? {
        let dt = if t.f32 { GgmlDType::F32 } else { dtype };
        tensors.push((t.gguf, QTensor::quantize(&t.values, dt)?));
    }
    let name = "lfm2";
    let u32_of = |v: usize| Value::U32(v as u32);
    let kv_heads: Vec<Value> = (0..spec.num_layers)
        .map(|i| match spec.attention_layers.contains(&i) {
            true => u32_of(spec.num_kv_heads),
            false => u32_of(0),
        })
        .collect();
    let metadata: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(name.into())),
        (
            "tokenizer.ggml.model".into(),
            Value::String("no_vocab".into()),
        ),
        (format!("{name}.context_length"), u32_of(1024)),
        (format!("{name}.vocab_size"), u32_of(v)),
        (format!("{name}.embedding_length"), u32_of(h)),
        (format!("{name}.block_count"), u32_of(spec.num_layers)),
        (format!("{name}.feed_forward_length"), u32_of(f)),
        (
            format!("{name}.attention.head_count"),
            u32_of(spec.num_heads),
        ),
        (
            format!("{name}.attention.head_count_kv"),
            Value::Array(kv_heads),
        ),
        (format!("{name}.rope.freq_base"), Value::F32(1_000_000.0)),
        (
            format!("{name}.attention.layer_norm_rms_epsilon"),
            Value::F32(1e-5),
        ),
        (format!("{name}.shortconv.l_cache"), u32_of(spec.kernel)),
    ];
    super::gguf::write_file(path, &metadata, &tensors)
}

/// Writes `spec` as an HF checkpoint in `dir` (`config.json`, `model.safetensors` in f32), the
/// same weights `write_tiny_lfm2_gguf` writes, as transformers (and candle-transformers'
/// `lfm2`) read them: `layer_types` of `conv` and `full_attention`, an MLP as wide as
/// `intermediate_size` (no automatic adjustment; candle's formula gives the same width).
pub fn write_tiny_lfm2_hf(dir: &Path, spec: &TinyLfm2) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
    let mut named = std::collections::HashMap::new();
    for t in draw(spec)? {
        let values = match t.values.dims() {
            [h, k] if t.hf.ends_with("conv.conv.weight") => t.values.reshape((*h, 1, *k))?,
            _ => t.values,
        };
        named.insert(t.hf, values);
    }
    candle_core::safetensors::save(&named, dir.join("model.safetensors"))?;
    let (h, f) = (spec.hidden_size, spec.intermediate_size);
    let layer_types: Vec<&str> = (0..spec.num_layers)
        .map(|i| match spec.attention_layers.contains(&i) {
            true => "full_attention",
            false => "conv",
        })
        .collect();
    let config = serde_json::json!({
        "architectures": ["Lfm2ForCausalLM"],
        "model_type": "lfm2",
        "vocab_size": spec.vocab_size,
        "hidden_size": h,
        "intermediate_size": f,
        "block_auto_adjust_ff_dim": false,
        "block_ffn_dim_multiplier": f as f64 / (4 * h) as f64,
        "block_multiple_of": 1,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "norm_eps": 1e-5,
        "rope_theta": 1_000_000.0,
        "max_position_embeddings": 1024,
        "conv_L_cache": spec.kernel,
        "conv_bias": false,
        "layer_types": layer_types,
        "tie_embedding": false,
        "hidden_act": "silu",
    });
    std::fs::write(dir.join("config.json"), config.to_string())
        .map_err(|e| Error::io("write config.json", e))
}
