//! Fixed-order float reductions shared by the CPU kernels (attention, the quantized matmul's
//! offset terms). Their summation order depends only on the length, never on the batch, so
//! every row computes the same bits whatever else shares its step.

/// Eight partial sums combined in `dot`'s fixed order.
#[inline(always)]
pub fn combine8(acc: &[f32; 8]) -> f32 {
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))
}

/// `sum a[i] * b[i]` with eight independent partial sums combined in a fixed order
/// (vectorises), then the tail past the last multiple of eight.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (a8, a_rest) = a.split_at(a.len() - a.len() % 8);
    let (b8, b_rest) = b.split_at(a8.len());
    for (x, y) in a8.chunks_exact(8).zip(b8.chunks_exact(8)) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut sum = combine8(&acc);
    for (x, y) in a_rest.iter().zip(b_rest) {
        sum += x * y;
    }
    sum
}
