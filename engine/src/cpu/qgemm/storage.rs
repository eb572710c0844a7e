//! Where a quantized matrix's blocks live (`WeightBytes`): in memory the process owns (read
//! from a file and rearranged at load), or in a read-only file mapping (the prepared-experts
//! file, `model::experts::prepared`), whose pages belong to the OS's page cache: shared by
//! every process that maps the same file, and dropped and read again under memory pressure
//! rather than swapped.

use std::ops::Deref;
use std::sync::Arc;

use memmap2::Mmap;

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
