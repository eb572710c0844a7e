//! Which models thicket's CUDA kernels take: heads of a multiple of 8 dimensions up to
//! `MAX_HEAD_DIM`, and the llama / qwen2 decoder with any RoPE scaling (the fused f16 pass and
//! the ops pass attend with no QK norm, post norms, sliding windows, GELU or soft-caps). A
//! model they do not take runs on candle's ops on the GPU with attention and KV on the host
//! (`backend::for_model` says so in a warning). Plain data, testable without a GPU.

use crate::model::config::{LayerAttention, ModelConfig, Variant};

/// The widest head the attention kernels hold in shared memory (`MAX_HEAD_DIM` in
/// `kernels.cu`).
pub const MAX_HEAD_DIM: usize = 256;

/// Whether the CUDA kernels take a model of `cfg`'s shape and family; if not, why.
pub fn kernels_take(cfg: &ModelConfig) -> Result<(), String> {
    if !cfg.head_dim.is_multiple_of(8) || cfg.head_dim > MAX_HEAD_DIM {
        return Err(format!(
            "heads of {} dimensions; its kernels take multiples of 8 up to {MAX_HEAD_DIM}",
            cfg.head_dim
        ));
    }
    // The kernels read the model's RoPE tables, scaled as the file says (llama3, YaRN,
    // LongRoPE); every other departure from the llama decoder is one they do not make.
    let mut departs = cfg.variant.clone();
    departs.rope_scaling = Default::default();
    if departs
        .layers
        .iter()
        .all(|l| *l == LayerAttention::default())
    {
        departs.layers.clear();
    }
    if departs != Variant::default() || cfg.attention_width() != cfg.hidden_size {
        return Err(format!(
            "the {} family; its kernels run the llama and qwen2 decoders only (no QK norm, \
             post norms, sliding windows, GELU, soft-caps, heads wider than the residual or \
             layers that mix positions without attention)",
            cfg.architecture.as_str()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::config::{Architecture, LayerMixer, RopeScaling, RopeStyle};

    fn llama(head_dim: usize) -> ModelConfig {
        ModelConfig {
            architecture: Architecture::Llama,
            vocab_size: 8,
            hidden_size: 4 * head_dim,
            intermediate_size: 32,
            num_layers: 2,
            num_heads: 4,
            num_kv_heads: 2,
            head_dim,
            rope_theta: 10_000.0,
            rope_style: RopeStyle::Halves,
            rms_norm_eps: 1e-6,
            max_position_embeddings: 16,
            attention_bias: false,
            variant: Variant::default(),
        }
    }

    #[test]
    fn the_llama_decoder_with_heads_the_kernels_hold_is_taken() {
        assert_eq!(kernels_take(&llama(64)), Ok(()));
        assert_eq!(kernels_take(&llama(256)), Ok(()));
        // Llama 3.1's scaled RoPE is in the tables the kernels read; full layers declared
        // one by one are the baseline.
        let mut scaled = llama(64);
        scaled.variant.rope_scaling = RopeScaling::Linear { factor: 2.0 };
        scaled.variant.layers = vec![LayerAttention::default(); 2];
        assert_eq!(kernels_take(&scaled), Ok(()));
    }

    #[test]
    fn heads_the_kernels_cannot_hold_are_refused_with_their_width() {
        for dim in [12, 260] {
            let why = kernels_take(&llama(dim)).unwrap_err();
            assert!(why.contains(&format!("heads of {dim} dimensions")), "{why}");
        }
    }

    #[test]
    fn a_family_that_departs_from_llama_is_refused_by_name() {
        let mut gemma = llama(64);
        gemma.architecture = Architecture::Gemma3;
        gemma.variant.qk_norm = true;
        let why = kernels_take(&gemma).unwrap_err();
        assert!(why.contains("the gemma3 family"), "{why}");

        let mut windowed = llama(64);
        windowed.architecture = Architecture::Mistral;
        windowed.variant.layers = vec![LayerAttention::default(); 2];
        windowed.variant.layers[1].window = Some(4);
        assert!(kernels_take(&windowed).is_err());

        let mut wide = llama(64);
        wide.architecture = Architecture::Qwen3;
        wide.num_heads = 8;
        assert!(kernels_take(&wide).unwrap_err().contains("qwen3"));

        // A hybrid's convolution layers are not attention: candle's ops run it.
        let mut hybrid = llama(64);
        hybrid.architecture = Architecture::Lfm2;
        hybrid.variant.mixers = vec![LayerMixer::ShortConv { kernel: 3 }, LayerMixer::Attention];
        let why = kernels_take(&hybrid).unwrap_err();
        assert!(why.contains("the lfm2 family"), "{why}");
    }
}
