//! The GGUF block formats the quantized matmul reads (Q4_0, Q4_1, Q5_0, Q8_0, MXFP4, Q4_K,
//! Q6_K): their byte layouts, and how one weight row (an output column of the product) is decoded into the
//! two shapes the SIMD kernels consume. A `Block32` row is 32-value blocks of small unsigned
//! (or, for Q8_0 and MXFP4, signed) integers with a float scale and a float offset per block; a
//! `Super256` row is 256-value super-blocks of unsigned integers with an integer scale per 16
//! values, a float scale per super-block and a float offset per 16 values. In both shapes
//! `w = scale * q + offset` holds exactly for every value the format stores. Decoded rows come
//! to the kernels [`TILE`] at a time ([`Block32Tile`], [`Super256Tile`]).

use candle_core::quantized::GgmlDType;

/// A weight format the kernels support.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantFormat {
    /// 32 values: f16 scale, 4-bit values minus 8.
    Q4_0,
    /// 32 values: f16 scale and f16 minimum, 4-bit values.
    Q4_1,
    /// 32 values: f16 scale, 5-bit values minus 16.
    Q5_0,
    /// 32 values: f16 scale, signed 8-bit values.
    Q8_0,
    /// 32 values (OCP microscaling FP4): an E8M0 power-of-two scale, 4-bit E2M1 values
    /// (GGML type 39, which candle does not read).
    Mxfp4,
    /// 256 values: f16 scale and minimum, eight 6-bit sub-scales and sub-minimums, 4-bit values.
    Q4K,
    /// 256 values: f16 scale, sixteen signed 8-bit sub-scales, 6-bit values minus 32.
    Q6K,
}

/// Which kernel shape a format decodes into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// 32-value blocks with float scale and offset.
    Block32,
    /// 256-value super-blocks with 16-value integer sub-scales.
    Super256,
}

impl QuantFormat {
    /// The format of a GGML type number, if the kernels support it (MXFP4 among them).
    pub fn from_ggml_type(code: u32) -> Option<Self> {
        Some(match code {
            2 => Self::Q4_0,
            3 => Self::Q4_1,
            6 => Self::Q5_0,
            8 => Self::Q8_0,
            12 => Self::Q4K,
            14 => Self::Q6K,
            39 => Self::Mxfp4,
            _ => return None,
        })
    }

    /// The format of a candle dtype, if the kernels support it.
    pub fn from_ggml(dtype: GgmlDType) -> Option<Self> {
        Some(match dtype {
            GgmlDType::Q4_0 => Self::Q4_0,
            GgmlDType::Q4_1 => Self::Q4_1,
            GgmlDType::Q5_0 => Self::Q5_0,
            GgmlDType::Q8_0 => Self::Q8_0,
            GgmlDType::Q4K => Self::Q4K,
            GgmlDType::Q6K => Self::Q6K,
            _ => return None,
        })
    }

    /// Every supported format.
    pub const ALL: [QuantFormat; 7] = [
        Self::Q4_0,
        Self::Q4_1,
        Self::Q5_0,
        Self::Q8_0,
        Self::Mxfp4,
        Self::Q4K,
        Self::Q6K,
    ];

    /// The candle dtype, where candle has the format (it has no MXFP4).
    pub fn ggml(self) -> Option<GgmlDType> {
        Some(match self {
            Self::Q4_0 => GgmlDType::Q4_0,
            Self::Q4_1 => GgmlDType::Q4_1,
            Self::Q5_0 => GgmlDType::Q5_0,
            Self::Q8_0 => GgmlDType::Q8_0,
            Self::Q4K => GgmlDType::Q4K,
            Self::Q6K => GgmlDType::Q6K,
            Self::Mxfp4 => return None,
        })
    }

    /// Values per block.
    pub fn block_values(self) -> usize {
        match self.shape() {
            Shape::Block32 => 32,
            Shape::Super256 => 256,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            Self::Q4_0 => 18,
            Self::Q4_1 => 20,
            Self::Q5_0 => 22,
            Self::Q8_0 => 34,
            Self::Mxfp4 => 17,
            Self::Q4K => 144,
            Self::Q6K => 210,
        }
    }

    /// The kernel shape.
    pub fn shape(self) -> Shape {
        match self {
            Self::Q4K | Self::Q6K => Shape::Super256,
            _ => Shape::Block32,
        }
    }

    /// Whether decoded values are signed (Q8_0's and MXFP4's are).
    pub fn signed(self) -> bool {
        matches!(self, Self::Q8_0 | Self::Mxfp4)
    }

    /// Whether the activations' per-block sums are rounded like ggml's Q8_1 (Q4_1 pairs with
    /// Q8_1 activations; the other 32-value formats with Q8_0).
    pub fn q8_1_sums(self) -> bool {
        self == Self::Q4_1
    }
}

/// f16 to f32 for finite values (weights have no infinities or NaNs): the f16 bits shifted
/// into an f32 are the value times 2^-112 exactly, subnormals included. Inlines, unlike a
/// runtime-dispatched conversion, so decoders vectorise around it.
#[inline(always)]
fn f16_at(bytes: &[u8], at: usize) -> f32 {
    let bits = u16::from_le_bytes([bytes[at], bytes[at + 1]]) as u32;
    let magnitude = f32::from_bits((bits & 0x7fff) << 13) * f32::from_bits(0x7780_0000);
    f32::from_bits(((bits & 0x8000) << 16) | magnitude.to_bits())
}

/// MXFP4's sixteen E2M1 codes as integers, twice their value (0, 0.5, 1, 1.5, 2, 3, 4, 6 and
/// their negatives), so that a block's scale is half its E8M0 power of two.
pub const MXFP4_VALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// Half the power of two an E8M0 byte encodes, `2^(e - 128)`, the scale of MXFP4's doubled
/// values; exact for every byte but 255 (E8M0's NaN), the two smallest giving subnormals.
#[inline(always)]
pub fn e8m0_half(e: u8) -> f32 {
    match e {
        0 | 1 => f32::from_bits(0x0020_0000 << e),
        e => f32::from_bits(u32::from(e - 1) << 23),
    }
}

/// One decoded `Block32` row: `w[i] = scale[i / 32] * q[i] + offset[i / 32]`.
pub struct Block32Row<'a> {
    /// `k` values, unsigned (or two's-complement signed for Q8_0).
    pub q: &'a mut [u8],
    /// Per block.
    pub scale: &'a mut [f32],
    /// Per block.
    pub offset: &'a mut [f32],
}

/// Decodes one row of `Block32`-shaped blocks.
#[inline(always)]
pub fn decode_block32(format: QuantFormat, raw: &[u8], row: Block32Row<'_>) {
    match format {
        QuantFormat::Q4_0 => decode_32::<18>(raw, row, |block, q| {
            unpack_nibbles(&block[2..18], q);
            let d = f16_at(block, 0);
            (d, -8.0 * d)
        }),
        QuantFormat::Q4_1 => decode_32::<20>(raw, row, |block, q| {
            unpack_nibbles(&block[4..20], q);
            (f16_at(block, 0), f16_at(block, 2))
        }),
        QuantFormat::Q5_0 => decode_32::<22>(raw, row, |block, q| {
            let high = u32::from_le_bytes([block[2], block[3], block[4], block[5]]);
            unpack_nibbles(&block[6..22], q);
            for (j, v) in q.iter_mut().enumerate() {
                *v |= (((high >> j) & 1) as u8) << 4;
            }
            let d = f16_at(block, 0);
            (d, -16.0 * d)
        }),
        QuantFormat::Q8_0 => decode_32::<34>(raw, row, |block, q| {
            q.copy_from_slice(&block[2..34]);
            (f16_at(block, 0), 0.0)
        }),
        QuantFormat::Mxfp4 => decode_32::<17>(raw, row, |block, q| {
            let mut codes = [0u8; 32];
            unpack_nibbles(&block[1..17], &mut codes);
            for (v, &code) in q.iter_mut().zip(&codes) {
                *v = MXFP4_VALUES[usize::from(code)] as u8;
            }
            (e8m0_half(block[0]), 0.0)
        }),
        QuantFormat::Q4K | QuantFormat::Q6K => unreachable!("super-block format"),
    }
}

/// Runs `block` (raw block, 32 values out -> scale and offset) over a row of `BYTES`-byte
/// blocks.
#[inline(always)]
fn decode_32<const BYTES: usize>(
    raw: &[u8],
    row: Block32Row<'_>,
    block: impl Fn(&[u8; BYTES], &mut [u8; 32]) -> (f32, f32),
) {
    let blocks = raw.chunks_exact(BYTES).zip(row.q.chunks_exact_mut(32));
    for ((raw, q), (scale, offset)) in blocks.zip(row.scale.iter_mut().zip(row.offset.iter_mut())) {
        let (raw, q) = (
            <&[u8; BYTES]>::try_from(raw).expect("chunks_exact"),
            <&mut [u8; 32]>::try_from(q).expect("chunks_exact"),
        );
        (*scale, *offset) = block(raw, q);
    }
}

/// Low nibbles to values 0..16, high nibbles to 16..32 (ggml's order).
#[inline(always)]
fn unpack_nibbles(packed: &[u8], q: &mut [u8; 32]) {
    let (low, high) = q.split_at_mut(16);
    for ((l, h), &p) in low.iter_mut().zip(high).zip(packed) {
        *l = p & 0x0f;
        *h = p >> 4;
    }
}

/// One decoded `Super256` row: `w[i] = d[i / 256] * sub[i / 16] * q[i] + offset[i / 16]`,
/// with the integer sub-scales repeated once per value pair (`sub_pairs[i / 2]`), the layout
/// the kernels' 16-bit multiply-add reads directly.
pub struct Super256Row<'a> {
    /// `k` unsigned values.
    pub q: &'a mut [u8],
    /// `k / 2` sub-scales, each repeated over its 8 value pairs.
    pub sub_pairs: &'a mut [i16],
    /// Per super-block.
    pub d: &'a mut [f32],
    /// Per 16 values.
    pub offset: &'a mut [f32],
}

/// Decodes one row of `Super256`-shaped blocks.
#[inline(always)]
pub fn decode_super256(format: QuantFormat, raw: &[u8], row: Super256Row<'_>) {
    let bytes = format.block_bytes();
    for (b, block) in raw.chunks_exact(bytes).enumerate() {
        let q = &mut row.q[b * 256..(b + 1) * 256];
        let mut sub = [0i16; 16];
        let offset = &mut row.offset[b * 16..(b + 1) * 16];
        match format {
            QuantFormat::Q4K => {
                let d = f16_at(block, 0);
                let dmin = f16_at(block, 2);
                let scales = &block[4..16];
                let qs = &block[16..144];
                for chunk in 0..4 {
                    let packed = &qs[chunk * 32..(chunk + 1) * 32];
                    let out = &mut q[chunk * 64..(chunk + 1) * 64];
                    let (low, high) = out.split_at_mut(32);
                    for ((l, h), &p) in low.iter_mut().zip(high).zip(packed) {
                        *l = p & 0x0f;
                        *h = p >> 4;
                    }
                }
                for j in 0..8 {
                    let (sc, m) = q4k_scale_min(j, scales);
                    sub[2 * j] = sc as i16;
                    sub[2 * j + 1] = sc as i16;
                    offset[2 * j] = -dmin * m as f32;
                    offset[2 * j + 1] = -dmin * m as f32;
                }
                row.d[b] = d;
            }
            QuantFormat::Q6K => {
                let ql = &block[0..128];
                let qh = &block[128..192];
                let d = f16_at(block, 208);
                for half in 0..2 {
                    let ql = &ql[half * 64..(half + 1) * 64];
                    let qh = &qh[half * 32..(half + 1) * 32];
                    let out = &mut q[half * 128..(half + 1) * 128];
                    for l in 0..32 {
                        out[l] = (ql[l] & 0x0f) | ((qh[l] & 3) << 4);
                        out[l + 32] = (ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4);
                        out[l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
                        out[l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
                    }
                }
                for (g, s) in sub.iter_mut().enumerate() {
                    *s = block[192 + g] as i8 as i16;
                    offset[g] = -32.0 * d * *s as f32;
                }
                row.d[b] = d;
            }
            _ => unreachable!("32-value block format"),
        }
        let pairs = &mut row.sub_pairs[b * 128..(b + 1) * 128];
        for (g, s) in sub.iter().enumerate() {
            pairs[g * 8..(g + 1) * 8].fill(*s);
        }
    }
}

/// ggml's packing of Q4_K's eight 6-bit scales and minimums into 12 bytes.
pub(super) fn q4k_scale_min(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Weight rows per kernel call.
pub const TILE: usize = 4;

/// Where one weight row is decoded to.
pub enum DecodedRow<'a> {
    /// A `Block32` format's row.
    Block32(Block32Row<'a>),
    /// A `Super256` format's row.
    Super256(Super256Row<'a>),
}

/// Decodes one weight row with the portable code.
#[inline(always)]
pub(super) fn decode(format: QuantFormat, raw: &[u8], row: DecodedRow<'_>) {
    match row {
        DecodedRow::Block32(row) => decode_block32(format, raw, row),
        DecodedRow::Super256(row) => decode_super256(format, raw, row),
    }
}

/// A tile of four decoded `Block32` rows: `q` is `[4][k]`, `scale` is `[4][k / 32]`.
#[derive(Clone, Copy)]
pub struct Block32Tile<'a> {
    /// Values.
    pub q: &'a [u8],
    /// Block scales.
    pub scale: &'a [f32],
    /// Whether values are signed.
    pub signed: bool,
}

/// A tile of four decoded `Super256` rows: `q` is `[4][k]`, `sub_pairs` is `[4][k / 2]`,
/// `d` is `[4][k / 256]`.
#[derive(Clone, Copy)]
pub struct Super256Tile<'a> {
    /// Values.
    pub q: &'a [u8],
    /// Sub-scales repeated per value pair.
    pub sub_pairs: &'a [i16],
    /// Super-block scales.
    pub d: &'a [f32],
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::QTensor;
    use candle_core::{Device, Tensor};

    /// Decoded rows reproduce candle's dequantization of every format.
    #[test]
    fn decoding_matches_candle_dequantize() {
        let (n, k) = (3, 512);
        let values: Vec<f32> = (0..n * k)
            .map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * (1.0 + (i % 13) as f32))
            .collect();
        let dense = Tensor::from_vec(values, (n, k), &Device::Cpu).unwrap();
        for format in QuantFormat::ALL {
            // MXFP4 is checked against llama.cpp's dequantization instead (candle has none).
            let Some(dtype) = format.ggml() else { continue };
            let q = QTensor::quantize(&dense, dtype).unwrap();
            let want: Vec<f32> = q
                .dequantize(&Device::Cpu)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            let raw = q.data().unwrap();
            let row_bytes = k / format.block_values() * format.block_bytes();
            for r in 0..n {
                let raw = &raw[r * row_bytes..(r + 1) * row_bytes];
                let mut qv = vec![0u8; k];
                let got: Vec<f32> = match format.shape() {
                    Shape::Block32 => {
                        let (mut s, mut o) = (vec![0.0; k / 32], vec![0.0; k / 32]);
                        decode_block32(
                            format,
                            raw,
                            Block32Row {
                                q: &mut qv,
                                scale: &mut s,
                                offset: &mut o,
                            },
                        );
                        (0..k)
                            .map(|i| {
                                let v = if format.signed() {
                                    qv[i] as i8 as f32
                                } else {
                                    qv[i] as f32
                                };
                                s[i / 32] * v + o[i / 32]
                            })
                            .collect()
                    }
                    Shape::Super256 => {
                        let (mut p, mut d, mut o) =
                            (vec![0; k / 2], vec![0.0; k / 256], vec![0.0; k / 16]);
                        decode_super256(
                            format,
                            raw,
                            Super256Row {
                                q: &mut qv,
                                sub_pairs: &mut p,
                                d: &mut d,
                                offset: &mut o,
                            },
                        );
                        (0..k)
                            .map(|i| d[i / 256] * p[i / 2] as f32 * qv[i] as f32 + o[i / 16])
                            .collect()
                    }
                };
                for (i, (a, b)) in got.iter().zip(&want[r * k..(r + 1) * k]).enumerate() {
                    assert!(
                        (a - b).abs() <= 1e-5 * b.abs().max(1.0),
                        "{format:?} row {r} value {i}: decoded {a}, candle {b}"
                    );
                }
            }
        }
    }

    /// MXFP4 blocks decode to llama.cpp's dequantization bit for bit (gguf-py's, written by
    /// `scripts/mxfp4-reference.py`): blocks it quantized, and every scale byte with every code.
    #[test]
    fn mxfp4_decodes_as_llama_cpp_dequantizes() {
        let reference: serde_json::Value =
            serde_json::from_str(include_str!("../../../../tests/data/mxfp4_gguf_py.json"))
                .unwrap();
        let hex = reference["blocks"].as_str().unwrap();
        let raw: Vec<u8> = (0..hex.len() / 2)
            .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
            .collect();
        let want: Vec<u32> = reference["values"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let blocks = raw.len() / 17;
        assert_eq!(blocks, 64 + 255);
        assert_eq!(want.len(), blocks * 32);
        let k = blocks * 32;
        let (mut q, mut scale, mut offset) = (vec![0u8; k], vec![0f32; blocks], vec![0f32; blocks]);
        let row = Block32Row {
            q: &mut q,
            scale: &mut scale,
            offset: &mut offset,
        };
        decode_block32(QuantFormat::Mxfp4, &raw, row);
        for (i, &bits) in want.iter().enumerate() {
            assert_eq!(offset[i / 32], 0.0);
            let got = scale[i / 32] * f32::from(q[i] as i8);
            assert_eq!(
                got.to_bits(),
                bits,
                "value {i} (block {}, scale byte {}): {got} vs llama.cpp's {}",
                i / 32,
                raw[i / 32 * 17],
                f32::from_bits(bits)
            );
        }
    }
}
