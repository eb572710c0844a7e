//! `Embedding`: the token embedding table, dense (f32, as HF checkpoints and device backends
//! keep it) or as the GGUF file stores it (quantized blocks on the CPU, each looked-up row
//! dequantized when a batch needs it). Gemma 3 270M's 262,144 x 640 table is 178 MB in Q8_0
//! and would be 671 MB in f32; a row dequantized alone has the values the whole table
//! dequantized would have (each block's arithmetic is its own).

use std::borrow::Cow;

use candle_core::quantized::{QStorage, QTensor};
use candle_core::{DType, Device, Storage, Tensor};

use crate::{Error, Result};

/// The token embedding table.
#[derive(Debug, Clone)]
pub enum Embedding {
    /// `[vocab, hidden]` f32.
    Dense(Tensor),
    /// `[vocab, hidden]` in GGUF blocks, on the CPU.
    Quantized(std::sync::Arc<QTensor>),
}

impl Embedding {
    /// `[vocab, hidden]`.
    pub fn dims(&self) -> (usize, usize) {
        let dims = match self {
            Self::Dense(t) => t.dims().to_vec(),
            Self::Quantized(q) => q.shape().dims().to_vec(),
        };
        match dims[..] {
            [vocab, hidden] => (vocab, hidden),
            _ => (0, 0),
        }
    }

    /// The whole table in f32 (a device backend's copy).
    pub fn dense(&self) -> Result<Tensor> {
        match self {
            Self::Dense(t) => Ok(t.clone()),
            Self::Quantized(q) => Ok(q.dequantize(&Device::Cpu)?.to_dtype(DType::F32)?),
        }
    }

    /// The rows of `ids` as `[ids, hidden]` f32 on `device`.
    pub fn lookup(&self, ids: &[u32], device: &Device) -> Result<Tensor> {
        match self {
            Self::Dense(t) => {
                let ids = Tensor::new(ids, t.device())?;
                Ok(t.index_select(&ids, 0)?)
            }
            Self::Quantized(_) => {
                let (_, hidden) = self.dims();
                let mut rows = Vec::with_capacity(ids.len() * hidden);
                self.rows_into(ids, &mut rows)?;
                Ok(Tensor::from_vec(rows, (ids.len(), hidden), device)?)
            }
        }
    }

    /// The rows of `ids`, concatenated into `x` (cleared first).
    pub fn rows_into(&self, ids: &[u32], x: &mut Vec<f32>) -> Result<()> {
        let (vocab, hidden) = self.dims();
        x.clear();
        let outside = |id: u32| Error::InvalidBatch(format!("token id {id} outside the embedding"));
        match self {
            Self::Dense(t) => {
                let (storage, layout) = t.storage_and_layout();
                let Storage::Cpu(cpu) = &*storage else {
                    return Err(Error::InvalidBatch("embedding off the CPU".into()));
                };
                let all = cpu.as_slice::<f32>()?;
                let (start, end) = layout
                    .contiguous_offsets()
                    .ok_or_else(|| Error::InvalidBatch("embedding not contiguous".into()))?;
                let all = &all[start..end];
                for &id in ids {
                    let at = id as usize * hidden;
                    x.extend_from_slice(all.get(at..at + hidden).ok_or_else(|| outside(id))?);
                }
            }
            Self::Quantized(q) => {
                let dtype = q.dtype();
                let row_bytes = hidden / dtype.block_size() * dtype.type_size();
                let data = q.data()?;
                for &id in ids {
                    if id as usize >= vocab {
                        return Err(outside(id));
                    }
                    let at = id as usize * row_bytes;
                    let bytes = data.get(at..at + row_bytes).ok_or_else(|| outside(id))?;
                    let storage = QStorage::from_data(Cow::Borrowed(bytes), &Device::Cpu, dtype)?;
                    let row = QTensor::new(storage, (1, hidden))?.dequantize(&Device::Cpu)?;
                    x.extend(row.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?);
                }
            }
        }
        Ok(())
    }
}
