//! `Linear`: one projection `y = x W^T (+ b)` whose weights either stay quantized (GGUF block
//! formats, multiplied on the CPU by thicket's `qgemm::QuantMatrix` or by candle's
//! `QMatMul`) or are dense in a chosen dtype. Activations are always f32 at the boundary; a
//! dense f16/bf16 weight converts the input and output around its matmul.

use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QMatMul, QStorage, QTensor};
use candle_core::{DType, Device, Module, Tensor};

use crate::cpu::qgemm::formats::QuantFormat;
use crate::cpu::qgemm::QuantMatrix;
use crate::Result;

/// Which CPU kernel multiplies quantized weights, chosen with `--matmul`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QuantKernel {
    /// `qgemm::QuantMatrix`: streams the weights once for all rows (formats it supports).
    #[default]
    Thicket,
    /// candle's `QMatMul` (every format; the reference the other is tested against).
    Candle,
}

impl QuantKernel {
    /// Parses `--matmul`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "thicket" => Some(Self::Thicket),
            "candle" => Some(Self::Candle),
            _ => None,
        }
    }
}

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
    /// thicket's kernel; shared so cloning a model does not copy its weights.
    Packed(Arc<QuantMatrix>),
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
            None => Weight::quantized(weight, QuantKernel::default())?,
            Some(dtype) => {
                let device = weight.device();
                Weight::Dense(weight.dequantize(&device)?.to_dtype(dtype)?)
            }
        };
        Ok(Self { weight, bias })
    }

    /// thicket's kernel on `matrix` as it is (for example mapped from a prepared file).
    pub fn from_packed(matrix: QuantMatrix) -> Self {
        Self {
            weight: Weight::Packed(Arc::new(matrix)),
            bias: None,
        }
    }

    /// The same weight with `bias` (f32, `[out]`) added to its outputs instead.
    pub fn with_bias(self, bias: Option<Tensor>) -> Self {
        Self { bias, ..self }
    }

    /// Outputs (`out` of `[out, in]`).
    pub fn rows(&self) -> usize {
        match &self.weight {
            Weight::Packed(w) => w.rows(),
            Weight::Quantized(QMatMul::QTensor(q)) => {
                q.shape().dims().first().copied().unwrap_or(0)
            }
            Weight::Quantized(QMatMul::Tensor(t) | QMatMul::TensorF16(t)) | Weight::Dense(t) => {
                t.dims().first().copied().unwrap_or(0)
            }
        }
    }

    /// From a dense `[out, in]` tensor, converted to `dtype`, or quantized to Q8_0 when
    /// `dtype` is `None` (falls back to f32 when the input width is not a multiple of 32).
    pub fn from_dense(weight: Tensor, bias: Option<Tensor>, dtype: Option<DType>) -> Result<Self> {
        let weight = match dtype {
            Some(dtype) => Weight::Dense(weight.to_dtype(dtype)?),
            None if weight.dim(1)? % GgmlDType::Q8_0.block_size() == 0 => {
                let q = QTensor::quantize(&weight.to_dtype(DType::F32)?, GgmlDType::Q8_0)?;
                Weight::quantized(q, QuantKernel::default())?
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
            Weight::Packed(w) => {
                let rows = x.dim(0)?;
                let input = x.contiguous()?.flatten_all()?.to_vec1::<f32>()?;
                Tensor::from_vec(w.matmul(&input)?, (rows, w.rows()), x.device())?
            }
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
            Weight::Packed(w) => w.bytes(),
            Weight::Quantized(QMatMul::Tensor(t) | QMatMul::TensorF16(t)) | Weight::Dense(t) => {
                t.elem_count() * t.dtype().size_in_bytes()
            }
        }
    }

    /// Multiplies the quantized weight with `kernel` from now on (dense weights, and formats
    /// thicket's kernel does not support, are left as they are).
    pub fn set_kernel(&mut self, kernel: QuantKernel) -> Result<()> {
        let replacement = match (&self.weight, kernel) {
            (Weight::Quantized(QMatMul::QTensor(q)), QuantKernel::Thicket) if prefer_thicket(q) => {
                QuantMatrix::from_qtensor(q)?.map(|packed| Weight::Packed(Arc::new(packed)))
            }
            // A format candle lacks (MXFP4) stays on thicket's kernel.
            (Weight::Packed(w), QuantKernel::Candle) => match w.format().ggml() {
                Some(dtype) => {
                    let storage = QStorage::from_data(w.gguf(), &Device::Cpu, dtype)?;
                    let tensor = QTensor::new(storage, (w.rows(), w.cols()))?;
                    Some(Weight::Quantized(QMatMul::from_qtensor(tensor)?))
                }
                None => None,
            },
            _ => None,
        };
        if let Some(weight) = replacement {
            self.weight = weight;
        }
        Ok(())
    }

    /// thicket's quantized matrix, when this projection is multiplied by it.
    pub fn packed(&self) -> Option<&Arc<QuantMatrix>> {
        match &self.weight {
            Weight::Packed(w) => Some(w),
            _ => None,
        }
    }

    /// The bias as f32 values.
    pub fn bias_values(&self) -> Result<Option<Vec<f32>>> {
        Ok(match &self.bias {
            Some(b) => Some(b.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?),
            None => None,
        })
    }

    /// A dense weight (`[out, in]`), `None` for a quantized one.
    pub fn dense_weight(&self) -> Option<&Tensor> {
        match &self.weight {
            Weight::Dense(t) => Some(t),
            _ => None,
        }
    }

    /// The bias, when there is one (f32).
    pub fn bias(&self) -> Option<&Tensor> {
        self.bias.as_ref()
    }

    /// The kernel multiplying this projection, `None` when its weight is dense.
    pub fn kernel(&self) -> Option<QuantKernel> {
        match &self.weight {
            Weight::Quantized(QMatMul::QTensor(_)) => Some(QuantKernel::Candle),
            Weight::Packed(_) => Some(QuantKernel::Thicket),
            _ => None,
        }
    }
}

impl Weight {
    /// A quantized weight for `kernel`: thicket's where it is on the CPU in a supported
    /// format, candle's otherwise.
    fn quantized(q: QTensor, kernel: QuantKernel) -> Result<Self> {
        if kernel == QuantKernel::Thicket && prefer_thicket(&q) {
            if let Some(packed) = QuantMatrix::from_qtensor(&q)? {
                return Ok(Self::Packed(Arc::new(packed)));
            }
        }
        Ok(Self::Quantized(QMatMul::from_qtensor(q)?))
    }
}

/// Whether thicket's kernel multiplies `q`: on the CPU, every format it supports. Its rows
/// never depend on the rows beside them, which lossless verification needs and candle's x86
/// kernels do not give (their Q6_K takes one path for a single row and another for several,
/// so a verified tree's row differs from the same token decoded alone).
fn prefer_thicket(q: &QTensor) -> bool {
    q.device().is_cpu() && QuantFormat::from_ggml(q.dtype()).is_some()
}
