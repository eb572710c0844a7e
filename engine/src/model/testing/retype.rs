//! Writing a GGUF again with some tensors stored in another type, for tests of types candle
//! cannot write: [`retype_gguf`] copies a file's metadata and tensors, giving the tensors a
//! caller picks new blocks (MXFP4 from [`quantize_mxfp4`], ggml's reference quantization, or
//! plain F32 values). The rest keep their bytes.

use std::fs::File;
use std::io::{BufReader, BufWriter, Seek, Write};
use std::path::Path;

use candle_core::quantized::gguf_file::Value;
use candle_core::Device;

use crate::cpu::qgemm::formats::{e8m0_half, MXFP4_VALUES};
use crate::model::gguf_header;
use crate::{Error, Result};

/// New blocks for a tensor: its GGML type number and its bytes (its shape stays).
pub struct Blocks {
    /// GGML type number (0 for F32, 39 for MXFP4).
    pub ggml_type: u32,
    /// The data as the file stores it.
    pub bytes: Vec<u8>,
}

impl Blocks {
    /// F32 values.
    pub fn f32(values: &[f32]) -> Self {
        Self {
            ggml_type: 0,
            bytes: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }

    /// MXFP4 blocks of `values` (see [`quantize_mxfp4`]).
    pub fn mxfp4(values: &[f32]) -> Self {
        Self {
            ggml_type: 39,
            bytes: quantize_mxfp4(values),
        }
    }
}

/// ggml's reference MXFP4 quantization (`quantize_row_mxfp4_ref`) of whole blocks of 32: the
/// scale byte puts the block's largest magnitude two binades above the top code's, and each
/// value takes its nearest code (the first of a tie).
pub fn quantize_mxfp4(values: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() / 32 * 17);
    for block in values.chunks_exact(32) {
        let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
        let e = if amax > 0.0 {
            (amax.log2().floor() - 2.0 + 127.0).clamp(0.0, 254.0) as u8
        } else {
            0
        };
        let d = e8m0_half(e);
        let code = |v: f32| -> u8 {
            let mut best = 0;
            for (i, &q) in MXFP4_VALUES.iter().enumerate() {
                if (d * f32::from(q) - v).abs() < (d * f32::from(MXFP4_VALUES[best]) - v).abs() {
                    best = i;
                }
            }
            best as u8
        };
        out.push(e);
        for j in 0..16 {
            out.push(code(block[j]) | (code(block[j + 16]) << 4));
        }
    }
    out
}

/// Writes `src` to `dst` with each tensor for which `retype(name, values)` gives blocks (its
/// values dequantized, outermost dimension first) stored as those blocks.
pub fn retype_gguf(
    src: &Path,
    dst: &Path,
    retype: impl Fn(&str, &[f32]) -> Option<Blocks>,
) -> Result<()> {
    let io = |e| Error::io(format!("rewriting {}", src.display()), e);
    let mut reader = BufReader::new(File::open(src).map_err(io)?);
    let header = gguf_header::read(&mut reader).map_err(Error::Metadata)?;
    let content = &header.content;
    let mut names: Vec<&String> = content.tensor_infos.keys().collect();
    names.sort();
    let mut tensors = Vec::new();
    for name in names {
        let info = &content.tensor_infos[name];
        let q = content.tensor(&mut reader, name, &Device::Cpu)?;
        let values: Vec<f32> = q.dequantize(&Device::Cpu)?.flatten_all()?.to_vec1()?;
        let blocks = match retype(name, &values) {
            Some(blocks) => blocks,
            None => Blocks {
                ggml_type: raw_type(info.ggml_dtype),
                bytes: q.data()?.into_owned(),
            },
        };
        tensors.push((name.clone(), info.shape.dims().to_vec(), blocks));
    }
    let mut out = BufWriter::new(File::create(dst).map_err(io)?);
    let mut w = |bytes: &[u8]| out.write_all(bytes).map_err(io);
    w(b"GGUF")?;
    w(&3u32.to_le_bytes())?;
    w(&(tensors.len() as u64).to_le_bytes())?;
    w(&(content.metadata.len() as u64).to_le_bytes())?;
    let mut keys: Vec<&String> = content.metadata.keys().collect();
    keys.sort();
    for key in keys {
        string(&mut w, key)?;
        value(&mut w, &content.metadata[key], true)?;
    }
    let align = |n: u64| n.div_ceil(32) * 32;
    let mut offset = 0u64;
    let mut at = 0u64;
    for (name, dims, blocks) in &tensors {
        string(&mut w, name)?;
        w(&(dims.len() as u32).to_le_bytes())?;
        for d in dims.iter().rev() {
            w(&(*d as u64).to_le_bytes())?;
        }
        w(&blocks.ggml_type.to_le_bytes())?;
        w(&offset.to_le_bytes())?;
        offset = align(offset + blocks.bytes.len() as u64);
    }
    out.flush().map_err(io)?;
    let position = out.stream_position().map_err(io)?;
    out.write_all(&vec![0u8; (align(position) - position) as usize])
        .map_err(io)?;
    for (_, _, blocks) in &tensors {
        out.write_all(&blocks.bytes).map_err(io)?;
        at += blocks.bytes.len() as u64;
        out.write_all(&vec![0u8; (align(at) - at) as usize])
            .map_err(io)?;
        at = align(at);
    }
    out.flush().map_err(io)?;
    Ok(())
}

/// The GGML type number of a candle type.
fn raw_type(dtype: candle_core::quantized::GgmlDType) -> u32 {
    use candle_core::quantized::GgmlDType as T;
    match dtype {
        T::F32 => 0,
        T::F16 => 1,
        T::Q4_0 => 2,
        T::Q4_1 => 3,
        T::Q5_0 => 6,
        T::Q5_1 => 7,
        T::Q8_0 => 8,
        T::Q8_1 => 9,
        T::Q2K => 10,
        T::Q3K => 11,
        T::Q4K => 12,
        T::Q5K => 13,
        T::Q6K => 14,
        T::Q8K => 15,
        T::BF16 => 30,
    }
}

fn string(w: &mut impl FnMut(&[u8]) -> Result<()>, s: &str) -> Result<()> {
    w(&(s.len() as u64).to_le_bytes())?;
    w(s.as_bytes())
}

/// A metadata value, with its type number first where `typed`.
fn value(w: &mut impl FnMut(&[u8]) -> Result<()>, v: &Value, typed: bool) -> Result<()> {
    let (kind, bytes): (u32, Vec<u8>) = match v {
        Value::U8(x) => (0, x.to_le_bytes().to_vec()),
        Value::I8(x) => (1, x.to_le_bytes().to_vec()),
        Value::U16(x) => (2, x.to_le_bytes().to_vec()),
        Value::I16(x) => (3, x.to_le_bytes().to_vec()),
        Value::U32(x) => (4, x.to_le_bytes().to_vec()),
        Value::I32(x) => (5, x.to_le_bytes().to_vec()),
        Value::F32(x) => (6, x.to_le_bytes().to_vec()),
        Value::Bool(x) => (7, vec![u8::from(*x)]),
        Value::String(s) => {
            if typed {
                w(&8u32.to_le_bytes())?;
            }
            return string(w, s);
        }
        Value::Array(items) => {
            if typed {
                w(&9u32.to_le_bytes())?;
            }
            let inner = match items.first() {
                Some(first) => kind_of(first),
                None => 4,
            };
            w(&inner.to_le_bytes())?;
            w(&(items.len() as u64).to_le_bytes())?;
            for item in items {
                value(w, item, false)?;
            }
            return Ok(());
        }
        Value::U64(x) => (10, x.to_le_bytes().to_vec()),
        Value::I64(x) => (11, x.to_le_bytes().to_vec()),
        Value::F64(x) => (12, x.to_le_bytes().to_vec()),
    };
    if typed {
        w(&kind.to_le_bytes())?;
    }
    w(&bytes)
}

/// GGUF's type number of a value.
fn kind_of(v: &Value) -> u32 {
    match v {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::String(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    }
}
