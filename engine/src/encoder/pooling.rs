//! Pooling: one vector from a sequence's token states, as sentence-transformers computes it
//! (mean, `[CLS]`, max, sum over the square root of the count, last token), then scaled to
//! unit length where the checkpoint normalizes; and the vector arithmetic the pooling
//! endpoints share (unit length, cosine similarity, Matryoshka truncation).

use super::config::{Pooling, PoolingMode};

/// The pooled vector of the rows `start..start + len` of `states` (`[rows, hidden]`).
pub fn pool(
    states: &[f32],
    hidden: usize,
    (start, len): (usize, usize),
    pooling: Pooling,
) -> Vec<f32> {
    let rows = states[start * hidden..(start + len) * hidden].chunks_exact(hidden);
    let mut out = match pooling.mode {
        PoolingMode::Cls => states[start * hidden..(start + 1) * hidden].to_vec(),
        PoolingMode::Last => states[(start + len - 1) * hidden..(start + len) * hidden].to_vec(),
        PoolingMode::Max => rows.fold(vec![f32::NEG_INFINITY; hidden], |mut acc, row| {
            for (a, x) in acc.iter_mut().zip(row) {
                *a = a.max(*x);
            }
            acc
        }),
        PoolingMode::Mean | PoolingMode::MeanSqrtLen => {
            let mut sum = rows.fold(vec![0f32; hidden], |mut acc, row| {
                for (a, x) in acc.iter_mut().zip(row) {
                    *a += x;
                }
                acc
            });
            let divisor = match pooling.mode {
                PoolingMode::Mean => len as f32,
                _ => (len as f32).sqrt(),
            };
            sum.iter_mut().for_each(|x| *x /= divisor);
            sum
        }
    };
    if pooling.normalize {
        normalize(&mut out);
    }
    out
}

/// Scales `v` to unit L2 norm (a zero vector stays zero), as `torch.nn.functional.normalize`
/// does (its norm is clamped below at 1e-12).
pub fn normalize(v: &mut [f32]) {
    let norm = v
        .iter()
        .map(|x| f64::from(*x) * f64::from(*x))
        .sum::<f64>()
        .sqrt();
    let norm = norm.max(1e-12) as f32;
    v.iter_mut().for_each(|x| *x /= norm);
}

/// Cosine similarity of two vectors of one width.
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let (mut ab, mut aa, mut bb) = (0f64, 0f64, 0f64);
    for (x, y) in a.iter().zip(b) {
        let (x, y) = (f64::from(*x), f64::from(*y));
        ab += x * y;
        aa += x * x;
        bb += y * y;
    }
    (ab / (aa.sqrt() * bb.sqrt()).max(1e-12)) as f32
}

/// The first `dimensions` components of `v`, scaled back to unit length (for models trained
/// with Matryoshka representation learning).
pub fn truncate_dimensions(mut v: Vec<f32>, dimensions: usize) -> Vec<f32> {
    v.truncate(dimensions);
    normalize(&mut v);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATES: [f32; 6] = [1.0, 2.0, 3.0, -4.0, 5.0, 0.0];

    fn pooled(mode: PoolingMode, normalize: bool) -> Vec<f32> {
        pool(&STATES, 2, (0, 3), Pooling { mode, normalize })
    }

    #[test]
    fn each_mode_combines_the_rows_of_its_span() {
        assert_eq!(pooled(PoolingMode::Cls, false), [1.0, 2.0]);
        assert_eq!(pooled(PoolingMode::Last, false), [5.0, 0.0]);
        assert_eq!(pooled(PoolingMode::Max, false), [5.0, 2.0]);
        assert_eq!(pooled(PoolingMode::Mean, false), [3.0, -2.0 / 3.0]);
        let s = 3f32.sqrt();
        assert_eq!(pooled(PoolingMode::MeanSqrtLen, false), [9.0 / s, -2.0 / s]);
        assert_eq!(
            pool(
                &STATES,
                2,
                (1, 2),
                Pooling {
                    mode: PoolingMode::Cls,
                    normalize: false
                }
            ),
            [3.0, -4.0]
        );
        assert_eq!(pooled(PoolingMode::Last, true), [1.0, 0.0]);
        let n = pooled(PoolingMode::Cls, true);
        assert!((n[0] - 1.0 / 5f32.sqrt()).abs() < 1e-7 && (n[1] - 2.0 / 5f32.sqrt()).abs() < 1e-7);
    }

    #[test]
    fn cosine_and_truncation_are_scale_free() {
        assert!((cosine(&[1.0, 0.0], &[3.0, 0.0]) - 1.0).abs() < 1e-7);
        assert!(cosine(&[1.0, 0.0], &[0.0, 2.0]).abs() < 1e-7);
        assert!((cosine(&[1.0, 1.0], &[-1.0, -1.0]) + 1.0).abs() < 1e-7);
        assert_eq!(truncate_dimensions(vec![3.0, 4.0, 12.0], 2), [0.6, 0.8]);
        let mut zero = vec![0.0, 0.0];
        normalize(&mut zero);
        assert_eq!(zero, [0.0, 0.0]);
    }
}
