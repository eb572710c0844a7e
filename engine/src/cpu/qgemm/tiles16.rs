//! The `Tiles16` weight layout: GGUF's 32-value blocks rearranged once, at load, into the order
//! the AVX-512 and AVX2 kernels consume, so a step reads each block with plain 512-bit loads
//! (or, on AVX2, two 256-bit loads: rows 0..8, then rows 8..16) instead of gathering it from 16
//! rows. The bytes are the same, only moved: for each tile of 16 weight rows (the last one
//! padded with zero blocks) and each block index, the values come first as "dword j of every
//! row" registers (`chunk j` holds bytes `4j..4j + 4` of each row's packed values, row `c` in
//! 32-bit lane `c`; Q8_0's signed bytes moved to unsigned by +128), then the 16 f16 scales
//! (MXFP4: the 16 E8M0 bytes), then (Q4_1) the 16 f16 minimums or (Q5_0) the 16 fifth-bit
//! words. The 256-value formats
//! (`super_block`) are laid out the same way per super-block: their packed values as dword
//! registers, then their sub-scales unpacked to one byte per row and sub-block (Q4_K's 6-bit
//! scales and minimums, Q6_K's signed scales), then the f16 scales. Q6_K keeps its size; Q4_K
//! grows by 64 bytes per 2,304 (its 6-bit fields take a byte each).

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
        QuantFormat::Mxfp4 => (16, 1),
        QuantFormat::Q4K | QuantFormat::Q6K => unreachable!("32-value formats: see `super_block`"),
    };
    let chunks = packed / 4;
    let scales = chunks * 64;
    let extra = match format {
        QuantFormat::Q4_1 | QuantFormat::Q5_0 => scales + ROWS * scale_bytes(format),
        _ => usize::MAX,
    };
    let layout = TileBlock {
        scales,
        extra,
        bytes: ROWS * format.block_bytes(),
    };
    (packed, start, layout)
}

/// Bytes of one row's block scale: an f16, or MXFP4's E8M0 byte.
pub fn scale_bytes(format: QuantFormat) -> usize {
    match format {
        QuantFormat::Mxfp4 => 1,
        _ => 2,
    }
}

/// The layout of `format`'s tile blocks.
pub fn tile_block(format: QuantFormat) -> TileBlock {
    shape(format).2
}

/// Where the parts of one 256-value tile block sit, in bytes from its start.
#[derive(Debug, Clone, Copy)]
pub struct SuperBlock {
    /// Dword registers of the low value bits (Q4_K: all 128 packed bytes; Q6_K: `ql`), from 0.
    /// Q6_K's two high bits (`qh`) follow as 16 more registers, at `high`.
    pub high: usize,
    /// One byte per sub-block and row, `[sub-block][row]` (Q4_K: 8 unsigned 6-bit scales;
    /// Q6_K: 16 signed scales).
    pub scales: usize,
    /// Q4_K's 6-bit minimums, `[sub-block][row]` (`usize::MAX` for Q6_K).
    pub mins: usize,
    /// The 16 f16 super-block scales.
    pub d: usize,
    /// Q4_K's 16 f16 minimum scales (`usize::MAX` for Q6_K).
    pub dmin: usize,
    /// Total bytes.
    pub bytes: usize,
}

/// The layout of a 256-value format's tile blocks.
pub fn super_block(format: QuantFormat) -> SuperBlock {
    match format {
        QuantFormat::Q4K => SuperBlock {
            high: usize::MAX,
            scales: 2048,
            mins: 2048 + 128,
            d: 2048 + 256,
            dmin: 2048 + 256 + 32,
            bytes: 2048 + 256 + 64,
        },
        QuantFormat::Q6K => SuperBlock {
            high: 2048,
            scales: 3072,
            mins: usize::MAX,
            d: 3072 + 256,
            dmin: usize::MAX,
            bytes: 3072 + 256 + 32,
        },
        _ => unreachable!("256-value formats only"),
    }
}

/// Bytes of a tile block (16 rows, one block index) of `format`.
pub fn block_bytes(format: QuantFormat) -> usize {
    match format {
        QuantFormat::Q4K | QuantFormat::Q6K => super_block(format).bytes,
        _ => tile_block(format).bytes,
    }
}

/// One GGUF super-block `src` of `format` into row `c` of the tile block `dst`
/// (`into_tile`), or row `c` of the tile block `src` back into the GGUF super-block `dst`.
fn move_super(format: QuantFormat, c: usize, src: &[u8], dst: &mut [u8], into_tile: bool) {
    let layout = super_block(format);
    // Bytes at `gguf` in the GGUF block and at `tile` in the tile block, moved the chosen way.
    let mut copy = |gguf: usize, tile: usize, len: usize| {
        let (from, to) = if into_tile {
            (gguf, tile)
        } else {
            (tile, gguf)
        };
        dst[to..to + len].copy_from_slice(&src[from..from + len]);
    };
    // The packed value dwords, each to its register's lane `c`.
    let (values, high) = match format {
        QuantFormat::Q4K => (16, 0),
        _ => (0, 16),
    };
    for j in 0..32 {
        copy(values + 4 * j, 64 * j + 4 * c, 4);
    }
    for j in 0..high {
        copy(128 + 4 * j, layout.high + 64 * j + 4 * c, 4);
    }
    match format {
        QuantFormat::Q4K => {
            copy(0, layout.d + 2 * c, 2);
            copy(2, layout.dmin + 2 * c, 2);
            if into_tile {
                for j in 0..8 {
                    let (sc, m) = super::formats::q4k_scale_min(j, &src[4..16]);
                    dst[layout.scales + 16 * j + c] = sc;
                    dst[layout.mins + 16 * j + c] = m;
                }
            } else {
                let sc: [u8; 8] = std::array::from_fn(|j| src[layout.scales + 16 * j + c]);
                let m: [u8; 8] = std::array::from_fn(|j| src[layout.mins + 16 * j + c]);
                let q = &mut dst[4..16];
                for j in 0..4 {
                    q[j] = sc[j] | (sc[j + 4] >> 4) << 6;
                    q[j + 4] = m[j] | (m[j + 4] >> 4) << 6;
                    q[j + 8] = (sc[j + 4] & 0x0f) | (m[j + 4] & 0x0f) << 4;
                }
            }
        }
        _ => {
            for g in 0..16 {
                copy(192 + g, layout.scales + 16 * g + c, 1);
            }
            copy(208, layout.d + 2 * c, 2);
        }
    }
}

/// GGUF rows of a 256-value format to tiles (`into_tile`), or back.
fn convert_super(format: QuantFormat, n: usize, k: usize, from: &[u8], into_tile: bool) -> Vec<u8> {
    let (blocks, bytes, tile_bytes) = (k / 256, format.block_bytes(), super_block(format).bytes);
    let mut out = if into_tile {
        vec![0u8; n.div_ceil(ROWS) * blocks * tile_bytes]
    } else {
        vec![0u8; n * blocks * bytes]
    };
    for row in 0..n {
        let (t, c) = (row / ROWS, row % ROWS);
        for b in 0..blocks {
            let tile = (t * blocks + b) * tile_bytes..(t * blocks + b + 1) * tile_bytes;
            let gguf = (row * blocks + b) * bytes..(row * blocks + b + 1) * bytes;
            let (src, dst) = if into_tile {
                (gguf, tile)
            } else {
                (tile, gguf)
            };
            move_super(format, c, &from[src], &mut out[dst], into_tile);
        }
    }
    out
}

/// GGUF rows (`n` rows of `k / 32` blocks, or `k / 256` super-blocks) to tiles.
pub fn repack(format: QuantFormat, n: usize, k: usize, gguf: &[u8]) -> Vec<u8> {
    if format.block_values() == 256 {
        return convert_super(format, n, k, gguf, true);
    }
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
                let sb = scale_bytes(format);
                dst[layout.scales + sb * c..][..sb].copy_from_slice(&src[..sb]);
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
    if format.block_values() == 256 {
        return convert_super(format, n, k, tiles, false);
    }
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
            let sb = scale_bytes(format);
            dst[..sb].copy_from_slice(&src[layout.scales + sb * c..][..sb]);
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
        for format in QuantFormat::ALL {
            let block = format.block_values();
            for (n, k) in [(16, 2 * block), (37, 3 * block), (5, block)] {
                let len = n * k / block * format.block_bytes();
                let gguf: Vec<u8> = (0..len).map(|i| (i * 131 % 251) as u8).collect();
                let tiles = repack(format, n, k, &gguf);
                assert_eq!(
                    tiles.len(),
                    n.div_ceil(ROWS) * (k / block) * block_bytes(format)
                );
                assert_eq!(unpack(format, n, k, &tiles), gguf, "{format:?} [{n}, {k}]");
            }
        }
    }
}
