//! Granite 4.0-H (IBM's hybrids, `granitehybrid`): most layers are Mamba-2
//! (`LayerMixer::Mamba2`: groups of heads sharing `B` and `C`, consecutive heads per group)
//! and a few attend, as the file's per-layer KV head counts say (0 for a Mamba-2 layer). The
//! attending layers have no positional rotation where the file turns RoPE off
//! (`rope.scaling.finetuned` false, as llama.cpp's converter writes every hybrid Granite;
//! absent means on, llama.cpp's default), and queries scaled by `attention.scale`. Granite's
//! µP factors: embeddings times `embedding_scale`, every mixer's and MLP's output times
//! `residual_scale` before its residual add, logits divided by `logit_scale` (each 0 or
//! absent: none). The MLP is SwiGLU, or a mixture of experts with a shared expert without a
//! gate (H-Tiny, H-Small).

use super::{Architecture, Experts, Family, Mixers, Windows};
use crate::model::config::{Activation, RopeStyle};

/// The declaration.
pub const FAMILY: Family = Family {
    architecture: Architecture::GraniteHybrid,
    gguf: "granitehybrid",
    hf: &["GraniteMoeHybridForCausalLM", "granitemoehybrid"],
    attention_bias: false,
    qk_norm: false,
    fused_projections: false,
    post_norms: false,
    activation: Activation::Silu,
    scaled_embedding: false,
    gguf_rope_style: RopeStyle::Interleaved,
    hf_norm_offset: 0.0,
    windows: Windows::Never,
    local_rope_theta: None,
    gguf_residual_query_scale_at: &[],
    gguf_rope_switch: true,
    experts: Some(Experts {
        required: false,
        shared_expert: true,
        hf_normalize: true,
        gguf_normalize: true,
    }),
    mixers: Mixers::Mamba2WhereNoKv,
    attention_scale: None,
    value_norm: false,
    hf_renames: &[],
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::arch::FileFacts;
    use crate::model::config::{DeltaNetShape, KeyHeadsOfValues, LayerMixer};

    fn facts() -> FileFacts {
        FileFacts {
            num_layers: 4,
            hidden_size: 16,
            kv_heads_per_layer: Some(vec![0, 0, 2, 0]),
            delta_net: Some(DeltaNetShape {
                kernel: 4,
                key_heads: 2,
                value_heads: 4,
                key_dim: 8,
                value_dim: 8,
                key_heads_of_values: KeyHeadsOfValues::Tiled,
            }),
            ..FileFacts::default()
        }
    }

    #[test]
    fn layers_without_kv_heads_are_mamba2_with_consecutive_heads_per_group() {
        let v = FAMILY.variant(&facts()).unwrap();
        let LayerMixer::Mamba2(shape) = v.mixers[0] else {
            panic!("{:?}", v.mixers[0]);
        };
        assert_eq!(shape.key_heads_of_values, KeyHeadsOfValues::Grouped);
        assert_eq!((shape.key_head_of(1), shape.key_head_of(2)), (0, 1));
        assert_eq!(v.mixers[2], LayerMixer::Attention);
        assert_eq!(v.mixers[3], v.mixers[0]);
        assert!(!v.gated_attention);
    }

    #[test]
    fn the_file_turns_rope_off_and_sets_the_scales() {
        let on = FAMILY.variant(&facts()).unwrap();
        assert_eq!(on.rotary_dim, None);
        assert_eq!((on.residual_scale, on.logit_scale), (None, None));
        let off = FAMILY
            .variant(&FileFacts {
                no_rope: true,
                embedding_scale: Some(12.0),
                residual_scale: Some(0.22),
                logit_scale: Some(8.0),
                ..facts()
            })
            .unwrap();
        assert_eq!(off.rotary_dim, Some(0));
        assert_eq!(off.embedding_scale, Some(12.0));
        assert_eq!(
            (off.residual_scale, off.logit_scale),
            (Some(0.22), Some(8.0))
        );
    }

    #[test]
    fn what_the_declaration_needs_is_named_when_missing() {
        let err = |f: FileFacts| FAMILY.variant(&f).unwrap_err().to_string();
        let e = err(FileFacts {
            delta_net: None,
            ..facts()
        });
        assert!(e.contains("Mamba-2"), "{e}");
        let e = err(FileFacts {
            kv_heads_per_layer: None,
            ..facts()
        });
        assert!(e.contains("per-layer KV head counts"), "{e}");
    }
}
