//! Paged tree attention on the CPU. For each sequence and KV head, every query row attends to
//! the sequence's whole cached context (read in place from its blocks in the
//! `PagedKvStore`) and to the rows of its own tree that its `TreeMask` marks visible
//! (ancestors and itself), with an exact two-pass softmax; a row that sees [`KEY_RUN`] keys
//! twice over or more takes it in runs of keys merged afterwards, so that one decoding row's
//! long context can be split between cores.
//!
//! Batch invariance: a row's keys are visited in one fixed order (context positions
//! ascending, then visible tree nodes ascending), its runs depend only on how many keys it
//! sees, and every reduction runs over that row alone, so a row's output never depends on
//! which other rows or sequences share the batch, and a tree node computes bit-for-bit what
//! its root path computes as a chain.
//!
//! The driver (`driver`) splits the work into items (a sequence's rows for one KV head over
//! some key runs) and runs them on the forward's team; its two inner loops are `scores`
//! (queries against keys, the keys in vector lanes) and `values` (the probability-weighted
//! sum of value rows), over slot lists checked once (`slots`). A head's sink, where the
//! model has them, joins the softmax of a row's one run, or the merge of its runs. `reference` is the same
//! attention through candle's ops, the reference models' arithmetic. Sliding windows are a view
//! of the batch both run over (`window`).

mod driver;
mod reference;
mod scores;
mod slots;
mod values;
mod window;

pub use driver::{paged_tree_attention, KEY_RUN};
pub use reference::gathered_tree_attention;
pub use window::{window_start, windowed_batch, WindowViews};

/// Which implementation computes attention. The two differ only in float summation order,
/// and that matters: quantized matmuls round activations to 8 bits, which turns a one-ulp
/// difference into logit differences of up to ~1 and so flips near-tied greedy choices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AttentionKernel {
    /// [`paged_tree_attention`]: reads K/V in place from the blocks; a row's arithmetic is
    /// independent of the batch and of sibling tree nodes, so verifying a tree gives exactly
    /// the tokens plain decoding gives. The engine's kernel.
    #[default]
    Fused,
    /// [`gathered_tree_attention`]: the candle ops candle-transformers' reference models use,
    /// so chains (prefill, decode) reproduce the reference bit for bit. Not tree-exact: the
    /// matmul sums over masked keys too, which moves its rounding.
    Reference,
}

impl AttentionKernel {
    /// Parses `--attention`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "fused" => Some(Self::Fused),
            "reference" => Some(Self::Reference),
            _ => None,
        }
    }
}

/// Head geometry of one attention call.
#[derive(Debug, Clone, Copy)]
pub struct HeadShape<'a> {
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads.
    pub num_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Factor on query-key products (usually `1/sqrt(head_dim)`).
    pub scale: f32,
    /// `cap * tanh(score / cap)` on every score before the softmax.
    pub softcap: Option<f32>,
    /// Per query head, a logit that joins its softmax's maximum and denominator with no value
    /// (gpt-oss's attention sinks): a row may give weight to nothing.
    pub sinks: Option<&'a [f32]>,
}

impl HeadShape<'static> {
    /// The usual geometry: products scaled by `1/sqrt(head_dim)`, no soft-cap.
    pub fn plain(num_heads: usize, num_kv_heads: usize, head_dim: usize) -> Self {
        Self {
            num_heads,
            num_kv_heads,
            head_dim,
            scale: (1.0 / (head_dim as f64).sqrt()) as f32,
            softcap: None,
            sinks: None,
        }
    }
}

/// `cap * tanh(x / cap)`, as the reference computes it (`x` times the f32 reciprocal of `cap`).
pub fn softcap(x: f32, cap: f32) -> f32 {
    (x * (1.0 / f64::from(cap)) as f32).tanh() * cap
}

/// Whether this CPU runs the AVX-512 loops (checked once).
fn avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static AVX512: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *AVX512
            .get_or_init(|| is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("fma"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

#[cfg(test)]
mod tests;
