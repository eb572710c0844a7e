//! The engine on a hybrid, LFM2 (tiny random weights, four layers of which two convolve):
//! every speculation method (recycling, prompt lookup, suffix, `auto`, a draft model that is
//! itself the hybrid in f32, Predicted Outputs) gives plain decoding's tokens in pools small
//! enough to preempt, with the convolution layers' inputs in a windowed space of their own; a
//! repeated prompt is served from the prefix cache, only under its own `cache_salt`; and a
//! multi-turn conversation replayed (each turn re-sending the history) gives the same tokens
//! with the prefix cache on and off and speculation on and off, the combination other engines
//! get wrong on hybrids.

use std::sync::Arc;

use candle_core::quantized::GgmlDType;
use engine::handle::EngineHandle;
use engine::model::testing::{write_tiny_lfm2_gguf, write_tiny_tokenizer, TinyLfm2};
use engine::{
    CostCurve, DraftModelSetup, EngineConfig, Model, ModelTokenizer, Request, SpecMethod,
    SpeculationConfig,
};
use kvcache::{ManagerConfig, WindowConfig};

use super::speculation::{full_length, replay, run_all};
use scheduler::SchedulerConfig;

const VOCAB: usize = 300;
const BLOCK: usize = 8;

/// The tiny LFM2, kept in Q8_0 on thicket's kernels, its word-level tokenizer, and the same
/// weights in f32 (a draft model: a hybrid drafting for a hybrid).
fn model() -> &'static (Model, Arc<ModelTokenizer>, Model) {
    static MODEL: std::sync::OnceLock<(Model, Arc<ModelTokenizer>, Model)> =
        std::sync::OnceLock::new();
    MODEL.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let spec = TinyLfm2 {
            vocab_size: VOCAB,
            ..TinyLfm2::default()
        };
        let load = |dtype: GgmlDType, dense: Option<candle_core::DType>| {
            let path = dir.path().join(format!("lfm2-{dtype:?}.gguf"));
            write_tiny_lfm2_gguf(&path, &spec, dtype).unwrap();
            let (config, weights) =
                engine::model::gguf::load_gguf_weights(&path, dense, &candle_core::Device::Cpu)
                    .unwrap();
            Model::new(config, weights, candle_core::Device::Cpu).unwrap()
        };
        let model = load(GgmlDType::Q8_0, None);
        let draft = load(GgmlDType::F32, Some(candle_core::DType::F32));
        write_tiny_tokenizer(dir.path(), VOCAB).unwrap();
        let tokenizer = ModelTokenizer::from_hf_dir(dir.path(), Vec::new()).unwrap();
        (model, Arc::new(tokenizer), draft)
    })
}

/// An engine with `num_blocks` blocks for the attending layers and, where `window_blocks`
/// says, a space of that many for the convolution layers' inputs (else one space for all).
fn start(num_blocks: usize, window_blocks: Option<usize>, prefix_caching: bool) -> EngineHandle {
    let (model, tokenizer, draft) = model();
    let config = EngineConfig {
        scheduler: SchedulerConfig {
            max_num_batched_tokens: 64,
            max_num_seqs: 8,
            max_model_len: (num_blocks * BLOCK - 2 * BLOCK).min(1024),
            kv: ManagerConfig {
                num_blocks,
                block_size: BLOCK,
                prefix_caching,
                watermark: 0.0,
                window: window_blocks.map(|num_blocks| WindowConfig {
                    window: 3,
                    num_blocks,
                }),
            },
        },
        max_pending: 64,
        speculation: SpeculationConfig {
            cost: CostCurve::flat(),
            draft_model: Some(DraftModelSetup {
                model: draft.clone(),
                k_config: vec![2, 1, 1],
                kv: ManagerConfig {
                    num_blocks: 64,
                    block_size: BLOCK,
                    prefix_caching: true,
                    watermark: 0.0,
                    window: None,
                },
            }),
            ..SpeculationConfig::default()
        },
        kv_prefault: false,
        state_snapshots: Default::default(),
    };
    let (handle, _thread) =
        engine::spawn(model.clone(), tokenizer.clone(), Vec::new(), config).unwrap();
    handle
}

/// Prompts with repeated stretches for the drafters to find.
fn prompts() -> Vec<Vec<u32>> {
    let cycle = |from: u32, len: u32, times: usize| -> Vec<u32> {
        (0..times).flat_map(|_| from..from + len).collect()
    };
    vec![
        cycle(10, 7, 9),
        cycle(100, 13, 5),
        [cycle(200, 5, 6), cycle(40, 9, 4)].concat(),
    ]
}

#[test]
fn speculation_is_lossless_on_a_hybrid_through_preemption() {
    let max_tokens = 40;
    let plain = start(256, None, false);
    let reference: Vec<Vec<u32>> = prompts()
        .iter()
        .map(|p| {
            run_all(&plain, vec![full_length(p.clone(), max_tokens, None)])[0]
                .token_ids
                .clone()
        })
        .collect();
    let mut accepted = 0;
    for method in [
        SpecMethod::Recycling,
        SpecMethod::PromptLookup,
        SpecMethod::Suffix,
        SpecMethod::Auto,
        SpecMethod::DraftModel,
    ] {
        // Fresh engines: nothing cached or learned from the plain runs. 24 blocks of 8 hold
        // fewer than the three sequences' 300-odd positions: they preempt one another. The
        // convolution layers' space keeps each sequence's last positions only.
        let handle = start(24, Some(40), true);
        let outputs = run_all(
            &handle,
            prompts()
                .into_iter()
                .map(|p| full_length(p, max_tokens, Some(method)))
                .collect(),
        );
        for (i, (out, want)) in outputs.iter().zip(&reference).enumerate() {
            assert_eq!(&out.token_ids, want, "{method:?}, prompt {i}");
        }
        let mine: usize = outputs.iter().map(|o| o.usage.accepted_tokens).sum();
        if method == SpecMethod::DraftModel {
            // The f32 draft agrees with its Q8_0 target on most tokens.
            assert!(mine > 0, "the draft model never had a token accepted");
        }
        accepted += mine;
        let stats = handle.stats().unwrap();
        assert!(stats.scheduler.preemptions > 0, "{method:?}: {stats:?}");
        assert_eq!(stats.cache.window.expect("a windowed space").total, 40);
    }
    // Predicted Outputs: the plain output itself as the prediction, and a wrong one.
    for (i, want) in reference.iter().enumerate() {
        for prediction in [want.clone(), want.iter().rev().copied().collect()] {
            let handle = start(256, Some(40), true);
            let mut request = full_length(prompts()[i].clone(), max_tokens, Some(SpecMethod::Auto));
            request.prediction = Some(prediction.into());
            let out = run_all(&handle, vec![request]);
            assert_eq!(&out[0].token_ids, want, "prediction, prompt {i}");
            accepted += out[0].usage.accepted_tokens;
        }
    }
    assert!(
        accepted > 0,
        "no draft was ever accepted: the test verifies nothing"
    );
}

#[test]
fn a_repeated_prompt_on_a_hybrid_comes_from_the_prefix_cache() {
    let prompt = &prompts()[1];
    for window_blocks in [None, Some(64)] {
        let handle = start(256, window_blocks, true);
        let first = run_all(&handle, vec![Request::greedy(prompt.clone(), 16, None)]);
        let again = run_all(&handle, vec![Request::greedy(prompt.clone(), 16, None)]);
        assert_eq!(first[0].token_ids, again[0].token_ids, "{window_blocks:?}");
        assert_eq!(first[0].usage.cached_tokens, 0);
        // Every whole block of the prompt but the one holding its last token.
        assert!(
            again[0].usage.cached_tokens >= prompt.len() - BLOCK - 1,
            "{window_blocks:?}: {} of {} prompt tokens cached",
            again[0].usage.cached_tokens,
            prompt.len()
        );
    }
}

#[test]
fn a_multi_turn_replay_on_a_hybrid_is_the_same_with_cache_and_speculation_on_or_off() {
    let (reference, none_cached) = replay(&start(256, None, false), None);
    assert_eq!(none_cached, 0);
    let mut dense_like = None;
    for (cache, method) in [
        (true, None),
        (true, Some(SpecMethod::Auto)),
        (false, Some(SpecMethod::Auto)),
        (true, Some(SpecMethod::PromptLookup)),
    ] {
        for window_blocks in [None, Some(64)] {
            let handle = start(256, window_blocks, cache);
            let (answers, cached) = replay(&handle, method);
            assert_eq!(
                answers, reference,
                "cache {cache}, {method:?}, {window_blocks:?}"
            );
            if cache {
                // Turns 2-4 each resume past the previous turn's whole blocks, as many with
                // the convolutions' inputs in a windowed space as with every layer's rows
                // kept (measured: 264 of the 339 prompt tokens of turns 2-4).
                assert!(
                    cached > 200,
                    "cache {cache}, {method:?}: {cached} tokens reused"
                );
                let reused = *dense_like.get_or_insert(cached);
                assert_eq!(reused, cached, "{method:?}, {window_blocks:?}");
            } else {
                assert_eq!(cached, 0);
            }
        }
    }
}

#[test]
fn a_salt_isolates_a_hybrids_cached_state_as_it_isolates_blocks() {
    // The convolution rows of a cached prefix live in the windowed space's cached blocks,
    // under the same salted hashes as the attending layers' K/V.
    let prompt = &prompts()[0];
    let handle = start(256, Some(64), true);
    let once = |salt: Option<&str>| {
        let mut request = Request::greedy(prompt.clone(), 8, None);
        request.cache_salt = salt.map(Arc::from);
        let out = run_all(&handle, vec![request]).remove(0);
        (out.token_ids, out.usage.cached_tokens)
    };
    let (first, cached) = once(Some("tenant-a"));
    assert_eq!(cached, 0);
    let hit = prompt.len() / BLOCK * BLOCK - BLOCK;
    for (i, (salt, want)) in [
        (Some("tenant-b"), 0),
        (Some("tenant-a"), hit),
        (None, 0),
        (Some("tenant-b"), hit),
    ]
    .into_iter()
    .enumerate()
    {
        let (tokens, cached) = once(salt);
        assert!(
            if want == 0 {
                cached == 0
            } else {
                cached >= want
            },
            "request {i} under {salt:?}: {cached} cached"
        );
        assert_eq!(tokens, first, "request {i}: the salt changed the output");
    }
}
