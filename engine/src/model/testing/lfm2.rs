//! Tiny random-weight LFM2 models, written straight as GGUF files the way llama.cpp's converter
//! writes LFM2 (`blk.N.shortconv.{in_proj,conv,out_proj}`, per-layer `head_count_kv` with 0
//! for a convolution layer, `shortconv.l_cache`, the final norm as `token_embd_norm`): the
//! hybrid checked against candle-transformers' `quantized_lfm2` and against llama.cpp.

use std::path::Path;

use candle_core::quantized::gguf_file::{self, Value};
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

/// Writes `spec` as an LFM2 GGUF at `path`: projections, the embedding and the head in
/// `dtype`, norms and convolution taps in f32, no tokenizer (`no_vocab`).
pub fn write_tiny_lfm2_gguf(path: &Path, spec: &TinyLfm2, dtype: GgmlDType) -> Result<()> {
    let (h, f, v) = (spec.hidden_size, spec.intermediate_size, spec.vocab_size);
    let hd = h / spec.num_heads;
    let kvw = spec.num_kv_heads * hd;
    let mut rng = SplitMix(spec.seed);
    let mut tensors: Vec<(String, QTensor)> = Vec::new();
    let mut put = |name: String, shape: &[usize], scale: f32, offset: f32, dt: GgmlDType| {
        let n: usize = shape.iter().product();
        let data: Vec<f32> = (0..n)
            .map(|_| offset + scale * rng.next_centered())
            .collect();
        let t = Tensor::from_vec(data, shape, &Device::Cpu)?;
        tensors.push((name, QTensor::quantize(&t, dt)?));
        Ok::<(), Error>(())
    };
    let w = 1.0 / (h as f32).sqrt();
    put("token_embd.weight".into(), &[v, h], 1.0, 0.0, dtype)?;
    put(
        "token_embd_norm.weight".into(),
        &[h],
        0.2,
        1.0,
        GgmlDType::F32,
    )?;
    // An untied head: tied to these embeddings, a tiny model mostly repeats its last token.
    put("output.weight".into(), &[v, h], 0.3, 0.0, dtype)?;
    for i in 0..spec.num_layers {
        let b = format!("blk.{i}");
        put(
            format!("{b}.attn_norm.weight"),
            &[h],
            0.2,
            1.0,
            GgmlDType::F32,
        )?;
        put(
            format!("{b}.ffn_norm.weight"),
            &[h],
            0.2,
            1.0,
            GgmlDType::F32,
        )?;
        put(format!("{b}.ffn_gate.weight"), &[f, h], 2.0 * w, 0.0, dtype)?;
        put(format!("{b}.ffn_up.weight"), &[f, h], 2.0 * w, 0.0, dtype)?;
        put(format!("{b}.ffn_down.weight"), &[h, f], w, 0.0, dtype)?;
        if spec.attention_layers.contains(&i) {
            put(format!("{b}.attn_q.weight"), &[h, h], 2.0 * w, 0.0, dtype)?;
            put(format!("{b}.attn_k.weight"), &[kvw, h], 2.0 * w, 0.0, dtype)?;
            put(format!("{b}.attn_v.weight"), &[kvw, h], 2.0 * w, 0.0, dtype)?;
            put(format!("{b}.attn_output.weight"), &[h, h], w, 0.0, dtype)?;
            put(
                format!("{b}.attn_q_norm.weight"),
                &[hd],
                0.2,
                1.0,
                GgmlDType::F32,
            )?;
            put(
                format!("{b}.attn_k_norm.weight"),
                &[hd],
                0.2,
                1.0,
                GgmlDType::F32,
            )?;
        } else {
            // Taps drawn wide enough that every position of the window moves the output.
            put(
                format!("{b}.shortconv.conv.weight"),
                &[h, spec.kernel],
                0.8,
                0.0,
                GgmlDType::F32,
            )?;
            put(
                format!("{b}.shortconv.in_proj.weight"),
                &[3 * h, h],
                2.0 * w,
                0.0,
                dtype,
            )?;
            put(
                format!("{b}.shortconv.out_proj.weight"),
                &[h, h],
                w,
                0.0,
                dtype,
            )?;
        }
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
    let metadata: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensors: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut file = std::fs::File::create(path)
        .map_err(|e| Error::io(format!("create {}", path.display()), e))?;
    gguf_file::write(&mut file, &metadata, &tensors)?;
    Ok(())
}
