//! The `Tiles16` weight layout: GGUF's 32-value blocks rearranged once, at load, into the order
//! the AVX-512 kernel consumes, so a step reads each block with plain 512-bit loads instead of
//! gathering it from 16 rows. The bytes are the same, only moved: for each tile of 16 weight
//! rows (the last one padded with zero blocks) and each block index, the values come first as
//! "dword j of every row" registers (`chunk j` holds bytes `4j..4j + 4` of each row's packed
//! values, row `c` in 32-bit lane `c`; Q8_0's signed bytes moved to unsigned by +128), then the
//! 16 f16 scales, then (Q4_1) the 16 f16 minimums or (Q5_0) the 16 fifth-bit words.

use super::formats::QuantFormat;

/// Weight rows per tile.
pub const ROWS: usize = 16;

/// Where the parts of one tile block sit, in bytes from its start.
#[derive(Debug, Clone, Copy)]
pub struct TileBlock {
    /// The 16 scales.
    pub scales: usize,
    /// Q4_1's minimums or Q5_0's fifth bits (`usize::MAX` when the format has neither).
    pub extra: usize,
    /// Total bytes (16 GGUF blocks' worth).
    pub bytes: usize,
}

/// Packed value bytes per row in a block, their offset in the GGUF block, and the layout.
fn shape(format: QuantFormat) -> (usize, usize, TileBlock) {
    let (packed, start) = match format {
        QuantFormat::Q4_0 => (16, 2),
        QuantFormat::Q4_1 => (16, 4),
        QuantFormat::Q5_0 => (16, 6),
        QuantFormat::Q8_0 => (32, 2),
        QuantFormat::Q4K | QuantFormat::Q6K => unreachable!("32-value formats only"),
    };
    let chunks = packed / 4;
    let scales = chunks * 64;
    let extra = match format {
        QuantFormat::Q4_1 | QuantFormat::Q5_0 => scales + 32,
        _ => usize::MAX,
    };
    let layout = TileBlock {
        scales,
        extra,
        bytes: ROWS * format.block_bytes(),
    };
    (packed, start, layout)
}

/// The layout of `format`'s tile blocks.
pub fn tile_block(format: QuantFormat) -> TileBlock {
    shape(format).2
}

/// GGUF rows (`n` rows of `k / 32` blocks) to tiles.
pub fn repack(format: QuantFormat, n: usize, k: usize, gguf: &[u8]) -> Vec<u8> {
    let (packed, start, layout) = shape(format);
    let (blocks, bytes) = (k / 32, format.block_bytes());
    let tiles = n.div_ceil(ROWS);
    let mut out = vec![0u8; tiles * blocks * layout.bytes];
    for t in 0..tiles {
        for b in 0..blocks {
            let dst = &mut out[(t * blocks + b) * layout.bytes..][..layout.bytes];
            for c in 0..ROWS.min(n - t * ROWS) {
                let src = &gguf[((t * ROWS + c) * blocks + b) * bytes..][..bytes];
                for j in 0..packed / 4 {
                    let to = &mut dst[64 * j + 4 * c..64 * j + 4 * c + 4];
                    to.copy_from_slice(&src[start + 4 * j..start + 4 * j + 4]);
                    if format == QuantFormat::Q8_0 {
                        to.iter_mut().for_each(|v| *v ^= 0x80);
                    }
                }
                dst[layout.scales + 2 * c..][..2].copy_from_slice(&src[..2]);
                match format {
                    QuantFormat::Q4_1 => {
                        dst[layout.extra + 2 * c..][..2].copy_from_slice(&src[2..4])
                    }
                    QuantFormat::Q5_0 => {
                        dst[layout.extra + 4 * c..][..4].copy_from_slice(&src[2..6])
                    }
                    _ => {}
                }
            }
        }
    }
    out
}

/// Tiles back to GGUF rows (the inverse of `repack`).
pub fn unpack(format: QuantFormat, n: usize, k: usize, tiles: &[u8]) -> Vec<u8> {
    let (packed, start, layout) = shape(format);
    let (blocks, bytes) = (k / 32, format.block_bytes());
    let mut out = vec![0u8; n * blocks * bytes];
    for row in 0..n {
        let (t, c) = (row / ROWS, row % ROWS);
        for b in 0..blocks {
            let src = &tiles[(t * blocks + b) * layout.bytes..][..layout.bytes];
            let dst = &mut out[(row * blocks + b) * bytes..][..bytes];
            for j in 0..packed / 4 {
                let to = &mut dst[start + 4 * j..start + 4 * j + 4];
                to.copy_from_slice(&src[64 * j + 4 * c..64 * j + 4 * c + 4]);
                if format == QuantFormat::Q8_0 {
                    to.iter_mut().for_each(|v| *v ^= 0x80);
                }
            }
            dst[..2].copy_from_slice(&src[layout.scales + 2 * c..][..2]);
            match format {
                QuantFormat::Q4_1 => dst[2..4].copy_from_slice(&src[layout.extra + 2 * c..][..2]),
                QuantFormat::Q5_0 => dst[2..6].copy_from_slice(&src[layout.extra + 4 * c..][..4]),
                _ => {}
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repacking_is_undone_exactly_with_ragged_tiles() {
        for format in [
            QuantFormat::Q4_0,
            QuantFormat::Q4_1,
            QuantFormat::Q5_0,
            QuantFormat::Q8_0,
        ] {
            for (n, k) in [(16, 64), (37, 96), (5, 32)] {
                let len = n * k / 32 * format.block_bytes();
                let gguf: Vec<u8> = (0..len).map(|i| (i * 131 % 251) as u8).collect();
                let tiles = repack(format, n, k, &gguf);
                assert_eq!(
                    tiles.len(),
                    n.div_ceil(ROWS) * (k / 32) * tile_block(format).bytes
                );
                assert_eq!(unpack(format, n, k, &tiles), gguf, "{format:?} [{n}, {k}]");
            }
        }
    }
}
