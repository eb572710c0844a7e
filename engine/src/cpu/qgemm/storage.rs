//! Where a quantized matrix's blocks live (`WeightBytes`): in memory the process owns (read
//! from a file and rearranged at load), or in a read-only file mapping (the prepared-experts
//! file, `model::experts::prepared`), whose pages belong to the OS's page cache: shared by
//! every process that maps the same file, and dropped and read again under memory pressure
//! rather than swapped; and the `QuantMatrix` constructors and accessors that take and give
//! its stored bytes as they are, or its values as floats.

use std::ops::Deref;
use std::sync::Arc;

use memmap2::Mmap;

use super::formats::{self, Block32Row, QuantFormat, Shape, Super256Row};
use super::{tiles16, BlockLayout, QuantMatrix, TILE};
use crate::{Error, Result};

/// A matrix's blocks, in whichever `BlockLayout` the matrix says.
#[derive(Debug, Clone)]
pub enum WeightBytes {
    /// Bytes the process owns.
    Owned(Vec<u8>),
    /// `len` bytes of a mapped file from `start`.
    Mapped {
        /// The mapping (shared by every matrix in the file).
        map: Arc<Mmap>,
        /// First byte.
        start: usize,
        /// Bytes.
        len: usize,
    },
}

impl WeightBytes {
    /// `len` bytes of `map` from `start`; `None` when they run past its end.
    pub fn mapped(map: Arc<Mmap>, start: usize, len: usize) -> Option<Self> {
        (start.checked_add(len)? <= map.len()).then_some(Self::Mapped { map, start, len })
    }

    /// Whether the bytes are in a file mapping.
    pub fn is_mapped(&self) -> bool {
        matches!(self, Self::Mapped { .. })
    }
}

impl Deref for WeightBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Self::Owned(bytes) => bytes,
            Self::Mapped { map, start, len } => &map[*start..*start + *len],
        }
    }
}

impl QuantMatrix {
    /// A matrix whose blocks are already in `layout` (as `stored` gave them); an error when
    /// `data` is not the size that layout takes.
    pub fn from_layout(
        format: QuantFormat,
        n: usize,
        k: usize,
        layout: BlockLayout,
        data: WeightBytes,
    ) -> Result<Self> {
        let block = format.block_values();
        if n == 0 || k == 0 || !k.is_multiple_of(block) {
            return Err(Error::Metadata(format!(
                "{format:?} weight [{n}, {k}]: not whole blocks"
            )));
        }
        let want = Self::layout_bytes(format, n, k, layout);
        if data.len() != want {
            return Err(Error::Metadata(format!(
                "{format:?} weight [{n}, {k}] in {layout:?} layout with {} bytes, not {want}",
                data.len()
            )));
        }
        Ok(Self {
            format,
            n,
            k,
            layout,
            data,
        })
    }

    /// Bytes an `[n, k]` matrix of `format` takes in `layout`.
    pub fn layout_bytes(format: QuantFormat, n: usize, k: usize, layout: BlockLayout) -> usize {
        let blocks = k / format.block_values();
        match layout {
            BlockLayout::Gguf => n * blocks * format.block_bytes(),
            BlockLayout::Tiles16 => n.div_ceil(TILE) * blocks * tiles16::block_bytes(format),
        }
    }

    /// The blocks as they are stored, in `layout()` (what `from_layout` takes back).
    pub fn stored(&self) -> &[u8] {
        &self.data
    }

    /// Every value as a float, `[n][k]` (for a dense copy where a device or dtype has no
    /// kernel of this format).
    pub fn dequantize(&self) -> Result<Vec<f32>> {
        let (n, k) = (self.n, self.k);
        let gguf = self.gguf();
        let row_bytes = k / self.format.block_values() * self.format.block_bytes();
        let mut out = vec![0f32; n * k];
        let mut q = vec![0u8; k];
        for (raw, values) in gguf.chunks_exact(row_bytes).zip(out.chunks_exact_mut(k)) {
            match self.format.shape() {
                Shape::Block32 => {
                    let (mut scale, mut offset) = (vec![0f32; k / 32], vec![0f32; k / 32]);
                    let row = Block32Row {
                        q: &mut q,
                        scale: &mut scale,
                        offset: &mut offset,
                    };
                    formats::decode_block32(self.format, raw, row);
                    for (i, v) in values.iter_mut().enumerate() {
                        let code = match self.format.signed() {
                            true => f32::from(q[i] as i8),
                            false => f32::from(q[i]),
                        };
                        *v = scale[i / 32] * code + offset[i / 32];
                    }
                }
                Shape::Super256 => {
                    let mut sub_pairs = vec![0i16; k / 2];
                    let (mut d, mut offset) = (vec![0f32; k / 256], vec![0f32; k / 16]);
                    let row = Super256Row {
                        q: &mut q,
                        sub_pairs: &mut sub_pairs,
                        d: &mut d,
                        offset: &mut offset,
                    };
                    formats::decode_super256(self.format, raw, row);
                    for (i, v) in values.iter_mut().enumerate() {
                        let scale = d[i / 256] * f32::from(sub_pairs[i / 2]);
                        *v = scale * f32::from(q[i]) + offset[i / 16];
                    }
                }
            }
        }
        if out.iter().any(|v| !v.is_finite()) {
            return Err(Error::Metadata(format!(
                "{:?} weight [{n}, {k}] holds values past f32's range",
                self.format
            )));
        }
        Ok(out)
    }

    /// Whether the blocks are read from a file mapping rather than owned.
    pub fn is_mapped(&self) -> bool {
        self.data.is_mapped()
    }
}
