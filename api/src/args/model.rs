//! [`ModelArgs`]: the flags that name a model and say how it loads (weights, attention and
//! matmul kernels, KV cache type, device), their parsers, and the [`LoadOptions`] they make.

use clap::Args;
use engine::cpu::attention::AttentionKernel;
use engine::cpu::kv_store::KvDtype;
use engine::model::fetch::DEFAULT_MODEL;
use engine::{DeviceChoice, LoadOptions, QuantKernel, WeightDType};

/// Flags shared by everything that loads a model.
#[derive(Debug, Args)]
pub struct ModelArgs {
    /// Alias, GGUF file, or HF directory.
    #[arg(long, default_value = DEFAULT_MODEL)]
    pub model: String,
    /// Weight representation: auto | q | f32 | f16 | bf16.
    #[arg(long, default_value = "auto", value_parser = parse_dtype)]
    pub dtype: WeightDType,
    /// Attention kernel: fused (batch-invariant, tree-exact) | reference (candle's arithmetic).
    #[arg(long, default_value = "fused", value_parser = parse_attention)]
    pub attention: AttentionKernel,
    /// CPU kernel for quantized weights: thicket (weights streamed once for all rows) | candle.
    #[arg(long, default_value = "thicket", value_parser = parse_matmul)]
    pub matmul: QuantKernel,
    /// How the KV cache keeps keys and values: f16 (half the memory of f32) | f32. Default:
    /// f16 with the fused attention, f32 with the reference.
    #[arg(long, value_parser = parse_kv_dtype)]
    pub kv_cache_dtype: Option<KvDtype>,
    /// Where the model runs: auto (a CUDA GPU when built with `cuda` and one is present,
    /// else the CPU) | cpu | cuda | cuda:N.
    #[arg(long, default_value = "auto", value_parser = parse_device)]
    pub device: DeviceChoice,
    /// Read a GGUF mixture's experts into memory at every load, instead of preparing them
    /// once for the SIMD kernels (a file as large as the experts, in the models directory's
    /// `prepared/`) and mapping that file from then on.
    #[arg(long)]
    pub no_prepared_experts: bool,
}

impl ModelArgs {
    /// How the model these flags name is loaded.
    pub fn options(&self) -> LoadOptions {
        LoadOptions {
            dtype: self.dtype,
            attention: self.attention,
            matmul: self.matmul,
            kv_dtype: self.kv_cache_dtype,
            device: self.device,
            prepared_experts: (!self.no_prepared_experts)
                .then(|| engine::model::fetch::models_dir().join("prepared")),
        }
    }
}

fn parse_attention(s: &str) -> Result<AttentionKernel, String> {
    AttentionKernel::parse(s)
        .ok_or_else(|| format!("unknown attention kernel '{s}' (fused, reference)"))
}

fn parse_kv_dtype(s: &str) -> Result<KvDtype, String> {
    KvDtype::parse(s).ok_or_else(|| format!("unknown KV cache dtype '{s}' (f16, f32)"))
}

fn parse_device(s: &str) -> Result<DeviceChoice, String> {
    DeviceChoice::parse(s).ok_or_else(|| format!("unknown device '{s}' (auto, cpu, cuda, cuda:N)"))
}

fn parse_matmul(s: &str) -> Result<QuantKernel, String> {
    QuantKernel::parse(s).ok_or_else(|| format!("unknown matmul kernel '{s}' (thicket, candle)"))
}

/// A weight representation (`--dtype`, `--draft-dtype`).
pub(super) fn parse_dtype(s: &str) -> Result<WeightDType, String> {
    WeightDType::parse(s).ok_or_else(|| format!("unknown dtype '{s}' (auto, q, f32, f16, bf16)"))
}
