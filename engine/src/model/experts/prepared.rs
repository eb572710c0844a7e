//! The prepared-experts file (`PreparedExperts`): every stacked expert tensor of a GGUF
//! (`blk.N.ffn_{gate,up,down}_exps`) cut per expert and rearranged into the layout thicket's
//! SIMD kernels read (`tiles16`: the same blocks in the same quantization, moved), written once
//! beside the models and memory-mapped on every load after. An MoE's experts are most of its
//! bytes; mapped, they load in the time the OS takes to map them, live in the page cache
//! (shared by every server process on the host that maps the same file, dropped and read again
//! under memory pressure instead of swapped), and are never copied into the process.
//!
//! The file is named by a hash of the GGUF's path, length and modification time, and its
//! header repeats them: a file written for another GGUF, or for the same path rewritten, is not
//! used but written again. A file that cannot be written or read back (a full disk, a
//! truncated file) is reported and the experts load into memory as without one.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;
use std::sync::Arc;
use std::time::UNIX_EPOCH;

use candle_core::Device;
use memmap2::{Mmap, MmapOptions};
use serde::{Deserialize, Serialize};

use crate::cpu::qgemm::formats::QuantFormat;
use crate::cpu::qgemm::{process_isa, BlockLayout, QuantMatrix, WeightBytes};
use crate::model::gguf_header::Header as GgufHeader;
use crate::{Error, Result};

/// The file's first bytes.
const MAGIC: &[u8; 8] = b"THKEXPRT";
/// Bumped when the file's layout or the kernels' (`tiles16`) changes.
const VERSION: u32 = 1;
/// Tensors start on page boundaries, experts on cache lines.
const PAGE: usize = 4096;
const LINE: usize = 64;

/// Which GGUF a file was prepared from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Source {
    path: String,
    len: u64,
    modified_secs: u64,
    modified_nanos: u32,
}

impl Source {
    fn of(path: &Path) -> Option<Self> {
        let meta = std::fs::metadata(path).ok()?;
        let modified = meta.modified().ok()?.duration_since(UNIX_EPOCH).ok()?;
        let path = std::fs::canonicalize(path).ok()?;
        Some(Self {
            path: path.to_string_lossy().into_owned(),
            len: meta.len(),
            modified_secs: modified.as_secs(),
            modified_nanos: modified.subsec_nanos(),
        })
    }

    /// A name for the prepared file: FNV-1a over what identifies the source (stable across
    /// builds, unlike `DefaultHasher`).
    fn file_name(&self) -> String {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        let key = format!(
            "{}\0{}\0{}\0{}\0{VERSION}",
            self.path, self.len, self.modified_secs, self.modified_nanos
        );
        for byte in key.bytes() {
            hash = (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        format!("experts-v{VERSION}-{hash:016x}.tiles16")
    }
}

/// One stacked tensor in the file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Entry {
    /// `QuantFormat`'s name.
    format: String,
    /// `[experts, rows, cols]`.
    dims: [usize; 3],
    /// Where expert 0 starts.
    offset: usize,
    /// Bytes from one expert to the next.
    stride: usize,
}

#[derive(Debug, Serialize, Deserialize)]
struct Header {
    version: u32,
    source: Source,
    tensors: BTreeMap<String, Entry>,
}

/// A mapped prepared-experts file.
#[derive(Debug)]
pub struct PreparedExperts {
    map: Arc<Mmap>,
    tensors: BTreeMap<String, Entry>,
}

fn format_named(name: &str) -> Option<QuantFormat> {
    QuantFormat::ALL
        .into_iter()
        .find(|f| format!("{f:?}") == name)
}

fn align(n: usize, to: usize) -> usize {
    n.div_ceil(to) * to
}

impl PreparedExperts {
    /// The prepared experts of the GGUF at `gguf` (whose header is `gguf_header`) from `dir`,
    /// written there first if no valid file is there. `None` when the GGUF has no stacked
    /// experts in a format thicket's kernels read, when this CPU's kernels read GGUF's own
    /// layout (nothing to prepare), or when the file can neither be read nor written (then a
    /// warning says why).
    pub fn open_or_prepare(
        dir: &Path,
        gguf: &Path,
        gguf_header: &GgufHeader,
        reader: &mut BufReader<File>,
    ) -> Option<Self> {
        if !process_isa().reads_tiles16() {
            return None;
        }
        let stacked = stacked_tensors(gguf_header);
        if stacked.is_empty() {
            return None;
        }
        let source = Source::of(gguf)?;
        let file = dir.join(source.file_name());
        if let Ok(found) = Self::open(&file, &source) {
            if stacked
                .iter()
                .all(|(name, ..)| found.tensors.contains_key(name))
            {
                return Some(found);
            }
        }
        let started = std::time::Instant::now();
        let written = std::fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("creating {}", dir.display()), e))
            .and_then(|()| write(&file, &source, &stacked, gguf_header, reader))
            .and_then(|()| Self::open(&file, &source));
        match written {
            Ok(prepared) => {
                tracing::info!(
                    "prepared the experts of {} for the SIMD kernels in {:.1}s: {} ({:.1} GiB), mapped from now on",
                    gguf.display(),
                    started.elapsed().as_secs_f64(),
                    file.display(),
                    prepared.map.len() as f64 / f64::from(1u32 << 30)
                );
                Some(prepared)
            }
            Err(e) => {
                tracing::warn!(
                    "could not prepare the experts of {} in {} ({e}); they load into memory instead",
                    gguf.display(),
                    dir.display()
                );
                None
            }
        }
    }

    /// Maps `file`, checked against `source` and its own length.
    fn open(file: &Path, source: &Source) -> Result<Self> {
        let io = |e| Error::io(format!("reading {}", file.display()), e);
        let mut f = File::open(file).map_err(io)?;
        let mut head = [0u8; 16];
        f.read_exact(&mut head).map_err(io)?;
        let bad = |why: &str| Error::Metadata(format!("{}: {why}", file.display()));
        if &head[..8] != MAGIC {
            return Err(bad("not a prepared-experts file"));
        }
        let mut len = [0u8; 8];
        len.copy_from_slice(&head[8..]);
        let len = usize::try_from(u64::from_le_bytes(len)).map_err(|_| bad("header length"))?;
        if len > 64 << 20 {
            return Err(bad("header length"));
        }
        let mut json = vec![0u8; len];
        f.read_exact(&mut json).map_err(io)?;
        let header: Header =
            serde_json::from_slice(&json).map_err(|e| bad(&format!("header: {e}")))?;
        if header.version != VERSION || header.source != *source {
            return Err(bad("prepared from another file or by another version"));
        }
        // SAFETY: the file is opened read-only and only read through the map; thicket writes
        // these files under a temporary name and renames them into place, so a file is never
        // written while mapped by thicket. Another process truncating it would end this one
        // with SIGBUS, as it would any memory-mapped model file.
        let map = unsafe { MmapOptions::new().populate().map(&f).map_err(io)? };
        for (name, e) in &header.tensors {
            let format = format_named(&e.format).ok_or_else(|| bad(name))?;
            let [n, rows, cols] = e.dims;
            let bytes = QuantMatrix::layout_bytes(format, rows, cols, BlockLayout::Tiles16);
            let end = n
                .checked_sub(1)
                .and_then(|last| last.checked_mul(e.stride))
                .and_then(|v| v.checked_add(e.offset + bytes));
            if e.stride < bytes || end.is_none_or(|end| end > map.len()) {
                return Err(bad(&format!("{name} runs past the end")));
            }
        }
        Ok(Self {
            map: Arc::new(map),
            tensors: header.tensors,
        })
    }

    /// The experts of stacked tensor `name`, which the config says is `want` (`[experts,
    /// rows, cols]`): `None` when the file does not hold it, an error naming it when its
    /// shape is not `want`.
    pub fn experts(&self, name: &str, want: [usize; 3]) -> Option<Result<Vec<QuantMatrix>>> {
        let e = self.tensors.get(name)?;
        if e.dims != want {
            return Some(Err(Error::Metadata(format!(
                "tensor {name} has shape {:?}, but the config implies {want:?}",
                e.dims
            ))));
        }
        let format = format_named(&e.format)?;
        let [n, rows, cols] = e.dims;
        let bytes = QuantMatrix::layout_bytes(format, rows, cols, BlockLayout::Tiles16);
        Some(
            (0..n)
                .map(|i| {
                    let data =
                        WeightBytes::mapped(self.map.clone(), e.offset + i * e.stride, bytes)
                            .ok_or_else(|| Error::Metadata(format!("{name}: past the end")))?;
                    QuantMatrix::from_layout(format, rows, cols, BlockLayout::Tiles16, data)
                })
                .collect(),
        )
    }
}

/// The GGUF's stacked expert tensors the kernels read: name, format, `[experts, rows, cols]`
/// (those candle reads, and those only thicket's kernels read: MXFP4).
fn stacked_tensors(gguf: &GgufHeader) -> Vec<(String, QuantFormat, [usize; 3])> {
    let candle_reads = gguf.content.tensor_infos.iter().map(|(name, info)| {
        (
            name,
            QuantFormat::from_ggml(info.ggml_dtype),
            info.shape.dims(),
        )
    });
    let kernels_read = gguf
        .others
        .iter()
        .map(|t| (&t.name, t.format(), t.shape.as_slice()));
    let mut found: Vec<_> = candle_reads
        .chain(kernels_read)
        .filter(|(name, ..)| name.ends_with("_exps.weight"))
        .filter_map(|(name, format, dims)| {
            let format = format?;
            let dims: [usize; 3] = dims.try_into().ok()?;
            (dims[2].is_multiple_of(format.block_values()) && dims.iter().all(|&d| d > 0))
                .then(|| (name.clone(), format, dims))
        })
        .collect();
    found.sort_by(|a, b| a.0.cmp(&b.0));
    found
}

/// Writes the prepared file for `stacked` to `file` (through a temporary file renamed into
/// place, so a reader never sees half of one).
fn write(
    file: &Path,
    source: &Source,
    stacked: &[(String, QuantFormat, [usize; 3])],
    gguf: &GgufHeader,
    reader: &mut BufReader<File>,
) -> Result<()> {
    // Offsets first: the header names them all, and is padded to a page.
    let mut tensors = BTreeMap::new();
    let entries = |start: usize, tensors: &mut BTreeMap<String, Entry>| {
        let mut at = start;
        for (name, format, dims @ [n, rows, cols]) in stacked {
            let bytes = QuantMatrix::layout_bytes(*format, *rows, *cols, BlockLayout::Tiles16);
            let stride = align(bytes, LINE);
            tensors.insert(
                name.clone(),
                Entry {
                    format: format!("{format:?}"),
                    dims: *dims,
                    offset: at,
                    stride,
                },
            );
            at = align(at + n * stride, PAGE);
        }
    };
    // The header's length depends on the offsets' digits: lay them out from a start that
    // leaves room for the longest header they can give.
    entries(0, &mut tensors);
    let json = |tensors: &BTreeMap<String, Entry>| {
        serde_json::to_vec(&Header {
            version: VERSION,
            source: source.clone(),
            tensors: tensors.clone(),
        })
        .map_err(|e| Error::Metadata(format!("prepared-experts header: {e}")))
    };
    let probe = json(&tensors)?;
    let start = align(16 + probe.len() + 64 * (stacked.len() + 1), PAGE);
    entries(start, &mut tensors);
    let header = json(&tensors)?;
    if 16 + header.len() > start {
        return Err(Error::Metadata(
            "prepared-experts header outgrew its room".into(),
        ));
    }
    let temporary = file.with_extension(format!("partial-{}", std::process::id()));
    let io = |e| Error::io(format!("writing {}", temporary.display()), e);
    let result = (|| -> Result<()> {
        let mut out = BufWriter::with_capacity(1 << 20, File::create(&temporary).map_err(io)?);
        out.write_all(MAGIC).map_err(io)?;
        out.write_all(&(header.len() as u64).to_le_bytes())
            .map_err(io)?;
        out.write_all(&header).map_err(io)?;
        let mut at = 16 + header.len();
        let isa = process_isa();
        for (name, format, [n, rows, cols]) in stacked {
            let entry = &tensors[name];
            let data = match gguf.blocks(reader, name) {
                Some(raw) => raw.map_err(Error::Metadata)?.2,
                None => gguf
                    .content
                    .tensor(reader, name, &Device::Cpu)?
                    .data()?
                    .into_owned(),
            };
            let per_expert = rows * cols / format.block_values() * format.block_bytes();
            if data.len() != n * per_expert {
                return Err(Error::Metadata(format!(
                    "tensor {name} holds {} bytes, not {n} experts of {per_expert}",
                    data.len()
                )));
            }
            for (i, blocks) in data.chunks_exact(per_expert).enumerate() {
                let target = entry.offset + i * entry.stride;
                out.write_all(&vec![0u8; target - at]).map_err(io)?;
                let matrix = QuantMatrix::new(*format, *rows, *cols, blocks.to_vec())?.for_isa(isa);
                if matrix.layout() != BlockLayout::Tiles16 {
                    return Err(Error::Metadata("the kernels read GGUF's layout".into()));
                }
                out.write_all(matrix.stored()).map_err(io)?;
                at = target + matrix.stored().len();
            }
        }
        let f = out.into_inner().map_err(|e| io(e.into_error()))?;
        f.sync_all().map_err(io)?;
        drop(f);
        std::fs::rename(&temporary, file).map_err(io)?;
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    result
}
