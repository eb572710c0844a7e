//! The inner products: one activation row against a tile of four decoded weight rows, in each
//! instruction set the machine may have (portable Rust, AVX2, AVX-512 with VNNI). Integer dot
//! products are exact; only the order of the float accumulation differs between instruction
//! sets, and within one set a row's arithmetic never depends on the other rows or columns of
//! the product, so results are batch invariant.

use std::sync::OnceLock;

use super::formats::{decode, Block32Tile, DecodedRow, QuantFormat, Super256Tile, TILE};

/// Instruction sets the kernels come in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// Plain Rust, any CPU.
    Portable,
    /// AVX2, FMA and F16C.
    Avx2,
    /// AVX-512 F/BW/VL/DQ with VNNI.
    Avx512,
    /// AVX-512 VNNI plus AMX int8 tiles (granted by the OS) for products of two or more rows
    /// in the 32-value formats; everything else as `Avx512`. Opt-in (`THICKET_ISA=amx`): it
    /// measured no faster than `Avx512` (`benches/README.md`).
    Amx,
}

impl Isa {
    /// The best set this CPU supports.
    /// (AMX is never chosen by itself: see `Isa::Amx`.)
    pub fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512dq")
                && is_x86_feature_detected!("avx512vnni")
                && is_x86_feature_detected!("f16c")
            {
                return Self::Avx512;
            }
            if is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c")
            {
                return Self::Avx2;
            }
        }
        Self::Portable
    }

    /// Every set this CPU can run, best last.
    pub fn available() -> Vec<Self> {
        [Self::Portable, Self::Avx2, Self::Avx512, Self::Amx]
            .into_iter()
            .filter(|isa| isa.runs_here())
            .collect()
    }

    /// Whether this CPU (and OS, for AMX) can run this set.
    pub fn runs_here(self) -> bool {
        static BEST: OnceLock<Isa> = OnceLock::new();
        let best = *BEST.get_or_init(|| {
            let best = Self::detect();
            #[cfg(target_arch = "x86_64")]
            if best == Self::Avx512 && super::amx::available() {
                return Self::Amx;
            }
            best
        });
        self as u8 <= best as u8
    }

    /// Whether the AVX-512 kernels (and the `Tiles16` layout) run in this set.
    pub fn has_avx512(self) -> bool {
        matches!(self, Self::Avx512 | Self::Amx)
    }

    /// Whether this set's kernels read the `Tiles16` layout (AVX2 and AVX-512 do; the portable
    /// kernels read GGUF blocks).
    pub fn reads_tiles16(self) -> bool {
        matches!(self, Self::Avx2 | Self::Avx512 | Self::Amx)
    }

    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Portable => "portable",
            Self::Avx2 => "avx2",
            Self::Avx512 => "avx512",
            Self::Amx => "amx",
        }
    }
}

/// Decodes one weight row with code compiled for `isa`.
pub fn decode_row(isa: Isa, format: QuantFormat, raw: &[u8], row: DecodedRow<'_>) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::detect` only returns a set the CPU has.
        Isa::Avx2 => unsafe { super::x86::decode_avx2(format, raw, row) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx512 | Isa::Amx => unsafe { super::x86::decode_avx512(format, raw, row) },
        _ => decode(format, raw, row),
    }
}

/// `sum_b scale[c][b] * xd[b] * dot(q[c] block b, xq block b)` for the four rows `c`.
pub fn block32_dot4(isa: Isa, tile: Block32Tile<'_>, xq: &[i8], xd: &[f32]) -> [f32; TILE] {
    let k = xq.len();
    debug_assert_eq!(tile.q.len(), TILE * k);
    debug_assert_eq!(tile.scale.len(), TILE * k / 32);
    match isa {
        // AVX-512 machines multiply these formats in `avx512_block32`, never through here.
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::detect` only returns a set the CPU has (AVX-512 implies AVX2); lengths
        // checked above.
        Isa::Avx2 | Isa::Avx512 | Isa::Amx => unsafe {
            if tile.signed {
                super::x86::block32_dot4_avx2::<true>(tile, xq, xd)
            } else {
                super::x86::block32_dot4_avx2::<false>(tile, xq, xd)
            }
        },
        _ => block32_dot4_portable(tile, xq, xd),
    }
}

/// `sum_s d[c][s] * xd[s] * sum_g sub[c][g] * dot(q[c] group g, xq group g)` for the four rows.
pub fn super256_dot4(isa: Isa, tile: Super256Tile<'_>, xq: &[i8], xd: &[f32]) -> [f32; TILE] {
    let k = xq.len();
    debug_assert_eq!(tile.q.len(), TILE * k);
    debug_assert_eq!(tile.sub_pairs.len(), TILE * k / 2);
    debug_assert_eq!(tile.d.len(), TILE * k / 256);
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::detect` only returns a set the CPU has; lengths checked above.
        Isa::Avx2 => unsafe { super::x86::super256_dot4_avx2(tile, xq, xd) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx512 | Isa::Amx => unsafe { super::x86::super256_dot4_avx512(tile, xq, xd) },
        _ => super256_dot4_portable(tile, xq, xd),
    }
}

fn block32_dot4_portable(tile: Block32Tile<'_>, xq: &[i8], xd: &[f32]) -> [f32; TILE] {
    let k = xq.len();
    let nb = k / 32;
    let mut out = [0f32; TILE];
    for (c, acc) in out.iter_mut().enumerate() {
        let q = &tile.q[c * k..(c + 1) * k];
        let scale = &tile.scale[c * nb..(c + 1) * nb];
        for b in 0..nb {
            let (w, x) = (&q[b * 32..(b + 1) * 32], &xq[b * 32..(b + 1) * 32]);
            let dot: i32 = if tile.signed {
                w.iter()
                    .zip(x)
                    .map(|(&w, &x)| w as i8 as i32 * x as i32)
                    .sum()
            } else {
                w.iter().zip(x).map(|(&w, &x)| w as i32 * x as i32).sum()
            };
            *acc += scale[b] * xd[b] * dot as f32;
        }
    }
    out
}

fn super256_dot4_portable(tile: Super256Tile<'_>, xq: &[i8], xd: &[f32]) -> [f32; TILE] {
    let k = xq.len();
    let ns = k / 256;
    let mut out = [0f32; TILE];
    for (c, acc) in out.iter_mut().enumerate() {
        let q = &tile.q[c * k..(c + 1) * k];
        let pairs = &tile.sub_pairs[c * k / 2..(c + 1) * k / 2];
        for (s, &dx) in xd.iter().enumerate().take(ns) {
            let mut isum = 0i32;
            for g in 0..16 {
                let at = s * 256 + g * 16;
                let dot: i32 = q[at..at + 16]
                    .iter()
                    .zip(&xq[at..at + 16])
                    .map(|(&w, &x)| w as i32 * x as i32)
                    .sum();
                isum += pairs[at / 2] as i32 * dot;
            }
            *acc += tile.d[c * ns + s] * dx * isum as f32;
        }
    }
    out
}
