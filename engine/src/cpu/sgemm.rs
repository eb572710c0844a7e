//! `PackedF32`: a dense f32 projection `y = x W^T + b` whose weight is repacked once, at load,
//! into panels of 16 outputs (`[panel][k][16]`, the last panel zero-padded), so that a forward
//! never copies it again. The product runs in tiles of 6 rows by 16 outputs (twelve AVX2
//! accumulators, one broadcast of `x` and two loads of the panel per step of `k`), `k` in
//! blocks of 256 so a tile's slice of the panel stays in L1, and the tiles of 48 rows by 64
//! outputs are the team's parallel tasks. Without AVX2 and FMA the same tiles run in plain
//! Rust. Sums run in `k` order per output, so a row's result does not depend on the rows
//! beside it.

use super::team::{self, Disjoint};

/// Outputs per panel.
const PANEL: usize = 16;
/// Rows per tile of the kernel.
const MR: usize = 6;
/// `k` per block.
const KC: usize = 256;
/// Rows per parallel task.
const ROWS_PER_TASK: usize = MR * 8;
/// Panels per parallel task.
const PANELS_PER_TASK: usize = 4;

/// A weight `[n, k]` packed for [`PackedF32::matmul`].
#[derive(Debug, Clone)]
pub struct PackedF32 {
    n: usize,
    k: usize,
    panels: Vec<f32>,
    bias: Vec<f32>,
}

impl PackedF32 {
    /// Packs `weight` (`[n, k]`, row-major) and `bias` (`[n]`, or none).
    pub fn pack(weight: &[f32], n: usize, k: usize, bias: Option<&[f32]>) -> Self {
        assert_eq!(weight.len(), n * k, "weight is not [n, k]");
        let panels_n = n.div_ceil(PANEL);
        let mut panels = vec![0f32; panels_n * k * PANEL];
        for (row, w) in weight.chunks_exact(k.max(1)).enumerate().take(n) {
            let (p, lane) = (row / PANEL, row % PANEL);
            let base = p * k * PANEL + lane;
            for (kk, &v) in w.iter().enumerate() {
                panels[base + kk * PANEL] = v;
            }
        }
        let mut padded = vec![0f32; panels_n * PANEL];
        if let Some(b) = bias {
            padded[..n].copy_from_slice(&b[..n]);
        }
        Self {
            n,
            k,
            panels,
            bias: padded,
        }
    }

    /// Outputs.
    pub fn rows(&self) -> usize {
        self.n
    }

    /// Inputs.
    pub fn cols(&self) -> usize {
        self.k
    }

    /// Bytes of the packed weight.
    pub fn bytes(&self) -> usize {
        self.panels.len() * 4
    }

    /// `out[r] = x[r] W^T + b` for the `rows` rows of `x` (`[rows, k]`) into `out`
    /// (`[rows, n]`).
    pub fn matmul(&self, x: &[f32], rows: usize, out: &mut [f32]) {
        let (n, k) = (self.n, self.k);
        assert!(
            x.len() >= rows * k && out.len() >= rows * n,
            "matmul operands too short"
        );
        let row_tasks = rows.div_ceil(ROWS_PER_TASK);
        let panel_tasks = n.div_ceil(PANEL).div_ceil(PANELS_PER_TASK);
        let out_ptr = Disjoint::new(out);
        let simd = simd_available();
        team::for_each(row_tasks * panel_tasks, |task| {
            let (rt, pt) = (task / panel_tasks, task % panel_tasks);
            let r0 = rt * ROWS_PER_TASK;
            let r1 = (r0 + ROWS_PER_TASK).min(rows);
            let p0 = pt * PANELS_PER_TASK;
            let p1 = (p0 + PANELS_PER_TASK).min(n.div_ceil(PANEL));
            for k0 in (0..k.max(1)).step_by(KC) {
                let kc = KC.min(k.saturating_sub(k0));
                for p in p0..p1 {
                    let panel = &self.panels[p * k * PANEL + k0 * PANEL..];
                    let cols = PANEL.min(n - p * PANEL);
                    for m0 in (r0..r1).step_by(MR) {
                        let mr = MR.min(r1 - m0);
                        let mut tile = [[0f32; PANEL]; MR];
                        for (r, t) in tile.iter_mut().enumerate().take(mr) {
                            match k0 {
                                0 => t.copy_from_slice(&self.bias[p * PANEL..(p + 1) * PANEL]),
                                // SAFETY: this task alone writes these outputs of these rows.
                                _ => t[..cols].copy_from_slice(unsafe {
                                    out_ptr.run((m0 + r) * n + p * PANEL, cols)
                                }),
                            }
                        }
                        let a = &x[m0 * k + k0..];
                        if simd {
                            #[cfg(target_arch = "x86_64")]
                            // SAFETY: AVX2 and FMA were detected; `a` holds `mr` rows of
                            // stride `k` with `kc` values each, `panel` `kc` steps of 16.
                            unsafe {
                                x86::tile(a, k, mr, panel, kc, &mut tile)
                            };
                        } else {
                            tile_plain(a, k, mr, panel, kc, &mut tile);
                        }
                        for (r, t) in tile.iter().enumerate().take(mr) {
                            // SAFETY: as above; the offset plus `cols` stays inside `out`.
                            unsafe { out_ptr.run((m0 + r) * n + p * PANEL, cols) }
                                .copy_from_slice(&t[..cols]);
                        }
                    }
                }
            }
        });
    }
}

fn simd_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The tile in plain Rust: `tile[r] += a[r] . panel` over `kc` steps.
fn tile_plain(
    a: &[f32],
    lda: usize,
    mr: usize,
    panel: &[f32],
    kc: usize,
    tile: &mut [[f32; PANEL]; MR],
) {
    for (r, t) in tile.iter_mut().enumerate().take(mr) {
        for kk in 0..kc {
            let v = a[r * lda + kk];
            for (c, w) in t.iter_mut().zip(&panel[kk * PANEL..(kk + 1) * PANEL]) {
                *c = v.mul_add(*w, *c);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{MR, PANEL};

    /// `tile[r] += a[r] . panel` for `mr` rows over `kc` steps, in fused multiply-adds.
    ///
    /// # Safety
    /// AVX2 and FMA must be available; `a` must hold rows `0..mr` of stride `lda` with `kc`
    /// values each, and `panel` `kc * 16` values.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn tile(
        a: &[f32],
        lda: usize,
        mr: usize,
        panel: &[f32],
        kc: usize,
        tile: &mut [[f32; PANEL]; MR],
    ) {
        debug_assert!(panel.len() >= kc * PANEL);
        debug_assert!(mr >= 1 && (mr - 1) * lda + kc <= a.len());
        // Missing rows read row 0 again and are not stored.
        let rows: [*const f32; MR] =
            std::array::from_fn(|r| a.as_ptr().add(if r < mr { r * lda } else { 0 }));
        let mut acc = [[_mm256_setzero_ps(); 2]; MR];
        for (r, t) in tile.iter().enumerate() {
            acc[r][0] = _mm256_loadu_ps(t.as_ptr());
            acc[r][1] = _mm256_loadu_ps(t.as_ptr().add(8));
        }
        let mut b = panel.as_ptr();
        for kk in 0..kc {
            let b0 = _mm256_loadu_ps(b);
            let b1 = _mm256_loadu_ps(b.add(8));
            for r in 0..MR {
                let v = _mm256_broadcast_ss(&*rows[r].add(kk));
                acc[r][0] = _mm256_fmadd_ps(v, b0, acc[r][0]);
                acc[r][1] = _mm256_fmadd_ps(v, b1, acc[r][1]);
            }
            b = b.add(PANEL);
        }
        for (r, t) in tile.iter_mut().enumerate() {
            _mm256_storeu_ps(t.as_mut_ptr(), acc[r][0]);
            _mm256_storeu_ps(t.as_mut_ptr().add(8), acc[r][1]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(w: &[f32], n: usize, k: usize, b: &[f32], x: &[f32], rows: usize) -> Vec<f32> {
        let mut out = vec![0f32; rows * n];
        for r in 0..rows {
            for j in 0..n {
                let s: f64 = (0..k)
                    .map(|i| f64::from(x[r * k + i]) * f64::from(w[j * k + i]))
                    .sum();
                out[r * n + j] = s as f32 + b[j];
            }
        }
        out
    }

    #[test]
    fn every_shape_matches_the_plain_product_and_rows_do_not_depend_on_their_neighbours() {
        let mut seed = 7u32;
        let mut next = || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (seed >> 8) as f32 / (1 << 24) as f32 - 0.5
        };
        for (rows, n, k) in [
            (1, 1, 1),
            (5, 17, 3),
            (7, 33, 300),
            (50, 64, 513),
            (97, 40, 256),
        ] {
            let w: Vec<f32> = (0..n * k).map(|_| next()).collect();
            let b: Vec<f32> = (0..n).map(|_| next()).collect();
            let x: Vec<f32> = (0..rows * k).map(|_| next()).collect();
            let packed = PackedF32::pack(&w, n, k, Some(&b));
            let mut out = vec![f32::NAN; rows * n];
            packed.matmul(&x, rows, &mut out);
            let want = reference(&w, n, k, &b, &x, rows);
            for (i, (a, e)) in out.iter().zip(&want).enumerate() {
                assert!(
                    (a - e).abs() < 1e-4,
                    "({rows}, {n}, {k}) at {i}: {a} vs {e}"
                );
            }
            // The last row alone gives the same bits.
            let mut alone = vec![0f32; n];
            packed.matmul(&x[(rows - 1) * k..], 1, &mut alone);
            assert_eq!(alone, out[(rows - 1) * n..]);
            // The plain tiles give what the SIMD ones give, within rounding.
            let mut tile = [[0f32; PANEL]; MR];
            let mr = rows.min(MR);
            tile_plain(&x, k, mr, &packed.panels, k.min(KC), &mut tile);
            for r in 0..mr {
                for c in 0..n.min(PANEL) {
                    let e = want[r * n + c] - b[c];
                    if k <= KC {
                        assert!((tile[r][c] - e).abs() < 1e-4);
                    }
                }
            }
        }
    }
}
