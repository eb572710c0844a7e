//! The engine on the hybrids whose layers carry a matrix state per sequence: Qwen3.5 (Gated
//! DeltaNet; tiny random weights, four layers of which two carry a recurrent state per
//! sequence) and Granite 4.0-H (Mamba-2, three of four layers): every speculation method (recycling, prompt
//! lookup, suffix, `auto`, a draft model, Predicted Outputs) gives plain decoding's tokens in
//! pools small enough to preempt, with the DeltaNet layers' per-position inputs in a windowed
//! space of their own or beside the attention's K/V, so a draft tree's nodes run from their
//! parents' states and an accepted path is folded into the sequence's state; the dense and
//! the mixture-of-experts variants alike. A multi-turn conversation replayed (each turn
//! re-sending the history) gives the same tokens with speculation on and off and the prefix
//! cache on and off, and with the cache on reuses what an all-attention model would: a
//! cached prefix resumes from the state kept at its last block boundary, under its own
//! `cache_salt` only.

use std::sync::Arc;

use candle_core::quantized::GgmlDType;
use engine::handle::EngineHandle;
use engine::model::testing::{
    write_tiny_granite_gguf, write_tiny_lfm2_gguf, write_tiny_qwen35_gguf, write_tiny_tokenizer,
    TinyLfm2,
};
use engine::{
    CostCurve, DraftModelSetup, EngineConfig, Model, ModelTokenizer, Request, SpecMethod,
    SpeculationConfig,
};
use kvcache::{ManagerConfig, WindowConfig};

use super::speculation::{full_length, replay, run_all};
use crate::model::granite::tiny_granite_q8;
use crate::model::qwen35::tiny_qwen35;
use crate::model::qwen35_forward::tiny_qwen35moe_q8;
use scheduler::SchedulerConfig;

const VOCAB: usize = 300;
pub(super) const BLOCK: usize = 8;

/// Which tiny hybrid an engine runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Hybrid {
    /// Qwen3.5, dense.
    Qwen35,
    /// Qwen3.5 with experts.
    Qwen35Moe,
    /// Granite 4.0-H.
    Granite,
}

/// The tiny hybrid in Q8_0 on thicket's kernels, a word-level tokenizer, and a draft model of
/// the same vocabulary (a tiny LFM2: a draft model may not itself carry recurrent state).
pub(super) fn model(kind: Hybrid) -> &'static (Model, Arc<ModelTokenizer>, Model) {
    type Loaded = std::sync::OnceLock<(Model, Arc<ModelTokenizer>, Model)>;
    static CELLS: [Loaded; 3] = [Loaded::new(), Loaded::new(), Loaded::new()];
    CELLS[kind as usize].get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let cpu = candle_core::Device::Cpu;
        let path = dir.path().join("hybrid.gguf");
        match kind {
            Hybrid::Qwen35 | Hybrid::Qwen35Moe => {
                let spec = match kind {
                    Hybrid::Qwen35Moe => tiny_qwen35moe_q8(),
                    _ => tiny_qwen35(),
                };
                assert_eq!(spec.vocab_size, VOCAB);
                write_tiny_qwen35_gguf(&path, &spec, GgmlDType::Q8_0).unwrap();
            }
            Hybrid::Granite => {
                let spec = tiny_granite_q8();
                assert_eq!(spec.vocab_size, VOCAB);
                write_tiny_granite_gguf(&path, &spec, GgmlDType::Q8_0).unwrap();
            }
        }
        let (config, weights) = engine::model::gguf::load_gguf_weights(&path, None, &cpu).unwrap();
        let model = Model::new(config, weights, cpu.clone()).unwrap();
        let draft_spec = TinyLfm2 {
            vocab_size: VOCAB,
            ..TinyLfm2::default()
        };
        let draft_path = dir.path().join("draft.gguf");
        write_tiny_lfm2_gguf(&draft_path, &draft_spec, GgmlDType::F32).unwrap();
        let (config, weights) = engine::model::gguf::load_gguf_weights(
            &draft_path,
            Some(candle_core::DType::F32),
            &cpu,
        )
        .unwrap();
        let draft = Model::new(config, weights, cpu).unwrap();
        write_tiny_tokenizer(dir.path(), VOCAB).unwrap();
        let tokenizer = ModelTokenizer::from_hf_dir(dir.path(), Vec::new()).unwrap();
        (model, Arc::new(tokenizer), draft)
    })
}

/// An engine with `num_blocks` blocks for the attending layers and, where `window_blocks`
/// says, a space of that many for the DeltaNet layers' inputs (else one space for all).
fn start(
    kind: Hybrid,
    num_blocks: usize,
    window_blocks: Option<usize>,
    prefix_caching: bool,
) -> EngineHandle {
    let (model, tokenizer, _) = model(kind);
    let config = config(kind, num_blocks, window_blocks, prefix_caching);
    let (handle, _thread) =
        engine::spawn(model.clone(), tokenizer.clone(), Vec::new(), config).unwrap();
    handle
}

/// The configuration `start` runs.
pub(super) fn config(
    kind: Hybrid,
    num_blocks: usize,
    window_blocks: Option<usize>,
    prefix_caching: bool,
) -> EngineConfig {
    let (model, _, draft) = model(kind);
    let window = model.kv_window().expect("a hybrid's layers read a window");
    EngineConfig {
        scheduler: SchedulerConfig {
            max_num_batched_tokens: 64,
            max_num_seqs: 8,
            max_model_len: (num_blocks * BLOCK - 2 * BLOCK).min(1024),
            kv: ManagerConfig {
                num_blocks,
                block_size: BLOCK,
                prefix_caching,
                watermark: 0.0,
                window: window_blocks.map(|num_blocks| WindowConfig { window, num_blocks }),
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
    }
}

/// Prompts with repeated stretches for the drafters to find.
pub(super) fn prompts() -> Vec<Vec<u32>> {
    let cycle = |from: u32, len: u32, times: usize| -> Vec<u32> {
        (0..times).flat_map(|_| from..from + len).collect()
    };
    vec![
        cycle(10, 7, 9),
        cycle(100, 13, 5),
        [cycle(200, 5, 6), cycle(40, 9, 4)].concat(),
    ]
}

fn lossless_through_preemption(kind: Hybrid) {
    let max_tokens = 40;
    let plain = start(kind, 256, None, false);
    let reference: Vec<Vec<u32>> = prompts()
        .iter()
        .map(|p| {
            run_all(&plain, vec![full_length(p.clone(), max_tokens, None)])[0]
                .token_ids
                .clone()
        })
        .collect();
    let (mut accepted, mut resumed) = (0, 0);
    for method in [
        SpecMethod::Recycling,
        SpecMethod::PromptLookup,
        SpecMethod::Suffix,
        SpecMethod::Auto,
        SpecMethod::DraftModel,
    ] {
        for window_blocks in [None, Some(120)] {
            // Fresh engines: nothing cached or learned from the plain runs. 24 blocks of 8
            // hold fewer than the three sequences' 300-odd positions: they preempt one
            // another.
            let handle = start(kind, 24, window_blocks, true);
            let outputs = run_all(
                &handle,
                prompts()
                    .into_iter()
                    .map(|p| full_length(p, max_tokens, Some(method)))
                    .collect(),
            );
            for (i, (out, want)) in outputs.iter().zip(&reference).enumerate() {
                assert_eq!(
                    &out.token_ids, want,
                    "{method:?}, {window_blocks:?}, prompt {i}"
                );
            }
            accepted += outputs
                .iter()
                .map(|o| o.usage.accepted_tokens)
                .sum::<usize>();
            let stats = handle.stats().unwrap();
            assert!(stats.scheduler.preemptions > 0, "{method:?}: {stats:?}");
            resumed += stats.cache.prefix_hit_tokens;
        }
    }
    // Preempted sequences came back through the prefix cache, from their kept states.
    assert!(
        resumed > 0,
        "no preempted sequence resumed from a kept state"
    );
    // Predicted Outputs: the plain output itself as the prediction, and a wrong one.
    for (i, want) in reference.iter().enumerate() {
        for prediction in [want.clone(), want.iter().rev().copied().collect()] {
            let handle = start(kind, 256, Some(120), true);
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
fn speculation_is_lossless_on_qwen35_through_preemption() {
    lossless_through_preemption(Hybrid::Qwen35);
}

#[test]
fn speculation_is_lossless_on_granite_through_preemption() {
    lossless_through_preemption(Hybrid::Granite);
}

#[test]
fn speculation_is_lossless_on_qwen35moe_through_preemption() {
    lossless_through_preemption(Hybrid::Qwen35Moe);
}

#[test]
fn a_multi_turn_replay_on_qwen35_is_the_same_with_cache_and_speculation_on_or_off() {
    multi_turn_replay(Hybrid::Qwen35);
}

#[test]
fn a_multi_turn_replay_on_granite_is_the_same_with_cache_and_speculation_on_or_off() {
    multi_turn_replay(Hybrid::Granite);
}

fn multi_turn_replay(kind: Hybrid) {
    let (reference, none_cached) = replay(&start(kind, 256, None, false), None);
    assert_eq!(none_cached, 0);
    for (cache, method) in [
        (true, None),
        (true, Some(SpecMethod::Auto)),
        (false, Some(SpecMethod::Auto)),
        (true, Some(SpecMethod::PromptLookup)),
    ] {
        for window_blocks in [None, Some(120)] {
            let handle = start(kind, 256, window_blocks, cache);
            let (answers, cached) = replay(&handle, method);
            assert_eq!(
                answers, reference,
                "cache {cache}, {method:?}, {window_blocks:?}"
            );
            if cache {
                // What an all-attention model reuses: each turn's whole blocks of the history
                // before it (its last token never fed). The state is kept at every boundary
                // a sequence passes, the latest one kept: measured 264 of the 339 prompt
                // tokens of turns 2-4, all of the dense reuse.
                assert!(
                    cached + 3 * BLOCK >= dense_reuse(),
                    "cache {cache}, {method:?}, {window_blocks:?}: {cached} reused of {}",
                    dense_reuse()
                );
            } else {
                assert_eq!(cached, 0);
            }
        }
    }
}

/// The prompt tokens `replay` would take from the cache with every layer attending: per
/// turn, the previous turn's history (prompt and 24 tokens, the last not fed) in whole
/// blocks, short of the new prompt's last token.
fn dense_reuse() -> usize {
    let turns = [29, 8, 30, 8];
    let (mut history, mut reuse) = (0, 0);
    for (i, len) in turns.into_iter().enumerate() {
        let prompt = history + len;
        if i > 0 {
            reuse += (prompt - 1).min(history - 1) / BLOCK * BLOCK;
        }
        history = prompt + 24;
    }
    reuse
}

#[test]
fn a_repeated_prompt_on_qwen35_resumes_from_its_kept_state_under_its_own_salt() {
    let prompt = &prompts()[0];
    let handle = start(Hybrid::Qwen35, 256, Some(120), true);
    let once = |salt: Option<&str>| {
        let mut request = Request::greedy(prompt.clone(), 8, None);
        request.cache_salt = salt.map(Arc::from);
        let out = run_all(&handle, vec![request]).remove(0);
        (out.token_ids, out.usage.cached_tokens)
    };
    let (first, cached) = once(Some("tenant-a"));
    assert_eq!(cached, 0);
    // Every whole block of the prompt but the one holding its last token.
    let hit = (prompt.len() - 1) / BLOCK * BLOCK;
    for (i, (salt, want)) in [
        (Some("tenant-b"), 0),
        (Some("tenant-a"), hit),
        (None, 0),
        (Some("tenant-b"), hit),
        (None, hit),
    ]
    .into_iter()
    .enumerate()
    {
        let (tokens, cached) = once(salt);
        assert_eq!(cached, want, "request {i} under {salt:?}");
        assert_eq!(tokens, first, "request {i}: the cache changed the output");
    }
}

#[test]
fn a_draft_model_with_recurrent_layers_is_refused_by_name() {
    let (model, tokenizer, _) = model(Hybrid::Granite);
    let mut config = config(Hybrid::Granite, 64, None, false);
    if let Some(draft) = &mut config.speculation.draft_model {
        draft.model = model.clone();
    }
    let err = engine::spawn(model.clone(), tokenizer.clone(), Vec::new(), config)
        .expect_err("a recurrent draft model starts no engine")
        .to_string();
    assert!(err.contains("recurrent"), "{err}");
}
