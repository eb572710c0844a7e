//! `QuantMatrix`: thicket's CPU matmul for GGUF-quantized weights, `y = x W^T` for 1 to a few
//! hundred activation rows, built so that verifying many draft tokens costs little more than
//! decoding one. The weights are streamed from memory once per product, whatever the row count:
//! the output columns are split into tiles of 16 weight rows across the thread pool, and each
//! tile's blocks are unpacked once and applied to every activation row with integer SIMD dot
//! products. On AVX2 and AVX-512 every format is rearranged at load into the kernels' order
//! (`tiles16`) and unpacked in registers (`avx512_block32` and `avx2_block32` for the 32-value
//! formats, `avx512_super256` and `avx2_super256` for Q4_K/Q6_K); where the CPU and OS allow
//! AMX, products of two or more rows in the 32-value formats take int8 tiles instead (`amx`,
//! bit-identical to the VNNI kernel); elsewhere (and for matrices kept in GGUF's layout) a tile
//! is decoded from GGUF blocks into L1-resident scratch first (`formats`) and multiplied by the
//! portable or x86 kernels (`kernels`). Activations are quantized to 8 bits the way candle
//! quantizes them (`activations`), so results agree with candle's `QMatMul` to float rounding;
//! a row's result never depends on the other rows (batch invariance, which lossless tree
//! verification relies on).

mod activations;
#[cfg(target_arch = "x86_64")]
mod amx;
#[cfg(target_arch = "x86_64")]
mod avx2_block32;
#[cfg(target_arch = "x86_64")]
mod avx2_super256;
#[cfg(target_arch = "x86_64")]
mod avx512_block32;
#[cfg(target_arch = "x86_64")]
mod avx512_super256;
pub mod formats;
pub mod kernels;
#[cfg(target_arch = "x86_64")]
mod quantize_x86;
mod storage;
mod tiles16;
#[cfg(target_arch = "x86_64")]
mod x86;

use std::borrow::Cow;
use std::cell::RefCell;
use std::sync::OnceLock;

use candle_core::quantized::QTensor;

use crate::cpu::reduce;
use crate::cpu::team::Disjoint;
use crate::{Error, Result};
use activations::QuantizedRows;
use formats::{Block32Tile, DecodedRow, QuantFormat, Shape, Super256Tile};
use kernels::Isa;
pub use storage::WeightBytes;

/// Weight rows (output columns) decoded together.
const TILE: usize = tiles16::ROWS;

/// The instruction set every product in this process uses (detected once, so every row of
/// every step takes the same arithmetic): `Isa::detect`'s, or the set `THICKET_ISA` names
/// (`portable`, `avx2`, `avx512`, `amx`) when this CPU can run it, to compare kernels on one
/// machine or to opt in to AMX.
pub fn process_isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        std::env::var("THICKET_ISA")
            .ok()
            .and_then(|name| Isa::available().into_iter().find(|i| i.name() == name))
            .unwrap_or_else(Isa::detect)
    })
}

/// Activation rows quantized for one kind of matrix (see `QuantMatrix::quantize`), kept to
/// be reused across the matrices that read the same activations and across forwards.
#[derive(Debug, Default)]
pub struct Activations(QuantizedRows, Option<QuantFormat>);

/// A quantized `[n, k]` weight matrix (`n` outputs, `k` inputs).
#[derive(Debug, Clone)]
pub struct QuantMatrix {
    format: QuantFormat,
    n: usize,
    k: usize,
    layout: BlockLayout,
    data: WeightBytes,
}

/// How a matrix's blocks are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockLayout {
    /// GGUF's: row after row of blocks. Every instruction set reads it.
    Gguf,
    /// `tiles16`: rearranged for the AVX2 and AVX-512 kernels (see `Isa::reads_tiles16`).
    Tiles16,
}

/// Per-thread decode buffers, reused across products.
#[derive(Default)]
struct Scratch {
    q: Vec<u8>,
    scale: Vec<f32>,
    offset: Vec<f32>,
    sub_pairs: Vec<i16>,
}

/// The result rows every task of one product writes its own tiles' columns of (each tile
/// belongs to one task, so the runs the tasks reach are disjoint).
type SharedRows = Disjoint<f32>;

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

impl QuantMatrix {
    /// Takes a candle `[n, k]` quantized tensor's blocks; `None` when its format is not one the
    /// kernels support.
    pub fn from_qtensor(tensor: &QTensor) -> Result<Option<Self>> {
        let Some(format) = QuantFormat::from_ggml(tensor.dtype()) else {
            return Ok(None);
        };
        let (n, k) = tensor.shape().dims2()?;
        let data = tensor.data()?.into_owned();
        Ok(Some(Self::new(format, n, k, data)?.for_isa(process_isa())))
    }

    /// The same matrix in the layout `isa`'s kernels read fastest (`Tiles16` on AVX2 and
    /// AVX-512, GGUF otherwise).
    pub fn for_isa(self, isa: Isa) -> Self {
        let layout = if isa.reads_tiles16() {
            BlockLayout::Tiles16
        } else {
            BlockLayout::Gguf
        };
        if layout == self.layout {
            return self;
        }
        let data = WeightBytes::Owned(match layout {
            BlockLayout::Tiles16 => tiles16::repack(self.format, self.n, self.k, &self.data),
            BlockLayout::Gguf => tiles16::unpack(self.format, self.n, self.k, &self.data),
        });
        Self {
            layout,
            data,
            ..self
        }
    }

    /// The layout.
    pub fn layout(&self) -> BlockLayout {
        self.layout
    }

    /// From raw GGUF blocks, `n` rows of `k / block` blocks each.
    pub fn new(format: QuantFormat, n: usize, k: usize, data: Vec<u8>) -> Result<Self> {
        let block = format.block_values();
        if k == 0 || !k.is_multiple_of(block) {
            return Err(Error::Metadata(format!(
                "{format:?} weight with {k} inputs, not a multiple of {block}"
            )));
        }
        if data.len() != n * k / block * format.block_bytes() {
            return Err(Error::Metadata(format!(
                "{format:?} weight [{n}, {k}] with {} bytes",
                data.len()
            )));
        }
        Ok(Self {
            format,
            n,
            k,
            layout: BlockLayout::Gguf,
            data: WeightBytes::Owned(data),
        })
    }

    /// The block format.
    pub fn format(&self) -> QuantFormat {
        self.format
    }

    /// Outputs.
    pub fn rows(&self) -> usize {
        self.n
    }

    /// Inputs.
    pub fn cols(&self) -> usize {
        self.k
    }

    /// The GGUF blocks, row after row.
    pub fn gguf(&self) -> Cow<'_, [u8]> {
        match self.layout {
            BlockLayout::Gguf => Cow::Borrowed(&self.data[..]),
            BlockLayout::Tiles16 => {
                Cow::Owned(tiles16::unpack(self.format, self.n, self.k, &self.data))
            }
        }
    }

    /// Bytes of weights (as GGUF stores them).
    pub fn bytes(&self) -> usize {
        self.n * self.k / self.format.block_values() * self.format.block_bytes()
    }

    /// `x` is `[m][k]` row-major; returns `[m][n]`.
    pub fn matmul(&self, x: &[f32]) -> Result<Vec<f32>> {
        self.matmul_with(process_isa(), x)
    }

    /// `matmul` in a chosen instruction set (which the CPU must have: see `Isa::available`).
    pub fn matmul_with(&self, isa: Isa, x: &[f32]) -> Result<Vec<f32>> {
        if !isa.runs_here() {
            return Err(Error::Metadata(format!(
                "this CPU cannot run the {} kernels",
                isa.name()
            )));
        }
        if self.layout == BlockLayout::Tiles16 && !isa.reads_tiles16() {
            return Err(Error::Metadata(format!(
                "a matrix laid out for the SIMD kernels cannot run the {} kernels",
                isa.name()
            )));
        }
        if !x.len().is_multiple_of(self.k) {
            return Err(Error::InvalidBatch(format!(
                "matmul input of {} values for {} inputs per row",
                x.len(),
                self.k
            )));
        }
        let m = x.len() / self.k;
        if m == 0 {
            return Ok(Vec::new());
        }
        let rows = QuantizedRows::quantize(self.format, x, self.k);
        let mut out = vec![0f32; m * self.n];
        self.product(isa, &rows, &mut out);
        Ok(out)
    }

    /// Quantizes `x` (`[m][k]`) into `rows` the way this matrix's kernels read activations;
    /// `rows` then serves every matrix whose `same_activations` says so.
    pub(crate) fn quantize(&self, x: &[f32], rows: &mut Activations) {
        rows.0.fill(self.format, x, self.k);
        rows.1 = Some(self.format);
    }

    /// `quantize` of `m` rows that `row(r, values)` writes (see `QuantizedRows::fill_rows`).
    pub(crate) fn quantize_rows(
        &self,
        m: usize,
        rows: &mut Activations,
        row: impl Fn(usize, &mut [f32]) + Sync,
    ) {
        rows.0.fill_rows(self.format, self.k, m, row);
        rows.1 = Some(self.format);
    }

    /// Whether activations quantized for `other` serve this matrix as they are.
    pub(crate) fn same_activations(&self, other: &QuantMatrix) -> bool {
        self.k == other.k
            && self.format.shape() == other.format.shape()
            && self.format.q8_1_sums() == other.format.q8_1_sums()
    }

    /// Whether `rows` were quantized for a matrix with this one's activations.
    fn check(&self, rows: &Activations) -> Result<()> {
        let fits = rows.1.is_some_and(|f| {
            f.shape() == self.format.shape() && f.q8_1_sums() == self.format.q8_1_sums()
        });
        if !fits || rows.0.k != self.k {
            return Err(Error::InvalidBatch(format!(
                "activations quantized for another matrix than {:?} [{}, {}]",
                self.format, self.n, self.k
            )));
        }
        Ok(())
    }

    /// How the product's tiles are split into tasks: `(tasks, tiles per task)` (see
    /// `tiles_per_task`).
    fn split(&self) -> (usize, usize) {
        let per_task = tiles_per_task(self.tiles());
        (self.tiles().div_ceil(per_task), per_task)
    }

    /// Tiles of `TILE` weight rows.
    fn tiles(&self) -> usize {
        self.n.div_ceil(TILE)
    }

    fn product(&self, isa: Isa, rows: &QuantizedRows, out: &mut [f32]) {
        let m = rows.q.len() / self.k;
        assert!(out.len() >= m * self.n);
        let result = Disjoint::new(out);
        let (tasks, per_task) = self.split();
        crate::cpu::team::for_each(tasks, |task| self.task(isa, rows, task, per_task, result));
    }

    /// Task `task` of the product split into runs of `per_task` tiles: its tiles' results
    /// into `result`, which holds `m * n` values.
    fn task(
        &self,
        isa: Isa,
        rows: &QuantizedRows,
        task: usize,
        per_task: usize,
        result: SharedRows,
    ) {
        let m = rows.q.len() / self.k;
        let n = self.n;
        let tiles = self.tiles();
        assert!(
            self.layout == BlockLayout::Gguf || isa.reads_tiles16(),
            "a {:?} matrix run with the {} kernels",
            self.layout,
            isa.name()
        );
        SCRATCH.with(|scratch| {
            let mut scratch = scratch.borrow_mut();
            let end = ((task + 1) * per_task).min(tiles);
            for t in task * per_task..end {
                let columns = n.saturating_sub(t * TILE).min(TILE);
                let mut store = |r: usize, values: &[f32; TILE]| {
                    assert!(r < m, "a tile kernel gave row {r} of {m}");
                    // SAFETY: `r < m` and `t * TILE + columns <= n`, so the run lies inside
                    // the result (`m * n` values, checked by the callers); each tile belongs
                    // to one task, so no two threads write the same values, and nothing
                    // reads the result until every task is done.
                    let run = unsafe { result.run(r * n + t * TILE, columns) };
                    if let Ok(run) = <&mut [f32; TILE]>::try_from(&mut *run) {
                        // A whole tile: a copy of known length, not a call to `memcpy`.
                        *run = *values;
                    } else {
                        run.copy_from_slice(&values[..columns]);
                    }
                };
                self.tile(isa, t, rows, &mut scratch, &mut store);
            }
        })
    }

    fn tile(
        &self,
        isa: Isa,
        t: usize,
        rows: &QuantizedRows,
        scratch: &mut Scratch,
        store: &mut impl FnMut(usize, &[f32; TILE]),
    ) {
        let k = self.k;
        let m = rows.q.len() / k;
        let block = self.format.block_values();
        let blocks = k / block;
        let row_bytes = blocks * self.format.block_bytes();
        let shape = self.format.shape();
        let groups = match shape {
            Shape::Block32 => k / 32,
            Shape::Super256 => k / 16,
        };
        let columns = self.n.saturating_sub(t * TILE).min(TILE);
        #[cfg(target_arch = "x86_64")]
        if self.layout == BlockLayout::Tiles16 {
            let size = blocks * tiles16::block_bytes(self.format);
            let tile = &self.data[t * size..(t + 1) * size];
            // SAFETY: `Tiles16` matrices only run with `Isa::Avx2`, `Isa::Avx512` or `Isa::Amx`
            // (checked in `matmul_with` and `task`), which are only detected on CPUs with every
            // feature their kernels need (and, for AMX, the OS's permission); the tile holds
            // all its blocks, `rows` were quantized for this format (`check`), and `out` takes
            // a whole tile of results.
            unsafe {
                if isa == Isa::Avx2 {
                    if shape == Shape::Super256 {
                        avx2_super256::tile(self.format, tile, rows, store)
                    } else {
                        avx2_block32::tile(self.format, tile, rows, store)
                    }
                } else if shape == Shape::Super256 {
                    avx512_super256::tile(self.format, tile, rows, store)
                } else if isa == Isa::Amx && m >= 2 {
                    amx::tile(self.format, tile, rows, store)
                } else {
                    avx512_block32::tile(self.format, tile, rows, store)
                }
            };
            return;
        }
        scratch.q.resize(TILE * k, 0);
        scratch.offset.resize(TILE * groups, 0.0);
        scratch.scale.resize(TILE * blocks, 0.0);
        scratch.sub_pairs.resize(
            match shape {
                Shape::Block32 => 0,
                Shape::Super256 => TILE * k / 2,
            },
            0,
        );
        let Scratch {
            q,
            scale,
            offset,
            sub_pairs,
        } = scratch;
        if columns < TILE {
            q.fill(0);
            scale.fill(0.0);
            offset.fill(0.0);
        }
        for c in 0..columns {
            let raw = &self.data[(t * TILE + c) * row_bytes..(t * TILE + c + 1) * row_bytes];
            let offset = &mut offset[c * groups..(c + 1) * groups];
            let q = &mut q[c * k..(c + 1) * k];
            let scale = &mut scale[c * blocks..(c + 1) * blocks];
            let row = match shape {
                Shape::Block32 => DecodedRow::Block32(formats::Block32Row { q, scale, offset }),
                Shape::Super256 => DecodedRow::Super256(formats::Super256Row {
                    q,
                    sub_pairs: &mut sub_pairs[c * k / 2..(c + 1) * k / 2],
                    d: scale,
                    offset,
                }),
            };
            kernels::decode_row(isa, self.format, raw, row);
        }
        let quarter = formats::TILE;
        for r in 0..m {
            let xq = rows.row_q(r);
            let xd = &rows.d[r * blocks..(r + 1) * blocks];
            let mut dots = [0f32; TILE];
            for (h, dots) in dots.chunks_exact_mut(quarter).enumerate() {
                let q = &q[h * quarter * k..(h + 1) * quarter * k];
                let scale = &scale[h * quarter * blocks..(h + 1) * quarter * blocks];
                let part = match shape {
                    Shape::Block32 => kernels::block32_dot4(
                        isa,
                        Block32Tile {
                            q,
                            scale,
                            signed: self.format.signed(),
                        },
                        xq,
                        xd,
                    ),
                    Shape::Super256 => kernels::super256_dot4(
                        isa,
                        Super256Tile {
                            q,
                            sub_pairs: &sub_pairs[h * quarter * k / 2..(h + 1) * quarter * k / 2],
                            d: scale,
                        },
                        xq,
                        xd,
                    ),
                };
                dots.copy_from_slice(&part);
            }
            let sums = &rows.sums[r * groups..(r + 1) * groups];
            for (c, dot) in dots.iter_mut().enumerate() {
                *dot += reduce::dot(&offset[c * groups..(c + 1) * groups], sums);
            }
            store(r, &dots);
        }
    }
}

/// Products that `matmul_quantized_all` runs in one parallel loop at most (q, k and v are
/// three); more run in loops of this many.
const TOGETHER: usize = 4;

/// `out = x W^T` for every `(W, out)` of `products`, all reading the activations `rows`
/// (quantized by `quantize` of a matrix with the same activations as each), in one parallel
/// loop over all their tasks: one fork and join of the pool instead of one per matrix. Each
/// value is computed exactly as the matrix's product alone computes it. Allocates nothing
/// once the outputs have grown.
pub(crate) fn matmul_quantized_all<'a>(
    rows: &Activations,
    products: impl IntoIterator<Item = (&'a QuantMatrix, &'a mut Vec<f32>)>,
) -> Result<()> {
    let none = (None, Disjoint::new(&mut []));
    let mut batch: [(Option<&QuantMatrix>, SharedRows); TOGETHER] = [none; TOGETHER];
    let mut filled = 0;
    for (weight, out) in products {
        weight.check(rows)?;
        let m = rows.0.q.len() / weight.k;
        // Every value is written by the product; stale ones need no zeroing first.
        out.resize(m * weight.n, 0.0);
        if m == 0 {
            continue;
        }
        batch[filled] = (Some(weight), Disjoint::new(out));
        filled += 1;
        if filled == TOGETHER {
            run_together(&rows.0, &batch);
            filled = 0;
        }
    }
    run_together(&rows.0, &batch[..filled]);
    Ok(())
}

/// `out = x W^T` for every `(x, W, out)` of `products`, each reading its own activations
/// (quantized for a matrix with `W`'s), in one parallel loop over all their tasks: a
/// mixture's chosen experts, each over the rows that chose it, with one fork and join of the
/// pool. Each value is computed exactly as the matrix's product alone computes it.
pub(crate) fn matmul_quantized_each<'a>(
    products: impl IntoIterator<Item = (&'a Activations, &'a QuantMatrix, &'a mut Vec<f32>)>,
) -> Result<()> {
    let mut batch: Vec<(&QuantizedRows, &QuantMatrix, SharedRows)> = Vec::new();
    for (rows, weight, out) in products {
        weight.check(rows)?;
        let m = rows.0.q.len() / weight.k;
        // Every value is written by the product; stale ones need no zeroing first.
        out.resize(m * weight.n, 0.0);
        if m > 0 {
            batch.push((&rows.0, weight, Disjoint::new(out)));
        }
    }
    let tiles: usize = batch.iter().map(|(_, w, _)| w.tiles()).sum();
    if tiles == 0 {
        return Ok(());
    }
    let per_task = tiles_per_task(tiles);
    let total: usize = batch
        .iter()
        .map(|(_, w, _)| w.tiles().div_ceil(per_task))
        .sum();
    let isa = process_isa();
    crate::cpu::team::for_each(total, |mut job| {
        for &(rows, weight, result) in &batch {
            let tasks = weight.tiles().div_ceil(per_task);
            if job < tasks {
                weight.task(isa, rows, job, per_task, result);
                return;
            }
            job -= tasks;
        }
    });
    Ok(())
}

/// Tiles per task where `tiles` tiles are split between the pool's threads: about eight
/// tasks per thread, every one holding tiles (36 tiles in runs of 3 are 12 tasks, not 16 of
/// which the last 4 are empty: the pool halves a range of tasks between its threads, and
/// the half with the empty ones would get a third of the tiles).
fn tiles_per_task(tiles: usize) -> usize {
    tiles.div_ceil(rayon::current_num_threads() * 8).max(1)
}

/// The tasks of every `(matrix, its output)` of `batch`, in one parallel loop; each output
/// holds `m * n` values. Every matrix is split into runs of the same number of tiles, so the
/// tasks are of one size however the matrices differ in width (q's 36 tiles and k's and v's
/// 12 each make 15 tasks of 4, not 12 of 3 and 24 of 1).
fn run_together(rows: &QuantizedRows, batch: &[(Option<&QuantMatrix>, SharedRows)]) {
    let tiles: usize = batch.iter().filter_map(|b| b.0).map(|w| w.tiles()).sum();
    if tiles == 0 {
        return;
    }
    let per_task = tiles_per_task(tiles);
    let total: usize = batch
        .iter()
        .filter_map(|b| b.0)
        .map(|w| w.tiles().div_ceil(per_task))
        .sum();
    let isa = process_isa();
    crate::cpu::team::for_each(total, |mut job| {
        for &(weight, result) in batch {
            let Some(weight) = weight else { continue };
            let tasks = weight.tiles().div_ceil(per_task);
            if job < tasks {
                weight.task(isa, rows, job, per_task, result);
                return;
            }
            job -= tasks;
        }
    });
}

#[cfg(test)]
mod tests;
