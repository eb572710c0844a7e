//! The AMX int8 kernel for the 32-value formats (Intel Sapphire Rapids and later): the same
//! `tiles16` weights and the same float epilogue as the AVX-512 VNNI kernel, with the integer
//! block products done by tile instructions. Per block of a tile, up to 16 activation rows (tile
//! A, signed bytes straight from the quantized activations) meet the tile's 16 weight rows
//! (tile B: the block's eight "4 values of every row" chunks, which is exactly the VNNI layout
//! AMX reads, unpacked to unsigned bytes) in one `tdpbsud`; the exact `[16 x 16]` int32 result
//! goes through the AVX-512 epilogue in the VNNI kernel's order (scale product, fused
//! multiply-adds for the block and its offset), so every output is bit-identical to the VNNI
//! path's for every row count.
//!
//! The tile state needs the kernel's permission (Linux `arch_prctl(ARCH_REQ_XCOMP_PERM)`),
//! asked once per process in `available`; where it is refused, or the CPU or OS lacks AMX,
//! `available` says no and the VNNI kernel runs instead. Each thread loads its tile
//! configuration when it first multiplies, and again only when the row count changes.

use std::arch::asm;
use std::arch::x86_64::*;
use std::cell::Cell;
use std::sync::OnceLock;

use super::activations::QuantizedRows;
use super::avx512_block32::{offsets, scales, unpack, COLUMNS};
use super::formats::QuantFormat;
use super::tiles16;

/// Activation rows per tile product (the most a tile holds).
const ROWS: usize = 16;

/// Whether this process may multiply with AMX int8 tiles: the CPU has AMX-TILE and AMX-INT8
/// (CPUID leaf 7), the OS saves the tile state (XCR0 bits 17 and 18), and the kernel granted
/// this process the tile data (asked once).
pub fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| cpu_has_amx() && permission_granted())
}

fn cpu_has_amx() -> bool {
    // CPUID is on every x86-64 CPU; leaf 7 is read only when the CPU reports it.
    let (max_leaf, osxsave) = (__cpuid(0).eax, __cpuid(1).ecx & (1 << 27) != 0);
    if max_leaf < 7 || !osxsave || !is_x86_feature_detected!("avx512vnni") {
        return false;
    }
    let edx = __cpuid_count(7, 0).edx;
    let (tile, int8) = (edx & (1 << 24) != 0, edx & (1 << 25) != 0);
    // SAFETY: XGETBV exists where CPUID reports OSXSAVE (checked above).
    let xcr0 = unsafe { xcr0() };
    tile && int8 && xcr0 & (0b11 << 17) == 0b11 << 17
}

#[target_feature(enable = "xsave")]
unsafe fn xcr0() -> u64 {
    _xgetbv(0)
}

#[cfg(target_os = "linux")]
fn permission_granted() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: a plain system call with integer arguments; it only changes what this process
    // may use.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        )
    };
    rc == 0
}

#[cfg(not(target_os = "linux"))]
fn permission_granted() -> bool {
    false
}

/// The 64-byte tile configuration (palette 1): tile 0 the `[rows x 16]` int32 result, tile 1
/// the `[rows x 32]` activation bytes, tile 2 the `[8 x 64]` weight bytes; tiles 3-5 the same
/// again.
#[repr(C, align(64))]
struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    column_bytes: [u16; 16],
    rows: [u8; 16],
}

impl TileConfig {
    fn for_rows(rows: usize) -> Self {
        let mut config = Self {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            column_bytes: [0; 16],
            rows: [0; 16],
        };
        // Two sets (tiles 0-2 and 3-5), so consecutive blocks overlap.
        config.column_bytes[..6].copy_from_slice(&[64, 32, 64, 64, 32, 64]);
        let r = rows as u8;
        config.rows[..6].copy_from_slice(&[r, r, 8, r, r, 8]);
        config
    }
}

thread_local! {
    /// The row count this thread's tiles are configured for (0: not configured).
    static CONFIGURED: Cell<usize> = const { Cell::new(0) };
}

/// Configures this thread's tiles for `rows` activation rows, unless they already are.
///
/// # Safety
/// `available()` must be true.
unsafe fn configure(rows: usize) {
    CONFIGURED.with(|configured| {
        if configured.get() != rows {
            let config = TileConfig::for_rows(rows);
            asm!("ldtilecfg [{}]", in(reg) &config as *const TileConfig, options(nostack, readonly));
            configured.set(rows);
        }
    });
}

#[repr(C, align(64))]
struct Aligned<T>(T);

/// One tile of 16 weight rows (`tiles16` layout) against every row `r` of `rows`, each row's
/// 16 results given to `store(r, values)`, bit-identical to `avx512_block32::tile`.
///
/// # Safety
/// `available()` must be true (which implies the AVX-512 features the epilogue uses). `tile`
/// must hold the tile's blocks for `rows.k` values.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub unsafe fn tile(
    format: QuantFormat,
    tile: &[u8],
    rows: &QuantizedRows,
    store: &mut impl FnMut(usize, &[f32; COLUMNS]),
) {
    let k = rows.k;
    let m = rows.q.len() / k;
    let layout = tiles16::tile_block(format);
    assert!(tile.len() >= k / 32 * layout.bytes);
    let mut first = 0;
    while first < m {
        let n = (m - first).min(ROWS);
        configure(n);
        group(format, tile.as_ptr(), rows, first, n, store);
        first += n;
    }
}

/// Block `b`'s integer products of rows `first..` against the tile into `dots`, in tile set
/// `b % 2` (tiles 0-2 or 3-5), unpacking the weights through `weights` where needed.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn issue(
    format: QuantFormat,
    tile: *const u8,
    rows: &QuantizedRows,
    first: usize,
    b: usize,
    weights: &mut Aligned<[u8; 8 * 64]>,
    dots: &mut Aligned<[i32; ROWS * COLUMNS]>,
) {
    let k = rows.k;
    let layout = tiles16::tile_block(format);
    let base = tile.add(b * layout.bytes);
    // Q8_0's tile block already holds its eight chunks as unsigned bytes, 64 apart.
    let chunks = if format == QuantFormat::Q8_0 {
        base
    } else {
        for (j, chunk) in unpack(format, base, layout).iter().enumerate() {
            _mm512_store_si512(weights.0.as_mut_ptr().add(64 * j) as *mut __m512i, *chunk);
        }
        weights.0.as_ptr()
    };
    let x = rows.q.as_ptr().add(first * k + b * 32);
    if b.is_multiple_of(2) {
        asm!(
            "tilezero tmm0",
            "tileloadd tmm1, [{x} + {stride}*1]",
            "tileloadd tmm2, [{w} + {sixty_four}*1]",
            "tdpbsud tmm0, tmm1, tmm2",
            "tilestored [{dots} + {sixty_four}*1], tmm0",
            x = in(reg) x,
            stride = in(reg) k,
            w = in(reg) chunks,
            sixty_four = in(reg) 64usize,
            dots = in(reg) dots.0.as_mut_ptr(),
            options(nostack),
        );
    } else {
        asm!(
            "tilezero tmm3",
            "tileloadd tmm4, [{x} + {stride}*1]",
            "tileloadd tmm5, [{w} + {sixty_four}*1]",
            "tdpbsud tmm3, tmm4, tmm5",
            "tilestored [{dots} + {sixty_four}*1], tmm3",
            x = in(reg) x,
            stride = in(reg) k,
            w = in(reg) chunks,
            sixty_four = in(reg) 64usize,
            dots = in(reg) dots.0.as_mut_ptr(),
            options(nostack),
        );
    }
}

/// Rows `first..first + n` (tiles configured for `n`) against the tile.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn group(
    format: QuantFormat,
    tile: *const u8,
    rows: &QuantizedRows,
    first: usize,
    n: usize,
    store: &mut impl FnMut(usize, &[f32; COLUMNS]),
) {
    let k = rows.k;
    let blocks = k / 32;
    let layout = tiles16::tile_block(format);
    let mut acc = [_mm512_setzero_ps(); ROWS];
    let mut off = [_mm512_setzero_ps(); ROWS];
    let mut weights = [Aligned([0u8; 8 * 64]), Aligned([0u8; 8 * 64])];
    let mut dots = [
        Aligned([0i32; ROWS * COLUMNS]),
        Aligned([0i32; ROWS * COLUMNS]),
    ];
    // Software-pipelined: block b + 1's tile product is issued before block b's epilogue
    // (each in its own tiles and buffers), so the tile unit works while the vector units
    // finish the previous block.
    if blocks > 0 {
        issue(format, tile, rows, first, 0, &mut weights[0], &mut dots[0]);
    }
    for b in 0..blocks {
        if b + 1 < blocks {
            let s = (b + 1) % 2;
            issue(
                format,
                tile,
                rows,
                first,
                b + 1,
                &mut weights[s],
                &mut dots[s],
            );
        }
        let base = tile.add(b * layout.bytes);
        let d = scales(format, base, layout);
        let offset = offsets(format, base, layout, d);
        let dots = &dots[b % 2];
        for r in 0..n {
            let row = first + r;
            let p = _mm512_load_si512(dots.0.as_ptr().add(r * COLUMNS) as *const __m512i);
            let scale = _mm512_mul_ps(d, _mm512_set1_ps(*rows.d.get_unchecked(row * blocks + b)));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), scale, acc[r]);
            let sum = _mm512_set1_ps(*rows.sums.get_unchecked(row * blocks + b));
            off[r] = _mm512_fmadd_ps(offset, sum, off[r]);
        }
    }
    for r in 0..n {
        let mut lanes = [0f32; COLUMNS];
        _mm512_storeu_ps(lanes.as_mut_ptr(), _mm512_add_ps(acc[r], off[r]));
        store(first + r, &lanes);
    }
}
