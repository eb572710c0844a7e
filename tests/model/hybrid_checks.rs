//! The checks every family with layers that carry state (short convolutions, Gated DeltaNet,
//! Mamba-2) passes on a quantized tiny model: the fused pass gives the candle-ops bits; a
//! prompt prefilled in chunks whose boundaries fall anywhere in the layers' windows gives the
//! token-by-token logits; every node of a draft tree gives what its root path gives run as a
//! chain, at the start of a sequence too; and the same against llama.cpp's recorded run,
//! with the prompt prefilled in chunks against its first logits. Also the loading of a tiny
//! HF checkpoint in f32, and the HF-against-GGUF check of the Gated DeltaNet families.

use engine::{Model, TokenTree};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::forward::{prefill_logits, prompt_then_tree_bits, random_tree, tree_vs_chains};
use super::llamacpp_reference::{check_recorded, largest_difference};

/// The fused pass of `model` gives the bits of its candle-ops form, a prompt and a tree.
pub(crate) fn fused_gives_candle_bits(model: &Model) {
    assert!(model.is_fused());
    let reference = model.clone().without_fused_pass();
    let (fused, candle) = (
        prompt_then_tree_bits(model),
        prompt_then_tree_bits(&reference),
    );
    let differ = fused.iter().zip(&candle).filter(|(a, b)| a != b).count();
    assert_eq!(differ, 0, "{differ} of {} logits differ", fused.len());
}

/// A random prompt of 23 tokens (from `seed`) prefilled in chunks of 2, 3, 4, 5, 7 and 23
/// gives the token-by-token bits: thicket's kernels give a row the same bits whatever else is
/// in the batch, and the recurrences step the same tokens in the same order.
pub(crate) fn chunked_prefill_gives_token_by_token(model: &Model, seed: u64) {
    let vocab = model.config().vocab_size as u32;
    let mut rng = StdRng::seed_from_u64(seed);
    let prompt: Vec<u32> = (0..23).map(|_| rng.random_range(0..vocab)).collect();
    let one_by_one = prefill_logits(model, &prompt, 1);
    for chunk in [2, 3, 4, 5, 7, 23] {
        let chunked = prefill_logits(model, &prompt, chunk);
        assert_eq!(chunked, one_by_one, "chunks of {chunk}");
    }
}

/// Random trees of 1, 2, 6 and 20 nodes (from `seed`) after an 11-token prefix, and one of
/// 8 after a single token (the layers' windows reaching before position 0): every node
/// gives its root path's bits.
pub(crate) fn tree_nodes_give_root_paths(model: &Model, seed: u64) {
    let vocab = model.config().vocab_size as u32;
    let mut rng = StdRng::seed_from_u64(seed);
    let prefix: Vec<u32> = (0..11).map(|_| rng.random_range(0..vocab)).collect();
    let check = |prefix: &[u32], tree: &TokenTree| {
        let worst = tree_vs_chains(model, prefix, tree);
        assert_eq!(
            worst,
            0.0,
            "a tree of {} after {} tokens: nodes differ from chains by {worst}",
            tree.len(),
            prefix.len()
        );
    };
    for nodes in [1, 2, 6, 20] {
        check(&prefix, &random_tree(&mut rng, nodes, vocab));
    }
    check(&prefix[..1], &random_tree(&mut rng, 8, vocab));
}

/// `model`, loaded from the GGUF of `gguf` bytes, against llama.cpp's recorded run on that
/// file (`reference`), and the prompt prefilled in chunks of 1, 2 and 4 against llama.cpp's
/// first logits, within `tolerance` of their scale.
pub(crate) fn matches_llama_cpp_in_chunks(
    model: &Model,
    gguf: &[u8],
    reference: &str,
    tolerance: f32,
) {
    let runs = check_recorded(reference, gguf, |_| model.clone(), tolerance);
    let vocab = model.config().vocab_size;
    for chunk in [1, 2, 4] {
        let all = prefill_logits(model, &super::families::PROMPT, chunk);
        let last = &all[all.len() - vocab..];
        let apart = largest_difference(last, &runs[0][0]);
        let scale = runs[0][0].iter().fold(0f32, |m, x| m.max(x.abs()));
        assert!(
            apart <= tolerance * scale,
            "chunks of {chunk}: {apart} of {scale}"
        );
    }
}

/// The HF checkpoint `write` puts in a fresh directory, loaded in f32 with an f32 KV cache
/// (the directory lives as long as the model is read).
pub(crate) fn hf_in_f32(
    write: impl FnOnce(&std::path::Path),
) -> (tempfile::TempDir, engine::Model) {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path());
    let (model, _) = engine::model::load::load_hf_model(
        dir.path(),
        engine::WeightDType::F32,
        &candle_core::Device::Cpu,
    )
    .unwrap();
    (
        dir,
        model.with_kv_dtype(engine::cpu::kv_store::KvDtype::F32),
    )
}

/// A Gated DeltaNet family loaded from HF (`hf`) and from GGUF (`gguf`): its first layer is
/// a Gated DeltaNet layer whose value heads are grouped by key head, and both give the same
/// logits.
pub(crate) fn deltanet_hf_matches_gguf(name: &str, hf: &Model, gguf: &Model) {
    use engine::model::config::{KeyHeadsOfValues, LayerMixer};
    let LayerMixer::DeltaNet(shape) = hf.config().layer_mixer(0) else {
        panic!("layer 0 is a Gated DeltaNet layer")
    };
    assert_eq!(shape.key_heads_of_values, KeyHeadsOfValues::Grouped);
    let found = super::families::compare(
        hf,
        &super::families::PROMPT,
        super::families_gguf::as_reference(gguf),
    );
    super::families::assert_close(name, &found);
}
