//! `load_model`: from a `--model` argument (alias, GGUF file, HF directory) and a
//! `--dtype` to a ready `Model` plus its `ModelTokenizer`. `auto` picks what runs fastest on
//! the device, from the measured forward-cost curves (`benches/README.md`): on CPU, GGUF
//! weights stay quantized (4-8x fewer bytes per step, and with thicket's matmul cheaper than
//! f32 at every verify size from 1 to 128 rows) and HF weights run in f32 (candle's f16/bf16
//! CPU matmuls convert on every call). On a GPU, GGUF weights are dequantized to f16 for
//! cuBLAS: candle's CUDA quantized kernels change a row's logits by up to 2.7 with the number
//! of rows beside it (they switch kernels at 5 and 9 rows), which breaks lossless greedy
//! verification, while f16 cuBLAS gave the same bits at every row count measured.

use candle_core::{DType, Device};

use super::{gguf, hf};
use crate::cpu::attention::AttentionKernel;
use crate::cpu::kv_store::KvDtype;
use crate::model::fetch::{resolve_model, ModelSource};
use crate::model::linear::{QuantKernel, WeightDType};
use crate::model::tokenizer::ModelTokenizer;
use crate::model::Model;
use crate::Result;

/// How to load.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// Weight representation.
    pub dtype: WeightDType,
    /// Attention implementation.
    pub attention: AttentionKernel,
    /// CPU kernel for quantized weights.
    pub matmul: QuantKernel,
    /// How KV stores keep values (`None`: the attention kernel's choice, see
    /// `Model::kv_dtype`).
    pub kv_dtype: Option<KvDtype>,
    /// Where the model runs.
    pub device: DeviceChoice,
    /// Where a GGUF mixture's experts are kept prepared for the SIMD kernels and mapped from
    /// (`experts::prepared`); `None` reads them into memory at every load.
    pub prepared_experts: Option<std::path::PathBuf>,
}

/// Where a model runs: `auto` (CUDA 0 when built with `cuda` and one is present, else the
/// CPU), `cpu`, or `cuda` / `cuda:N`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DeviceChoice {
    /// [`default_device`].
    #[default]
    Auto,
    /// The CPU.
    Cpu,
    /// CUDA device N.
    Cuda(usize),
}

impl DeviceChoice {
    /// `auto`, `cpu`, `cuda` or `cuda:N`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "auto" => Some(Self::Auto),
            "cpu" => Some(Self::Cpu),
            "cuda" => Some(Self::Cuda(0)),
            _ => s.strip_prefix("cuda:")?.parse().ok().map(Self::Cuda),
        }
    }

    /// The choice that gives `device` (the CPU for anything but a CUDA device).
    pub fn of(device: &Device) -> Self {
        match device.location() {
            candle_core::DeviceLocation::Cuda { gpu_id } => Self::Cuda(gpu_id),
            _ => Self::Cpu,
        }
    }

    /// The device, or why it cannot be had.
    pub fn device(self) -> Result<Device> {
        match self {
            Self::Auto => Ok(default_device()),
            Self::Cpu => Ok(Device::Cpu),
            Self::Cuda(n) if cfg!(feature = "cuda") => {
                cuda_device(n).map_err(|e| crate::Error::Device(format!("CUDA device {n}: {e}")))
            }
            Self::Cuda(n) => Err(crate::Error::Device(format!(
                "CUDA device {n}: this binary was built without the `cuda` feature \
                 (scripts/build-cuda.sh builds one)"
            ))),
        }
    }
}

/// A model and everything needed to talk to it.
#[derive(Debug, Clone)]
pub struct LoadedModel {
    /// The decoder.
    pub model: Model,
    /// Its tokenizer.
    pub tokenizer: ModelTokenizer,
    /// Where it came from.
    pub source: ModelSource,
}

/// The device models run on: CUDA 0 when built with `cuda` and one is present, else CPU.
pub fn default_device() -> Device {
    #[cfg(feature = "cuda")]
    if let Ok(device) = cuda_device(0) {
        return device;
    }
    Device::Cpu
}

/// CUDA device `n`, one per process: every model on it shares its context and stream (so
/// their work is ordered, and loading a model never creates or releases a context while
/// another thread runs kernels in it).
fn cuda_device(n: usize) -> candle_core::Result<Device> {
    static DEVICES: std::sync::Mutex<Vec<(usize, Device)>> = std::sync::Mutex::new(Vec::new());
    let mut devices = DEVICES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((_, device)) = devices.iter().find(|(i, _)| *i == n) {
        return Ok(device.clone());
    }
    let device = Device::new_cuda(n)?;
    devices.push((n, device.clone()));
    Ok(device)
}

/// Resolves `spec` (fetching an alias on first use) and loads it.
pub fn load_model(spec: &str, options: &LoadOptions) -> Result<LoadedModel> {
    load_source(resolve_model(spec)?, options)
}

/// Loads an already resolved model.
pub fn load_source(source: ModelSource, options: &LoadOptions) -> Result<LoadedModel> {
    let device = options.device.device()?;
    let (model, tokenizer) = match &source {
        ModelSource::Gguf(path) => {
            let dtype = match options.dtype {
                // On a GPU: f16 for cuBLAS (see the module docs).
                WeightDType::Auto if !device.is_cpu() => Some(DType::F16),
                WeightDType::Auto => None,
                other => other.dense(),
            };
            let (config, weights, tokenizer) =
                gguf::load_gguf_with(path, dtype, &device, options.prepared_experts.as_deref())?;
            (Model::new(config, weights, device)?, tokenizer)
        }
        ModelSource::HfDir(dir) => {
            let model = load_hf_model(dir, options.dtype, &device)?;
            let tokenizer = ModelTokenizer::from_hf_dir(dir, model.1)?;
            (model.0, tokenizer)
        }
    };
    let model = model
        .with_attention(options.attention)
        .with_quant_kernel(options.matmul)?;
    Ok(LoadedModel {
        model: match options.kv_dtype {
            Some(dtype) => model.with_kv_dtype(dtype),
            None => model,
        },
        tokenizer,
        source,
    })
}

/// Loads only the decoder of an HF directory (no tokenizer needed), with its config EOS ids.
pub fn load_hf_model(
    dir: &std::path::Path,
    dtype: WeightDType,
    device: &Device,
) -> Result<(Model, Vec<u32>)> {
    // Weights a checkpoint keeps quantized (gpt-oss's MXFP4 experts) stay so on the CPU
    // unless a dense type is asked for.
    let keep_quantized = matches!(dtype, WeightDType::Auto | WeightDType::Quantized);
    let dtype = match dtype {
        WeightDType::Auto if device.is_cpu() => Some(DType::F32),
        WeightDType::Auto => Some(DType::BF16),
        other => other.dense(),
    };
    let loaded = hf::load_hf_dir(dir, (dtype, keep_quantized), device)?;
    Ok((
        Model::new(loaded.config, loaded.weights, device.clone())?,
        loaded.eos_ids,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_choices_parse_and_name_their_device() {
        assert_eq!(DeviceChoice::parse("auto"), Some(DeviceChoice::Auto));
        assert_eq!(DeviceChoice::parse("cpu"), Some(DeviceChoice::Cpu));
        assert_eq!(DeviceChoice::parse("cuda"), Some(DeviceChoice::Cuda(0)));
        assert_eq!(DeviceChoice::parse("cuda:3"), Some(DeviceChoice::Cuda(3)));
        for bad in ["gpu", "cuda:", "cuda:x", "CPU", ""] {
            assert_eq!(DeviceChoice::parse(bad), None, "{bad:?}");
        }
        assert_eq!(DeviceChoice::of(&Device::Cpu), DeviceChoice::Cpu);
        assert!(DeviceChoice::Cpu.device().is_ok_and(|d| d.is_cpu()));
        if !cfg!(feature = "cuda") {
            let err = DeviceChoice::Cuda(0).device().unwrap_err().to_string();
            assert!(err.contains("built without the `cuda` feature"), "{err}");
        }
    }
}
