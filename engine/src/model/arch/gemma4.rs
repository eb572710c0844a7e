//! Gemma 4 (the text decoder of E2B, E4B, 26B-A4B and 31B): Gemma 3's block (QK norm, norms
//! before and after attention and the MLP, GeGLU with tanh GELU, embedding rows times
//! `sqrt(hidden)`) with what the family changes: norm weights multiplied as stored (HF
//! checkpoints too); queries and keys scaled by their norms alone (a factor of 1 on their
//! products); values RMS-normalized per head without a weight; the windowed and global
//! layers listed by the file, the global ones with heads of their own width and count and a
//! proportional RoPE (the leading quarter of pairs turning with the whole head's frequencies);
//! the last layers reading the keys and values of the last layer of their kind before them;
//! per-layer embeddings and a scale on each block's output, where the file has them (loaded
//! by `model::per_layer`); a final logit soft-cap; and in 26B-A4B, a mixture of experts beside
//! every layer's dense MLP, each half normed on its own, the router reading the residual with
//! a scale of its own and each expert's output scaled (`experts::Beside`).

use super::{Architecture, Experts, Family, Mixers, Windows};
use crate::model::config::{Activation, RopeStyle};

/// The declaration.
pub const FAMILY: Family = Family {
    architecture: Architecture::Gemma4,
    gguf: "gemma4",
    hf: &[
        "Gemma4ForCausalLM",
        "Gemma4ForConditionalGeneration",
        "gemma4_text",
        "gemma4",
    ],
    attention_bias: false,
    qk_norm: true,
    fused_projections: false,
    post_norms: true,
    activation: Activation::GeluTanh,
    scaled_embedding: true,
    gguf_rope_style: RopeStyle::Halves,
    hf_norm_offset: 0.0,
    windows: Windows::AllButEvery(6),
    local_rope_theta: Some(10_000.0),
    gguf_residual_query_scale_at: &[],
    gguf_rope_switch: false,
    experts: Some(Experts {
        required: false,
        shared_expert: false,
        hf_normalize: true,
        gguf_normalize: true,
    }),
    mixers: Mixers::Attention,
    attention_scale: Some(1.0),
    value_norm: true,
    hf_renames: &[],
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::arch::FileFacts;
    use crate::model::config::{ModelConfig, RopeStyle};

    /// A published shape: layers, hidden, query heads, windowed and global KV heads, layers
    /// per global one, the window, shared layers.
    fn shape(
        (layers, hidden, heads): (usize, usize, usize),
        (local_kv, global_kv): (usize, usize),
        (period, window, shared): (usize, usize, usize),
    ) -> ModelConfig {
        let facts = FileFacts {
            num_layers: layers,
            hidden_size: hidden,
            window: Some(window),
            window_period: Some(period),
            global_heads: Some((global_kv, 512)),
            proportional_pairs: Some(64),
            shared_kv_layers: shared,
            ..FileFacts::default()
        };
        let cfg = ModelConfig {
            architecture: Architecture::Gemma4,
            vocab_size: 262_144,
            hidden_size: hidden,
            intermediate_size: 4 * hidden,
            num_layers: layers,
            num_heads: heads,
            num_kv_heads: local_kv,
            head_dim: 256,
            rope_theta: 1e6,
            rope_style: RopeStyle::Halves,
            rms_norm_eps: 1e-6,
            max_position_embeddings: 131_072,
            attention_bias: false,
            variant: FAMILY.variant(&facts).unwrap(),
        };
        cfg.validate().unwrap();
        cfg
    }

    /// Bytes of f16 keys and values one sequence of `n` positions keeps: thicket's (the
    /// windowed layers at most their window, the layers that share none) and a cache's that
    /// stores every layer's every position.
    fn per_sequence(cfg: &ModelConfig, n: usize) -> (usize, usize) {
        (0..cfg.num_layers).fold((0, 0), |(kept, every), i| {
            let (kv_heads, head_dim) = cfg.layer_heads(i);
            let seen = cfg.layer_attention(i).window.map_or(n, |w| w.min(n));
            (
                kept + cfg.layer_kv_bytes_per_position(i, 2) * seen,
                every + 2 * kv_heads * head_dim * 2 * n,
            )
        })
    }

    #[test]
    fn e4b_and_31b_keep_only_the_layers_that_write_and_their_windows() {
        let mib = |b: usize| b as f64 / (1 << 20) as f64;
        // E4B: 42 layers, five windowed to one global, the last 18 sharing.
        let e4b = shape((42, 2560, 8), (2, 2), (6, 512, 18));
        let sources: Vec<Option<usize>> = (0..42).map(|i| e4b.layer_attention(i).kv_from).collect();
        assert!(sources[..24].iter().all(Option::is_none));
        for (i, source) in sources.iter().enumerate().skip(24) {
            // The last windowed and the last global layer that keep their own: 22 and 23.
            let want = if (i + 1) % 6 == 0 { 23 } else { 22 };
            assert_eq!(*source, Some(want), "layer {i}");
        }
        assert_eq!(
            (
                mib(per_sequence(&e4b, 8192).0),
                mib(per_sequence(&e4b, 8192).1)
            ),
            (148.0, 784.0)
        );
        assert_eq!(
            (
                mib(per_sequence(&e4b, 32768).0),
                mib(per_sequence(&e4b, 32768).1)
            ),
            (532.0, 3136.0)
        );
        // 31B: 60 layers, 16 KV heads windowed and 4 global, a window of 1024, none shared.
        let big = shape((60, 5376, 32), (16, 4), (6, 1024, 0));
        assert_eq!(
            (
                mib(per_sequence(&big, 8192).0),
                mib(per_sequence(&big, 8192).1)
            ),
            (1440.0, 7040.0)
        );
        assert_eq!(
            (
                mib(per_sequence(&big, 32768).0),
                mib(per_sequence(&big, 32768).1)
            ),
            (3360.0, 28160.0)
        );
    }
}
