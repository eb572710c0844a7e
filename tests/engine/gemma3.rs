//! The engine's features on a real windowed model, Gemma 3 270M (alias `gemma3-270m`: 15 of
//! its 18 layers see only the last 512 positions, its tokenizer is SentencePiece): greedy
//! speculation equals plain decoding for every drafter on prompts longer than the window (so
//! draft trees are verified past it) in pools small enough to preempt, the windowed layers
//! keeping their KV in a space of their own that holds less than one sequence (against plain
//! decoding with every layer in one space); a prompt seen before is served from the prefix
//! cache with the same output, in both layouts; `n` samples fork one prefill and are
//! reproducible by seed; and a JSON schema holds for its output (checked with `jsonschema`).

use std::sync::OnceLock;

use engine::constraint::ConstraintSpec;
use engine::handle::EngineHandle;
use engine::{
    CostCurve, EngineConfig, LoadedModel, Request, SampleOutput, SamplingParams, SpecMethod,
    SpecRequest, SpeculationConfig, StopConditions,
};
use kvcache::{ManagerConfig, WindowConfig};
use scheduler::SchedulerConfig;
use serde_json::json;

fn gemma3() -> &'static LoadedModel {
    static MODEL: OnceLock<LoadedModel> = OnceLock::new();
    MODEL.get_or_init(|| {
        engine::load_model("gemma3-270m", &engine::LoadOptions::default())
            .expect("load gemma3-270m")
    })
}

/// An engine with `num_blocks` blocks for every layer's KV, or for the full-attention layers'
/// where `window_blocks` gives the windowed layers a space of their own.
fn start(num_blocks: usize, window_blocks: Option<usize>) -> EngineHandle {
    let loaded = gemma3();
    let config = EngineConfig {
        scheduler: SchedulerConfig {
            max_num_batched_tokens: 256,
            max_num_seqs: 8,
            max_model_len: 1024,
            kv: ManagerConfig {
                num_blocks,
                block_size: 16,
                prefix_caching: true,
                watermark: 0.0,
                window: window_blocks.map(|num_blocks| WindowConfig {
                    window: 512,
                    num_blocks,
                }),
            },
        },
        max_pending: 64,
        // Rows priced as free: `auto` drafts wherever it expects an acceptance (the engine's
        // own curve, measured at `serve`, prices Gemma's rows as they cost).
        speculation: SpeculationConfig {
            cost: CostCurve::flat(),
            ..SpeculationConfig::default()
        },
        kv_prefault: false,
        state_snapshots: Default::default(),
    };
    let (handle, _thread) = engine::spawn(
        loaded.model.clone(),
        std::sync::Arc::new(loaded.tokenizer.clone()),
        loaded.tokenizer.eos_ids().to_vec(),
        config,
    )
    .expect("start the engine on gemma3-270m");
    handle
}

fn request(prompt: &[u32], method: SpecMethod, max_tokens: usize) -> Request {
    Request::greedy(prompt.to_vec(), max_tokens, Some(method))
}

fn run_all(handle: &EngineHandle, requests: Vec<Request>) -> Vec<SampleOutput> {
    handle
        .submit_all(requests)
        .unwrap()
        .into_iter()
        .flat_map(|s| s.wait().unwrap())
        .collect()
}

/// Prompts past the 512-position window, with repeated stretches for the drafters to find.
fn long_prompts() -> Vec<Vec<u32>> {
    let tokenizer = &gemma3().tokenizer;
    let texts = [
        "def add(a, b):\n    return a + b\n\n".repeat(45) + "def sub(a, b):\n",
        "The quick brown fox jumps over the lazy dog. ".repeat(60) + "The quick",
        (1..200).map(|i| format!("{i}, ")).collect::<String>(),
    ];
    let prompts: Vec<Vec<u32>> = texts.iter().map(|t| tokenizer.encode(t).unwrap()).collect();
    for p in &prompts {
        assert!(
            p.len() > 560,
            "a prompt of {} tokens stays inside the window",
            p.len()
        );
    }
    prompts
}

#[test]
fn speculation_is_lossless_past_gemma3s_window() {
    let prompts = long_prompts();
    let max_tokens = 48;
    let plain = start(512, None);
    let reference: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| {
            run_all(&plain, vec![request(p, SpecMethod::None, max_tokens)])[0]
                .token_ids
                .clone()
        })
        .collect();
    let methods = [
        SpecMethod::Recycling,
        SpecMethod::PromptLookup,
        SpecMethod::Suffix,
        SpecMethod::Auto,
    ];
    for method in methods {
        // Fresh engines: nothing cached or learned from the plain runs. 110 blocks of 16 hold
        // fewer than the three sequences' 2,000-odd positions: they preempt one another. The
        // windowed layers' 50 blocks hold 800 positions, less than any one sequence, and
        // just what one sequence's window and a step of 256 rows need.
        let handle = start(110, Some(50));
        let outputs = run_all(
            &handle,
            prompts
                .iter()
                .map(|p| request(p, method, max_tokens))
                .collect(),
        );
        let accepted: usize = outputs.iter().map(|o| o.usage.accepted_tokens).sum();
        for (i, (out, want)) in outputs.iter().zip(&reference).enumerate() {
            assert_eq!(&out.token_ids, want, "{method:?}, prompt {i}");
        }
        let stats = handle.stats().unwrap();
        assert!(stats.scheduler.preemptions > 0, "{method:?}: {stats:?}");
        let window = stats.cache.window.expect("a windowed space");
        assert_eq!(window.total, 50);
        assert!(accepted > 0, "{method:?} never had a draft accepted");
    }
}

#[test]
fn a_repeated_prompt_comes_from_the_prefix_cache_with_the_same_output() {
    let prompt = &long_prompts()[1];
    for window_blocks in [None, Some(200)] {
        let handle = start(512, window_blocks);
        let first = run_all(&handle, vec![request(prompt, SpecMethod::None, 24)]);
        let again = run_all(&handle, vec![request(prompt, SpecMethod::None, 24)]);
        assert_eq!(first[0].token_ids, again[0].token_ids, "{window_blocks:?}");
        assert_eq!(first[0].usage.cached_tokens, 0);
        // Every whole block of the prompt but the one holding its last token: the windowed
        // space let go of the prompt's head while decoding, but kept it cached.
        assert!(
            again[0].usage.cached_tokens >= prompt.len() - 16 - 1,
            "{window_blocks:?}: {} of {} prompt tokens cached",
            again[0].usage.cached_tokens,
            prompt.len()
        );
    }
}

#[test]
fn n_samples_fork_one_prefill_and_repeat_by_seed() {
    let prompt = gemma3().tokenizer.encode("Once upon a time").unwrap();
    let handle = start(512, None);
    let sampled = |seed| Request {
        prompt: prompt.clone(),
        sampling: SamplingParams {
            temperature: 1.0,
            seed: Some(seed),
            ..SamplingParams::default()
        },
        stop: StopConditions {
            max_tokens: 24,
            ..StopConditions::default()
        },
        n: 3,
        speculation: None,
        constraint: None,
        thinking: None,
        prediction: None,
        cache_salt: None,
        pooling: None,
    };
    let a = run_all(&handle, vec![sampled(7)]);
    let b = run_all(&handle, vec![sampled(7)]);
    assert_eq!(a.len(), 3);
    let ids = |outs: &[SampleOutput]| outs.iter().map(|o| o.token_ids.clone()).collect::<Vec<_>>();
    assert_eq!(ids(&a), ids(&b), "the same seed gives the same samples");
    let distinct: std::collections::HashSet<_> = ids(&a).into_iter().collect();
    assert!(
        distinct.len() > 1,
        "three samples, all alike: {:?}",
        ids(&a)
    );
}

#[test]
fn a_json_schema_holds_on_gemma3() {
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "city": {"enum": ["Paris", "London", "Rome"]}
        },
        "required": ["name", "age", "city"],
        "additionalProperties": false
    });
    let prompt = gemma3()
        .tokenizer
        .encode("A person called Ada who lives in Rome, as JSON:\n")
        .unwrap();
    let handle = start(512, None);
    let validator = jsonschema::validator_for(&schema).unwrap();
    for (method, temperature) in [(SpecMethod::Auto, 0.0), (SpecMethod::PromptLookup, 0.8)] {
        let out = run_all(
            &handle,
            vec![Request {
                prompt: prompt.clone(),
                sampling: SamplingParams {
                    temperature,
                    seed: Some(3),
                    ..SamplingParams::default()
                },
                stop: StopConditions {
                    max_tokens: 120,
                    ..StopConditions::default()
                },
                n: 1,
                speculation: Some(SpecRequest {
                    method,
                    max_draft_tokens: None,
                }),
                constraint: Some(ConstraintSpec::JsonSchema(schema.clone())),
                thinking: None,
                prediction: None,
                cache_salt: None,
                pooling: None,
            }],
        );
        let value: serde_json::Value = serde_json::from_str(&out[0].text)
            .unwrap_or_else(|e| panic!("{method:?}: {e}: {:?}", out[0].text));
        assert!(validator.is_valid(&value), "{method:?}: {value}");
    }
}
