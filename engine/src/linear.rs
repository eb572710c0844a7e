//! `Linear`: one projection `y = x W^T (+ b)` whose weights either stay quantized (candle
//! `QMatMul`, GGUF block formats) or are dense in a chosen dtype. Activations are always f32
//! at the boundary; a dense f16/bf16 weight converts the input and output around its matmul.

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{DType, Module, Tensor};

use crate::Result;

/// How weights are held in memory, chosen with `--dtype`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WeightDType {
    /// Whatever runs fastest on the device (quantized GGUF on CPU, f32 for HF on CPU).
    #[default]
    Auto,
    /// Keep GGUF quantization (HF weights are quantized to Q8_0 at load).
    Quantized,
    /// Dequantize to f32.
    F32,
    /// Dequantize to f16.
    F16,
    /// Dequantize to bf16.
    BF16,
}

impl WeightDType {
    /// Parses the `--dtype` value.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "auto" => Some(Self::Auto),
            "q" | "quantized" => Some(Self::Quantized),
            "f32" => Some(Self::F32),
            "f16" => Some(Self::F16),
            "bf16" => Some(Self::BF16),
            _ => None,
        }
    }

    /// The dense dtype, or `None` for quantized.
    pub fn dense(self) -> Option<DType> {
        match self {
            Self::Auto | Self::Quantized => None,
            Self::F32 => Some(DType::F32),
            Self::F16 => Some(DType::F16),
            Self::BF16 => Some(DType::BF16),
        }
    }
}

/// One projection.
#[derive(Debug, Clone)]
pub struct Linear {
    weight: Weight,
    bias: Option<Tensor>,
}

#[derive(Debug, Clone)]
enum Weight {
    Quantized(QMatMul),
    /// `[out, in]`, in the dtype the matmul runs in.
    Dense(Tensor),
}

impl Linear {
    /// From a GGUF tensor, kept quantized (`dtype = None`) or dequantized to `dtype`.
    pub fn from_qtensor(
        weight: QTensor,
        bias: Option<Tensor>,
        dtype: Option<DType>,
    ) -> Result<Self> {
        let weight = match dtype {
            None => Weight::Quantized(QMatMul::from_qtensor(weight)?),
            Some(dtype) => {
                let device = weight.device();
                Weight::Dense(weight.dequantize(&device)?.to_dtype(dtype)?)
            }
        };
        Ok(Self { weight, bias })
    }

    /// From a dense `[out, in]` tensor, converted to `dtype`, or quantized to Q8_0 when
    /// `dtype` is `None` (falls back to f32 when the input width is not a multiple of 32).
    pub fn from_dense(weight: Tensor, bias: Option<Tensor>, dtype: Option<DType>) -> Result<Self> {
        let weight = match dtype {
            Some(dtype) => Weight::Dense(weight.to_dtype(dtype)?),
            None if weight.dim(1)? % GgmlDType::Q8_0.block_size() == 0 => {
                let q = QTensor::quantize(&weight.to_dtype(DType::F32)?, GgmlDType::Q8_0)?;
                Weight::Quantized(QMatMul::from_qtensor(q)?)
            }
            None => Weight::Dense(weight.to_dtype(DType::F32)?),
        };
        let bias = bias.map(|b| b.to_dtype(DType::F32)).transpose()?;
        Ok(Self { weight, bias })
    }

    /// `x: [rows, in]` f32 -> `[rows, out]` f32.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = match &self.weight {
            Weight::Quantized(w) => w.forward(x)?,
            Weight::Dense(w) if w.dtype() == DType::F32 => x.matmul(&w.t()?)?,
            Weight::Dense(w) => x
                .to_dtype(w.dtype())?
                .matmul(&w.t()?)?
                .to_dtype(DType::F32)?,
        };
        Ok(match &self.bias {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        })
    }

    /// Bytes of weight memory (what a decode step must stream).
    pub fn weight_bytes(&self) -> usize {
        match &self.weight {
            Weight::Quantized(QMatMul::QTensor(q)) => q.storage_size_in_bytes(),
            Weight::Quantized(QMatMul::Tensor(t) | QMatMul::TensorF16(t)) | Weight::Dense(t) => {
                t.elem_count() * t.dtype().size_in_bytes()
            }
        }
    }
}
