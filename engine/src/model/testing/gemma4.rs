//! A tiny random Gemma 4 as a GGUF in llama.cpp's names and shapes (`gemma4.*` keys), for
//! checking the family against llama.cpp: windowed and global layers listed by the file, the
//! global ones with heads of another count and width and a proportional RoPE (`rope_freqs`
//! with 1e30 past the pairs that turn), a global layer whose values are its keys' projection,
//! the last layers sharing earlier layers' keys and values with MLPs twice as wide, per-layer
//! embeddings, each block's output scale, a final soft-cap; or 26B-A4B's arrangement, a
//! mixture of experts beside every layer's dense MLP (`TinyGemma4::mixture`); with no
//! tokenizer.

use std::path::Path;

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::{GgmlDType, QTensor};

use super::qwen35::{Drawer, Named};
use super::SplitMix;
use crate::Result;

/// The tiny Gemma 4's shape.
#[derive(Debug, Clone)]
pub struct TinyGemma4 {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Residual width.
    pub hidden_size: usize,
    /// Per layer, whether it is windowed (the last must be global).
    pub windowed: Vec<bool>,
    /// Query heads.
    pub num_heads: usize,
    /// The windowed layers' KV heads and head width.
    pub local_heads: (usize, usize),
    /// The global layers' KV heads and head width.
    pub global_heads: (usize, usize),
    /// Pairs of a global head that turn.
    pub turning_pairs: usize,
    /// The last layers that read earlier layers' keys and values.
    pub shared_kv_layers: usize,
    /// The global layers without a value projection (their values are their keys').
    pub keys_as_values: Vec<usize>,
    /// MLP width of the layers that keep keys and values (twice that in the others).
    pub intermediate_size: usize,
    /// Per-layer embeddings' width (0: none).
    pub per_layer_width: usize,
    /// The window.
    pub window: usize,
    /// Final logit soft-cap.
    pub final_softcap: f32,
    /// A mixture beside every layer's dense MLP: experts, experts per token, expert width
    /// (26B-A4B's arrangement).
    pub experts: Option<(usize, usize, usize)>,
    /// Seed of every weight.
    pub seed: u64,
}

impl Default for TinyGemma4 {
    fn default() -> Self {
        Self {
            vocab_size: 300,
            hidden_size: 64,
            windowed: vec![true, true, false, true, false, true, false],
            num_heads: 4,
            local_heads: (2, 16),
            global_heads: (1, 32),
            turning_pairs: 4,
            shared_kv_layers: 2,
            keys_as_values: vec![2],
            intermediate_size: 96,
            per_layer_width: 32,
            window: 8,
            final_softcap: 15.0,
            experts: None,
            seed: 404,
        }
    }
}

impl TinyGemma4 {
    /// 26B-A4B's arrangement: no per-layer embeddings and no shared keys and values, every
    /// global layer's values from its keys' projection, 8 experts of which 3 run beside each
    /// layer's dense MLP.
    pub fn mixture() -> Self {
        Self {
            shared_kv_layers: 0,
            keys_as_values: vec![2, 4, 6],
            per_layer_width: 0,
            experts: Some((8, 3, 32)),
            seed: 405,
            ..Self::default()
        }
    }
}

impl TinyGemma4 {
    /// Layers.
    pub fn num_layers(&self) -> usize {
        self.windowed.len()
    }

    /// Layer `i`'s KV heads and head width.
    pub fn heads(&self, i: usize) -> (usize, usize) {
        match self.windowed[i] {
            true => self.local_heads,
            false => self.global_heads,
        }
    }

    /// Whether layer `i` reads an earlier layer's keys and values.
    pub fn shares(&self, i: usize) -> bool {
        i >= self.num_layers() - self.shared_kv_layers
    }

    /// Layer `i`'s MLP width.
    pub fn mlp_width(&self, i: usize) -> usize {
        match self.shares(i) {
            true => 2 * self.intermediate_size,
            false => self.intermediate_size,
        }
    }
}

/// Every tensor of `spec` by its GGUF name, drawn from its seed (norms, scales and the RoPE
/// divisors marked f32).
pub(super) fn draw(spec: &TinyGemma4) -> Result<Vec<Named>> {
    let (h, v, heads) = (spec.hidden_size, spec.vocab_size, spec.num_heads);
    let n = spec.num_layers();
    let mut d = Drawer {
        rng: SplitMix(spec.seed),
        all: Vec::new(),
    };
    d.put("token_embd.weight".into(), &[v, h], 1.0, 0.0, false)?;
    d.norm("output_norm.weight".into(), h)?;
    // An untied head: tied to the embeddings, a tiny model mostly repeats its last token.
    d.put("output.weight".into(), &[v, h], 0.3, 0.0, false)?;
    let ple = spec.per_layer_width;
    if ple > 0 {
        d.put(
            "per_layer_token_embd.weight".into(),
            &[v, n * ple],
            1.0,
            0.0,
            false,
        )?;
        d.proj("per_layer_model_proj.weight".into(), n * ple, h, 1.0)?;
        d.norm("per_layer_proj_norm.weight".into(), ple)?;
    }
    for i in 0..n {
        let t = |name: &str| format!("blk.{i}.{name}");
        let (kv, hd) = spec.heads(i);
        d.norm(t("attn_norm.weight"), h)?;
        d.proj(t("attn_q.weight"), heads * hd, h, 2.0)?;
        d.norm(t("attn_q_norm.weight"), hd)?;
        if !spec.shares(i) {
            d.proj(t("attn_k.weight"), kv * hd, h, 2.0)?;
            d.norm(t("attn_k_norm.weight"), hd)?;
            if !spec.keys_as_values.contains(&i) {
                d.proj(t("attn_v.weight"), kv * hd, h, 2.0)?;
            }
        }
        d.proj(t("attn_output.weight"), h, heads * hd, 1.0)?;
        d.norm(t("post_attention_norm.weight"), h)?;
        d.norm(t("ffn_norm.weight"), h)?;
        let f = spec.mlp_width(i);
        d.proj(t("ffn_gate.weight"), f, h, 2.0)?;
        d.proj(t("ffn_up.weight"), f, h, 2.0)?;
        d.proj(t("ffn_down.weight"), h, f, 1.0)?;
        d.norm(t("post_ffw_norm.weight"), h)?;
        if let Some((e, _, w)) = spec.experts {
            let g = 1.0 / (h as f32).sqrt();
            d.put(t("ffn_gate_inp.weight"), &[e, h], 2.0 * g, 0.0, true)?;
            d.put(t("ffn_gate_inp.scale"), &[h], 0.5, 1.0, true)?;
            d.put(
                t("ffn_gate_up_exps.weight"),
                &[e, 2 * w, h],
                2.0 * g,
                0.0,
                false,
            )?;
            let down = 1.0 / (w as f32).sqrt();
            d.put(t("ffn_down_exps.weight"), &[e, h, w], down, 0.0, false)?;
            d.put(t("ffn_down_exps.scale"), &[e], 0.3, 1.0, true)?;
            d.norm(t("pre_ffw_norm_2.weight"), h)?;
            d.norm(t("post_ffw_norm_1.weight"), h)?;
            d.norm(t("post_ffw_norm_2.weight"), h)?;
        }
        if ple > 0 {
            d.proj(t("inp_gate.weight"), ple, h, 2.0)?;
            d.proj(t("proj.weight"), h, ple, 1.0)?;
            d.norm(t("post_norm.weight"), h)?;
        }
        d.put(t("layer_output_scale.weight"), &[1], 0.4, 0.8, true)?;
    }
    Ok(d.all)
}

/// Writes `spec` as a `gemma4` GGUF, the projections and tables in `dtype`, norms, scales
/// and RoPE divisors in f32.
pub fn write_tiny_gemma4_gguf(path: &Path, spec: &TinyGemma4, dtype: GgmlDType) -> Result<()> {
    let mut tensors: Vec<(String, QTensor)> = Vec::new();
    for t in draw(spec)? {
        let dt = if t.f32 { GgmlDType::F32 } else { dtype };
        tensors.push((t.name, QTensor::quantize(&t.values, dt)?));
    }
    let global_hd = spec.global_heads.1;
    let pairs = global_hd / 2;
    let divisors: Vec<f32> = (0..pairs)
        .map(|i| if i < spec.turning_pairs { 1.0 } else { 1e30 })
        .collect();
    let divisors = candle_core::Tensor::from_vec(divisors, pairs, &candle_core::Device::Cpu)?;
    tensors.push((
        "rope_freqs.weight".into(),
        QTensor::quantize(&divisors, GgmlDType::F32)?,
    ));
    let name = "gemma4";
    let n = spec.num_layers();
    let u32_of = |v: usize| Value::U32(v as u32);
    let per_layer = |f: &dyn Fn(usize) -> usize| {
        Value::Array((0..n).map(|i| Value::U32(f(i) as u32)).collect())
    };
    let local_hd = spec.local_heads.1;
    let mut metadata: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(name.into())),
        (
            "tokenizer.ggml.model".into(),
            Value::String("no_vocab".into()),
        ),
        (format!("{name}.context_length"), u32_of(1024)),
        (format!("{name}.vocab_size"), u32_of(spec.vocab_size)),
        (format!("{name}.embedding_length"), u32_of(spec.hidden_size)),
        (format!("{name}.block_count"), u32_of(n)),
        (
            format!("{name}.feed_forward_length"),
            per_layer(&|i| spec.mlp_width(i)),
        ),
        (
            format!("{name}.attention.head_count"),
            u32_of(spec.num_heads),
        ),
        (
            format!("{name}.attention.head_count_kv"),
            per_layer(&|i| spec.heads(i).0),
        ),
        (format!("{name}.attention.key_length"), u32_of(global_hd)),
        (format!("{name}.attention.value_length"), u32_of(global_hd)),
        (format!("{name}.attention.key_length_swa"), u32_of(local_hd)),
        (
            format!("{name}.attention.value_length_swa"),
            u32_of(local_hd),
        ),
        (format!("{name}.rope.dimension_count"), u32_of(global_hd)),
        (format!("{name}.rope.dimension_count_swa"), u32_of(local_hd)),
        (format!("{name}.rope.freq_base"), Value::F32(1_000_000.0)),
        (format!("{name}.rope.freq_base_swa"), Value::F32(10_000.0)),
        (
            format!("{name}.attention.sliding_window"),
            u32_of(spec.window),
        ),
        (
            format!("{name}.attention.sliding_window_pattern"),
            Value::Array(spec.windowed.iter().map(|&b| Value::Bool(b)).collect()),
        ),
        (
            format!("{name}.attention.shared_kv_layers"),
            u32_of(spec.shared_kv_layers),
        ),
        (
            format!("{name}.embedding_length_per_layer_input"),
            u32_of(spec.per_layer_width),
        ),
        (
            format!("{name}.attention.layer_norm_rms_epsilon"),
            Value::F32(1e-6),
        ),
        (
            format!("{name}.final_logit_softcapping"),
            Value::F32(spec.final_softcap),
        ),
    ];
    if let Some((e, used, w)) = spec.experts {
        metadata.extend([
            (format!("{name}.expert_count"), u32_of(e)),
            (format!("{name}.expert_used_count"), u32_of(used)),
            (format!("{name}.expert_feed_forward_length"), u32_of(w)),
        ]);
    }
    super::gguf::write_file(path, &metadata, &tensors)
}
