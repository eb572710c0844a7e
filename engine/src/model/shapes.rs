//! The shape each weight of a layer must have for a config (`[out, in]` for projections), so
//! that a file whose tensors contradict its own metadata or the family's declaration is refused
//! at load with the tensor's name, instead of failing (or computing garbage) in a forward; and
//! the split of fused projections (Phi-3's `qkv` and `gate_up`; a gated attention's query and
//! gate; Qwen3-Next's fused DeltaNet inputs) into their parts, by rows, for dense tensors and
//! for GGUF's quantized blocks alike (a row's blocks are its own).

use std::borrow::Cow;

use candle_core::quantized::{QStorage, QTensor};
use candle_core::Tensor;

use crate::model::config::{DeltaNetShape, LayerMixer, ModelConfig};
use crate::{Error, Result};

/// What a tensor is, for its expected shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Query projection.
    Q,
    /// Key or value projection.
    Kv,
    /// Attention output projection.
    O,
    /// MLP gate or up projection.
    Up,
    /// MLP down projection.
    Down,
    /// A norm over the residual.
    Norm,
    /// A per-head norm (QK norm).
    HeadNorm,
    /// Query, key and value projections fused, in that order.
    Qkv,
    /// MLP gate and up projections fused, in that order.
    GateUp,
    /// A short convolution's input projection (`B`, `C` and `x`).
    ConvIn,
    /// A short convolution's output projection.
    ConvOut,
    /// A gated attention's query projection: each head's query, then its gate.
    GatedQ,
    /// A Gated DeltaNet layer's query, key and value projection (the convolution's input).
    DeltaQkv,
    /// A Gated DeltaNet layer's output gate projection.
    DeltaGate,
    /// A Gated DeltaNet layer's projection to one value per value head (`beta`, `alpha`).
    DeltaHeads,
    /// A Gated DeltaNet layer's output projection.
    DeltaOut,
    /// A Mamba-2 layer's input projection: the gate, the convolution's channels, a step
    /// per head.
    Mamba2In,
}

/// The expected shapes of one config's layer weights.
#[derive(Debug, Clone, Copy)]
pub struct Shapes {
    hidden: usize,
    attention: usize,
    kv: usize,
    inner: usize,
    head: usize,
    delta: DeltaNetShape,
}

impl Shapes {
    /// The shapes `cfg` implies.
    pub fn of(cfg: &ModelConfig) -> Self {
        Self {
            hidden: cfg.hidden_size,
            attention: cfg.attention_width(),
            kv: cfg.kv_row_width(),
            inner: cfg.intermediate_size,
            head: cfg.head_dim,
            delta: (0..cfg.num_layers)
                .find_map(|i| match cfg.layer_mixer(i) {
                    LayerMixer::DeltaNet(shape) | LayerMixer::Mamba2(shape) => Some(shape),
                    _ => None,
                })
                .unwrap_or_default(),
        }
    }

    /// The shapes of layer `index` of `cfg`, whose heads and MLP may be its own.
    pub fn of_layer(cfg: &ModelConfig, index: usize) -> Self {
        let (kv_heads, head) = cfg.layer_heads(index);
        Self {
            attention: cfg.num_heads * head,
            kv: kv_heads * head,
            inner: cfg.layer_mlp_width(index),
            head,
            ..Self::of(cfg)
        }
    }

    /// The dims a tensor of `role` must have.
    pub fn expected(&self, role: Role) -> Vec<usize> {
        match role {
            Role::Q => vec![self.attention, self.hidden],
            Role::Kv => vec![self.kv, self.hidden],
            Role::O => vec![self.hidden, self.attention],
            Role::Up => vec![self.inner, self.hidden],
            Role::Down => vec![self.hidden, self.inner],
            Role::Norm => vec![self.hidden],
            Role::HeadNorm => vec![self.head],
            Role::Qkv => vec![self.attention + 2 * self.kv, self.hidden],
            Role::GateUp => vec![2 * self.inner, self.hidden],
            Role::ConvIn => vec![3 * self.hidden, self.hidden],
            Role::ConvOut => vec![self.hidden, self.hidden],
            Role::GatedQ => vec![2 * self.attention, self.hidden],
            Role::DeltaQkv => vec![self.delta.conv_channels(), self.hidden],
            Role::DeltaGate => vec![self.delta.value_width(), self.hidden],
            Role::DeltaHeads => vec![self.delta.value_heads, self.hidden],
            Role::DeltaOut => vec![self.hidden, self.delta.value_width()],
            Role::Mamba2In => vec![
                self.delta.value_width() + self.delta.conv_channels() + self.delta.value_heads,
                self.hidden,
            ],
        }
    }

    /// Rows of each part of a fused projection of `role`.
    pub fn parts(&self, role: Role) -> Vec<usize> {
        match role {
            Role::Qkv => vec![self.attention, self.kv, self.kv],
            Role::GateUp => vec![self.inner, self.inner],
            other => vec![self.expected(other)[0]],
        }
    }

    /// An error naming `name` unless `dims` is what `role` must have.
    pub fn check(&self, name: &str, role: Role, dims: &[usize]) -> Result<()> {
        let want = self.expected(role);
        if dims == want.as_slice() {
            return Ok(());
        }
        Err(Error::Metadata(format!(
            "tensor {name} has shape {dims:?}, but the config implies {want:?}"
        )))
    }
}

/// `t` (`[rows, in]`) cut into consecutive row ranges of `parts` rows.
pub fn split_dense(t: &Tensor, parts: &[usize]) -> Result<Vec<Tensor>> {
    let mut start = 0;
    let mut out = Vec::with_capacity(parts.len());
    for &rows in parts {
        out.push(t.narrow(0, start, rows)?.contiguous()?);
        start += rows;
    }
    Ok(out)
}

/// `q` (`[rows, in]`, any GGUF type) cut into consecutive row ranges of `parts` rows, each
/// keeping its blocks' bytes as they are.
pub fn split_quantized(q: &QTensor, parts: &[usize]) -> Result<Vec<QTensor>> {
    let dims = q.shape().dims().to_vec();
    let [rows, cols] = dims[..] else {
        return Err(Error::Metadata(format!(
            "a fused projection of shape {dims:?} is not a matrix"
        )));
    };
    let dtype = q.dtype();
    let row_bytes = cols / dtype.block_size() * dtype.type_size();
    let data = q.data()?;
    if data.len() != rows * row_bytes || parts.iter().sum::<usize>() != rows {
        return Err(Error::Metadata(format!(
            "a fused projection of {rows} rows does not split into {parts:?}"
        )));
    }
    let mut start = 0;
    let mut out = Vec::with_capacity(parts.len());
    for &n in parts {
        let bytes = &data[start * row_bytes..(start + n) * row_bytes];
        let storage = QStorage::from_data(Cow::Borrowed(bytes), &q.device(), dtype)?;
        out.push(QTensor::new(storage, (n, cols))?);
        start += n;
    }
    Ok(out)
}

/// `q` (`[rows, in]`, any GGUF type) dealt into two by runs of `run` rows, alternately: a
/// gated attention's query projection (`[q_0 | gate_0 | q_1 | gate_1 ...]`, `run` the head
/// width) into the queries and the gates.
pub fn deal_quantized(q: &QTensor, run: usize) -> Result<[QTensor; 2]> {
    let dims = q.shape().dims().to_vec();
    let [rows, cols] = dims[..] else {
        return Err(Error::Metadata(format!(
            "a gated query projection of shape {dims:?} is not a matrix"
        )));
    };
    let dtype = q.dtype();
    let row_bytes = cols / dtype.block_size() * dtype.type_size();
    let data = q.data()?;
    if run == 0 || !rows.is_multiple_of(2 * run) || data.len() != rows * row_bytes {
        return Err(Error::Metadata(format!(
            "a gated query projection of {rows} rows does not deal into runs of {run}"
        )));
    }
    let mut parts = [Vec::new(), Vec::new()];
    for (i, chunk) in data.chunks(run * row_bytes).enumerate() {
        parts[i % 2].extend_from_slice(chunk);
    }
    let device = q.device();
    let [a, b] = parts;
    let make = |bytes: Vec<u8>| -> Result<QTensor> {
        let storage = QStorage::from_data(Cow::Owned(bytes), &device, dtype)?;
        Ok(QTensor::new(storage, (rows / 2, cols))?)
    };
    Ok([make(a)?, make(b)?])
}

/// The rows `ranges` of `q` (`[rows, in]`, any GGUF type), in that order, as one tensor
/// (each row keeps its blocks' bytes as they are).
pub fn gather_quantized(q: &QTensor, ranges: &[std::ops::Range<usize>]) -> Result<QTensor> {
    let dims = q.shape().dims().to_vec();
    let [rows, cols] = dims[..] else {
        return Err(Error::Metadata(format!(
            "a projection of shape {dims:?} is not a matrix"
        )));
    };
    let dtype = q.dtype();
    let row_bytes = cols / dtype.block_size() * dtype.type_size();
    let data = q.data()?;
    if let Some(bad) = ranges.iter().find(|r| r.start > r.end || r.end > rows) {
        return Err(Error::Metadata(format!(
            "rows {bad:?} of a projection of {rows} rows"
        )));
    }
    let mut bytes = Vec::new();
    for r in ranges {
        bytes.extend_from_slice(&data[r.start * row_bytes..r.end * row_bytes]);
    }
    let taken = ranges.iter().map(|r| r.len()).sum::<usize>();
    let storage = QStorage::from_data(Cow::Owned(bytes), &q.device(), dtype)?;
    Ok(QTensor::new(storage, (taken, cols))?)
}

/// The parts of a split `qkv` and `gate_up` as `(q, k, v, gate, up)`.
pub fn unfused<T>(qkv: Vec<T>, gate_up: Vec<T>) -> Result<(T, T, T, T, T)> {
    match (<[T; 3]>::try_from(qkv), <[T; 2]>::try_from(gate_up)) {
        (Ok([q, k, v]), Ok([gate, up])) => Ok((q, k, v, gate, up)),
        _ => Err(Error::Metadata("a fused projection split wrongly".into())),
    }
}
