//! The engine on the tiny Gemma 4 (`TinyGemma4`: layers windowed at 8 positions, global
//! layers of other heads, the last two layers reading earlier layers' keys and values,
//! per-layer embeddings; Q8_0 on thicket's kernels): every drafting method gives plain
//! decoding's tokens alone with large trees and in batches mixing methods with prefill chunks
//! and preemption (prompts and trees passing the window, nodes verified on the layers that
//! read shared keys and values); and the same with the windowed layers in a space of their
//! own, against plain decoding in one space. The mixture of 26B-A4B's arrangement likewise.

use engine::{LoadedModel, SpecMethod};
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::speculation::{
    assert_lossless_alone_and_in_mixed_batches, gguf_loaded, plain_outputs, request, run_all,
    start, Setup,
};

fn loaded(spec: engine::model::testing::TinyGemma4) -> (tempfile::TempDir, LoadedModel) {
    let dir = tempfile::tempdir().unwrap();
    let spec = engine::model::testing::TinyGemma4 {
        vocab_size: 256,
        ..spec
    };
    let loaded = gguf_loaded(dir.path(), "gemma4.gguf", spec.vocab_size, |path| {
        engine::model::testing::write_tiny_gemma4_gguf(
            path,
            &spec,
            candle_core::quantized::GgmlDType::Q8_0,
        )
        .unwrap()
    });
    (dir, loaded)
}

#[test]
fn every_method_is_lossless_on_gemma4() {
    let (_dir, loaded) = loaded(Default::default());
    assert_lossless_alone_and_in_mixed_batches(&loaded);
}

#[test]
fn every_method_is_lossless_on_the_gemma4_mixture() {
    let (_dir, loaded) = loaded(engine::model::testing::TinyGemma4::mixture());
    assert_lossless_alone_and_in_mixed_batches(&loaded);
}

#[test]
fn gemma4_windowed_layers_in_a_space_of_their_own_decode_as_in_one_space() {
    let (_dir, loaded) = loaded(Default::default());
    let mut rng = StdRng::seed_from_u64(9);
    let prompts: Vec<Vec<u32>> = (0..8)
        .map(|_| {
            (0..40)
                .map(|_| rand::Rng::random_range(&mut rng, 0..256))
                .collect()
        })
        .collect();
    let reference = plain_outputs(&loaded, &prompts, 24);
    let (handle, _) = start(
        &loaded,
        Setup {
            block_size: 4,
            budget: 48,
            window: Some(kvcache::WindowConfig {
                window: 8,
                num_blocks: 96,
            }),
            ..Setup::default()
        },
    );
    let methods = [SpecMethod::None, SpecMethod::Recycling, SpecMethod::Auto];
    let requests = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| request(p, methods[i % methods.len()], 24))
        .collect();
    for (i, out) in run_all(&handle, requests).iter().enumerate() {
        assert_eq!(out.token_ids, reference[i], "request {i}");
    }
}
