//! LFM2 (Liquid AI's 350M to 2.6B hybrids): most layers mix positions with a gated short
//! convolution (`LayerMixer::ShortConv`, three positions wide in every released checkpoint)
//! and a few attend, with a per-head RMSNorm of queries and keys. A GGUF file says which by
//! its per-layer KV head counts (`lfm2.attention.head_count_kv`, 0 for a convolution layer)
//! and gives the width as `lfm2.shortconv.l_cache`; the final norm is `token_embd_norm`
//! (`model.embedding_norm` in HF checkpoints, whose `layer_types` say `conv` or
//! `full_attention`, and whose tensors have names of their own: `hf_renames`). SwiGLU MLP,
//! RoPE on halves, no biases.

use super::{Architecture, Family, Mixers, Windows};
use crate::model::config::{Activation, RopeStyle};

/// The declaration.
pub const FAMILY: Family = Family {
    architecture: Architecture::Lfm2,
    gguf: "lfm2",
    hf: &["Lfm2ForCausalLM", "lfm2"],
    attention_bias: false,
    qk_norm: true,
    fused_projections: false,
    post_norms: false,
    activation: Activation::Silu,
    scaled_embedding: false,
    gguf_rope_style: RopeStyle::Halves,
    hf_norm_offset: 0.0,
    windows: Windows::WhereSet,
    local_rope_theta: None,
    gguf_residual_query_scale_at: &[],
    gguf_rope_switch: false,
    experts: None,
    mixers: Mixers::ShortConvWhereNoKv,
    attention_scale: None,
    value_norm: false,
    hf_renames: &[
        ("input_layernorm", "operator_norm"),
        ("post_attention_layernorm", "ffn_norm"),
        ("mlp.gate_proj", "feed_forward.w1"),
        ("mlp.up_proj", "feed_forward.w3"),
        ("mlp.down_proj", "feed_forward.w2"),
        ("self_attn.o_proj", "self_attn.out_proj"),
        ("self_attn.q_norm", "self_attn.q_layernorm"),
        ("self_attn.k_norm", "self_attn.k_layernorm"),
        ("model.norm", "model.embedding_norm"),
    ],
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::arch::FileFacts;
    use crate::model::config::LayerMixer;

    fn facts(kv: Option<Vec<usize>>, kernel: Option<usize>) -> FileFacts {
        FileFacts {
            num_layers: 3,
            hidden_size: 8,
            kv_heads_per_layer: kv,
            conv_kernel: kernel,
            ..FileFacts::default()
        }
    }

    #[test]
    fn layers_without_kv_heads_convolve() {
        let v = FAMILY
            .variant(&facts(Some(vec![0, 2, 0]), Some(3)))
            .unwrap();
        let conv = LayerMixer::ShortConv { kernel: 3 };
        assert_eq!(v.mixers, [conv, LayerMixer::Attention, conv]);
    }

    #[test]
    fn what_the_declaration_needs_is_named_when_missing() {
        let err = |f: FileFacts| FAMILY.variant(&f).unwrap_err().to_string();
        assert!(err(facts(None, Some(3))).contains("per-layer KV head counts"));
        assert!(err(facts(Some(vec![0, 2, 0]), None)).contains("short convolution's width"));
        assert!(err(facts(Some(vec![0, 2]), Some(3))).contains("2 per-layer KV head counts"));
        // A family whose every layer attends refuses a layer without KV heads.
        let llama = crate::model::arch::Architecture::Llama.family();
        let e = llama
            .variant(&facts(Some(vec![0, 2, 2]), None))
            .unwrap_err();
        assert!(e.to_string().contains("without KV heads"), "{e}");
    }
}
