//! Reading a GGUF file's header: its version, metadata and tensor table, with the same bounds
//! checks as candle's reader, into candle's `Content` for the tensor types candle reads.
//! Unlike candle's reader, a tensor of any other GGML type does not end the read with a bare
//! type number: the header is read whole and the tensor is kept aside by name, type and shape
//! ([`OtherTensor`]). Those of a type thicket's own kernels read (MXFP4) are read as raw
//! blocks where a loader takes them (a mixture's stacked experts, [`Header::blocks`]); of the
//! rest the loader says in one line which tensor thicket cannot read and what it is stored as
//! ([`Header::unreadable`]).

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};

use candle_core::quantized::gguf_file::{Content, TensorInfo, Value, VersionedMagic};
use candle_core::quantized::GgmlDType;

use crate::cpu::qgemm::formats::QuantFormat;

/// Caps on what a header may declare, so a corrupt file is refused before it is allocated for.
const MAX_STRING: u64 = 1 << 26;
const MAX_ELEMENTS: u64 = 1 << 28;
const MAX_DEPTH: usize = 4;
const MAX_DIMS: u32 = 4;
const DEFAULT_ALIGNMENT: u64 = 32;

/// A tensor's format, shape (outermost first) and blocks as the file stores them.
pub type RawBlocks = (QuantFormat, Vec<usize>, Vec<u8>);

/// A tensor whose GGML type candle does not read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtherTensor {
    /// Its name in the file.
    pub name: String,
    /// Its GGML type number.
    pub ggml_type: u32,
    /// Its shape, outermost dimension first.
    pub shape: Vec<usize>,
    /// Where its data starts, from the start of the data section.
    pub offset: u64,
}

/// A GGUF header: what candle's `Content` holds for the readable tensors, and the others.
#[derive(Debug)]
pub struct Header {
    /// Metadata, the readable tensors, and the data section's offset.
    pub content: Content,
    /// Tensors of types thicket does not read, in file order.
    pub others: Vec<OtherTensor>,
}

/// GGML's name for a tensor type number, as llama.cpp prints it.
pub fn ggml_type_name(code: u32) -> Option<&'static str> {
    Some(match code {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        6 => "Q5_0",
        7 => "Q5_1",
        8 => "Q8_0",
        9 => "Q8_1",
        10 => "Q2_K",
        11 => "Q3_K",
        12 => "Q4_K",
        13 => "Q5_K",
        14 => "Q6_K",
        15 => "Q8_K",
        16 => "IQ2_XXS",
        17 => "IQ2_XS",
        18 => "IQ3_XXS",
        19 => "IQ1_S",
        20 => "IQ4_NL",
        21 => "IQ3_S",
        22 => "IQ2_S",
        23 => "IQ4_XS",
        24 => "I8",
        25 => "I16",
        26 => "I32",
        27 => "I64",
        28 => "F64",
        29 => "IQ1_M",
        30 => "BF16",
        34 => "TQ1_0",
        35 => "TQ2_0",
        39 => "MXFP4",
        _ => return None,
    })
}

/// The candle type of a GGML type number, for the types thicket reads.
fn readable(code: u32) -> Option<GgmlDType> {
    Some(match code {
        0 => GgmlDType::F32,
        1 => GgmlDType::F16,
        2 => GgmlDType::Q4_0,
        3 => GgmlDType::Q4_1,
        6 => GgmlDType::Q5_0,
        7 => GgmlDType::Q5_1,
        8 => GgmlDType::Q8_0,
        9 => GgmlDType::Q8_1,
        10 => GgmlDType::Q2K,
        11 => GgmlDType::Q3K,
        12 => GgmlDType::Q4K,
        13 => GgmlDType::Q5K,
        14 => GgmlDType::Q6K,
        15 => GgmlDType::Q8K,
        30 => GgmlDType::BF16,
        _ => return None,
    })
}

impl OtherTensor {
    /// The kernels' format of its type, where thicket's kernels read it (MXFP4).
    pub fn format(&self) -> Option<QuantFormat> {
        QuantFormat::from_ggml_type(self.ggml_type)
    }

    /// Whether a loader takes it: a mixture's stacked experts in a format the kernels read.
    fn taken(&self) -> bool {
        self.format().is_some() && self.name.ends_with("_exps.weight") && self.shape.len() == 3
    }
}

/// How a GGML type is named in a message.
fn type_of(code: u32) -> String {
    match ggml_type_name(code) {
        Some(name) => format!("{name} (GGML type {code})"),
        None => format!("GGML type {code}, which GGML itself does not name"),
    }
}

impl Header {
    /// The one-line refusal of a file with tensors no loader takes: the first by name and
    /// type, how many more there are, and what thicket reads instead.
    pub fn unreadable(&self) -> Option<String> {
        let refused: Vec<&OtherTensor> = self.others.iter().filter(|t| !t.taken()).collect();
        let first = refused.first()?;
        let more = match refused.len() - 1 {
            0 => String::new(),
            1 => " (and 1 more tensor)".to_string(),
            n => format!(" (and {n} more tensors)"),
        };
        let what = format!(
            "tensor '{}' is stored as {}{more}",
            first.name,
            type_of(first.ggml_type)
        );
        if first.format().is_some() {
            return Some(format!(
                "{what}, a type thicket reads only in a mixture's stacked experts (*_exps.weight)"
            ));
        }
        let known: Vec<&str> = (0..64)
            .filter(|&c| readable(c).is_some())
            .filter_map(ggml_type_name)
            .collect();
        Some(format!(
            "{what}, a type thicket cannot read; it reads {}, and MXFP4 experts",
            known.join(", ")
        ))
    }

    /// Whether the file has a tensor `name` of any type.
    pub fn has(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name) || self.others.iter().any(|t| t.name == name)
    }

    /// The tensor `name` kept aside, if it is one a loader takes: its format, its shape
    /// (outermost first) and its blocks as the file stores them.
    pub fn blocks<R: Read + Seek>(
        &self,
        reader: &mut R,
        name: &str,
    ) -> Option<std::result::Result<RawBlocks, String>> {
        let tensor = self.others.iter().find(|t| t.name == name && t.taken())?;
        let format = tensor.format()?;
        let mut read = || -> std::result::Result<Vec<u8>, String> {
            let values: usize = tensor.shape.iter().product();
            let last = tensor.shape.last().copied().unwrap_or(0);
            if !last.is_multiple_of(format.block_values()) {
                return Err(format!(
                    "tensor '{name}': rows of {last} values are not whole {format:?} blocks"
                ));
            }
            let len = values / format.block_values() * format.block_bytes();
            let start = self.content.tensor_data_offset + tensor.offset;
            let end = reader.seek(SeekFrom::End(0)).map_err(io)?;
            if start.saturating_add(len as u64) > end {
                return Err(format!("tensor '{name}' runs past the file's end"));
            }
            reader.seek(SeekFrom::Start(start)).map_err(io)?;
            let mut bytes = vec![0u8; len];
            reader.read_exact(&mut bytes).map_err(io)?;
            Ok(bytes)
        };
        Some(read().map(|bytes| (format, tensor.shape.clone(), bytes)))
    }
}

/// Reads the header from the start of `reader`.
pub fn read<R: Read + Seek>(reader: &mut R) -> std::result::Result<Header, String> {
    let file_size = reader.seek(SeekFrom::End(0)).map_err(io)?;
    reader.seek(SeekFrom::Start(0)).map_err(io)?;
    let mut r = Reader {
        inner: reader,
        file_size,
        wide: true,
    };
    let magic = r.u32()?;
    if magic != 0x4655_4747 && magic != 0x4747_5546 {
        return Err(format!("not a GGUF file (magic 0x{magic:08x})"));
    }
    let magic = match r.u32()? {
        1 => VersionedMagic::GgufV1,
        2 => VersionedMagic::GgufV2,
        3 => VersionedMagic::GgufV3,
        v => {
            return Err(format!(
                "GGUF version {v} is not one thicket reads (1 to 3)"
            ))
        }
    };
    r.wide = !matches!(magic, VersionedMagic::GgufV1);
    let tensor_count = r.length()?;
    let kv_count = r.length()?;
    if tensor_count > MAX_ELEMENTS || kv_count > MAX_ELEMENTS {
        return Err(format!(
            "the header declares {tensor_count} tensors and {kv_count} metadata entries"
        ));
    }
    let mut metadata = HashMap::new();
    for _ in 0..kv_count {
        let key = r.string()?;
        let kind = r.u32()?;
        let value = r
            .value(kind, 0)
            .map_err(|e| format!("metadata '{key}': {e}"))?;
        metadata.insert(key, value);
    }
    let mut tensor_infos = HashMap::new();
    let mut others = Vec::new();
    for _ in 0..tensor_count {
        let name = r.string()?;
        let dims = r.u32()?;
        if dims > MAX_DIMS {
            return Err(format!("tensor '{name}' has {dims} dimensions"));
        }
        let mut shape = (0..dims)
            .map(|_| r.length().map(|d| d as usize))
            .collect::<std::result::Result<Vec<usize>, String>>()?;
        shape.reverse();
        let code = r.u32()?;
        let offset = r.u64()?;
        match readable(code) {
            Some(ggml_dtype) => {
                let info = TensorInfo {
                    ggml_dtype,
                    shape: shape.into(),
                    offset,
                };
                tensor_infos.insert(name, info);
            }
            None => others.push(OtherTensor {
                name,
                ggml_type: code,
                shape,
                offset,
            }),
        }
    }
    let position = r.inner.stream_position().map_err(io)?;
    let alignment = match metadata.get("general.alignment") {
        Some(Value::U8(v)) => u64::from(*v),
        Some(Value::U16(v)) => u64::from(*v),
        Some(Value::U32(v)) => u64::from(*v),
        Some(Value::U64(v)) => *v,
        Some(Value::I32(v)) => u64::try_from(*v).unwrap_or(0),
        _ => DEFAULT_ALIGNMENT,
    }
    .max(1);
    Ok(Header {
        content: Content {
            magic,
            metadata,
            tensor_infos,
            tensor_data_offset: position.div_ceil(alignment) * alignment,
        },
        others,
    })
}

fn io(e: std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::UnexpectedEof => "the file ends inside its header".to_string(),
        _ => e.to_string(),
    }
}

/// Little-endian reads, bounded by what is left of the file.
struct Reader<'a, R> {
    inner: &'a mut R,
    file_size: u64,
    /// Lengths are 64-bit (GGUF v2 and v3) rather than 32-bit (v1).
    wide: bool,
}

impl<R: Read + Seek> Reader<'_, R> {
    fn bytes<const N: usize>(&mut self) -> std::result::Result<[u8; N], String> {
        let mut b = [0u8; N];
        self.inner.read_exact(&mut b).map_err(io)?;
        Ok(b)
    }

    fn u32(&mut self) -> std::result::Result<u32, String> {
        self.bytes().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> std::result::Result<u64, String> {
        self.bytes().map(u64::from_le_bytes)
    }

    fn length(&mut self) -> std::result::Result<u64, String> {
        match self.wide {
            true => self.u64(),
            false => self.u32().map(u64::from),
        }
    }

    fn remaining(&mut self) -> std::result::Result<u64, String> {
        let at = self.inner.stream_position().map_err(io)?;
        Ok(self.file_size.saturating_sub(at))
    }

    fn string(&mut self) -> std::result::Result<String, String> {
        let len = self.length()?;
        if len > MAX_STRING || len > self.remaining()? {
            return Err(format!("a string of {len} bytes runs past the file's end"));
        }
        let mut v = vec![0u8; len as usize];
        self.inner.read_exact(&mut v).map_err(io)?;
        while v.last() == Some(&0) {
            v.pop();
        }
        Ok(String::from_utf8_lossy(&v).into_owned())
    }

    fn value(&mut self, kind: u32, depth: usize) -> std::result::Result<Value, String> {
        Ok(match kind {
            0 => Value::U8(u8::from_le_bytes(self.bytes()?)),
            1 => Value::I8(i8::from_le_bytes(self.bytes()?)),
            2 => Value::U16(u16::from_le_bytes(self.bytes()?)),
            3 => Value::I16(i16::from_le_bytes(self.bytes()?)),
            4 => Value::U32(self.u32()?),
            5 => Value::I32(i32::from_le_bytes(self.bytes()?)),
            6 => Value::F32(f32::from_le_bytes(self.bytes()?)),
            7 => match self.bytes::<1>()?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(format!("a bool of value {b}")),
            },
            8 => Value::String(self.string()?),
            9 if depth < MAX_DEPTH => {
                let inner = self.u32()?;
                let len = self.length()?;
                if len > MAX_ELEMENTS || len > self.remaining()? {
                    return Err(format!("an array of {len} runs past the file's end"));
                }
                let items = (0..len)
                    .map(|_| self.value(inner, depth + 1))
                    .collect::<std::result::Result<Vec<_>, String>>()?;
                Value::Array(items)
            }
            9 => return Err("arrays nested too deep".to_string()),
            10 => Value::U64(self.u64()?),
            11 => Value::I64(i64::from_le_bytes(self.bytes()?)),
            12 => Value::F64(f64::from_le_bytes(self.bytes()?)),
            k => return Err(format!("unknown value type {k}")),
        })
    }
}
