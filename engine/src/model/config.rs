//! `ModelConfig`: the hyper-parameters of a llama / qwen2 decoder, whichever file format they
//! came from, plus the two facts that differ between formats and must travel with the weights:
//! the RoPE pairing (GGUF llama weights are permuted for interleaved pairs; HF and qwen2 use
//! halves) and whether the head is tied to the embedding.

use crate::{Error, Result};

/// Decoder family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    /// Llama (SmolLM2): no attention biases.
    Llama,
    /// Qwen2: q/k/v biases.
    Qwen2,
}

impl Architecture {
    /// Parses a GGUF `general.architecture` or HF `model_type`.
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "llama" | "LlamaForCausalLM" => Ok(Self::Llama),
            "qwen2" | "Qwen2ForCausalLM" => Ok(Self::Qwen2),
            other => Err(Error::UnsupportedArchitecture(other.to_string())),
        }
    }

    /// Name as written in GGUF metadata keys.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Qwen2 => "qwen2",
        }
    }
}

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
}

impl ModelConfig {
    /// Width of one K (or V) row in the KV store: `num_kv_heads * head_dim`.
    pub fn kv_row_width(&self) -> usize {
        self.num_kv_heads * self.head_dim
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
        if self.num_heads * self.head_dim != self.hidden_size {
            return bad("heads * head_dim must equal hidden size");
        }
        Ok(())
    }
}
