//! Pooling requests through the engine: a prefill-only request (`Request::pooling`) ends at
//! its last prompt token with that token's final-normed state or some of its logits, and
//! shares steps with generation. On a tiny random Qwen3 (f32, f32 K/V) the states and logits
//! are candle-transformers' `qwen3` ones within 1e-4, for prompts that fill one step or
//! several; generation beside pooling gives the tokens it gives alone; a prompt sent again
//! reads its prefix from the cache and gets the same answer. On the tiny Qwen3.5 hybrid the
//! same holds where a cached prefix resumes from a recurrent-state snapshot.
//! `decoder_pooler` turns the engine into the pooling routes' handle: embeddings come back
//! normalized, the model's end token appended where its tokenizer says inputs end with it.

use std::sync::Arc;

use candle_core::{Device, IndexOp, Tensor};
use candle_transformers::models::qwen3;
use engine::cpu::kv_store::KvDtype;
use engine::encoder::{decoder_pooler, DecoderTask, EncoderInput};
use engine::handle::EngineHandle;
use engine::model::config::Architecture;
use engine::model::testing::{write_tiny_tokenizer, TinyModelSpec};
use engine::request::{Event, Pooling, Usage};
use engine::{CostCurve, EngineConfig, ModelTokenizer, Request, SpeculationConfig};
use kvcache::ManagerConfig;
use scheduler::SchedulerConfig;

use super::qwen35::{config as hybrid_config, model as hybrid_model, Hybrid};
use crate::support::fixtures::tiny_model;

const VOCAB: usize = 300;
const BLOCK: usize = 8;
const TOLERANCE: f32 = 1e-4;

fn spec() -> TinyModelSpec {
    TinyModelSpec {
        architecture: Architecture::Qwen3,
        vocab_size: VOCAB,
        hidden_size: 64,
        intermediate_size: 96,
        num_layers: 3,
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: Some(32),
        seed: 23,
        ..TinyModelSpec::default()
    }
}

/// The tiny Qwen3's engine (steps of at most 32 tokens, so that a long prompt takes
/// several) and its folder.
fn start(add_eos: bool) -> (tempfile::TempDir, EngineHandle) {
    start_on(add_eos, true)
}

/// [`start`] on the fused CPU pass, or on candle's ops (`fused` false).
fn start_on(add_eos: bool, fused: bool) -> (tempfile::TempDir, EngineHandle) {
    let (dir, model) = tiny_model(&spec());
    let model = model.with_kv_dtype(KvDtype::F32);
    let model = match fused {
        true => model,
        false => model.without_fused_pass(),
    };
    write_tiny_tokenizer(dir.path(), VOCAB).unwrap();
    let tokenizer_config = serde_json::json!({"eos_token": "<2>", "add_eos_token": add_eos});
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        tokenizer_config.to_string(),
    )
    .unwrap();
    let tokenizer = ModelTokenizer::from_hf_dir(dir.path(), Vec::new()).unwrap();
    let config = engine_config(32, 256, BLOCK);
    let (handle, _thread) =
        engine::spawn(model, Arc::new(tokenizer), vec![2], config).expect("start the engine");
    (dir, handle)
}

/// An engine of 128 blocks of `block_size` with prefix caching, steps of `step_tokens`
/// tokens, sequences of `max_model_len`, drafting on a flat cost curve.
pub(super) fn engine_config(
    step_tokens: usize,
    max_model_len: usize,
    block_size: usize,
) -> EngineConfig {
    EngineConfig {
        scheduler: SchedulerConfig {
            max_num_batched_tokens: step_tokens,
            max_num_seqs: 8,
            max_model_len,
            kv: ManagerConfig {
                num_blocks: 128,
                block_size,
                prefix_caching: true,
                watermark: 0.0,
                window: None,
            },
        },
        max_pending: 64,
        speculation: SpeculationConfig {
            cost: CostCurve::flat(),
            ..SpeculationConfig::default()
        },
        kv_prefault: false,
        state_snapshots: Default::default(),
    }
}

/// candle-transformers' Qwen3 on the same folder: every position's final-normed state and
/// the last position's logits.
fn reference(dir: &std::path::Path, prompt: &[u32]) -> (Vec<f32>, Vec<f32>) {
    let cfg: qwen3::Config =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let file = dir.join("model.safetensors");
    // SAFETY: the file is not modified while mapped.
    let vb = unsafe {
        candle_nn::VarBuilder::from_mmaped_safetensors(
            &[file],
            candle_core::DType::F32,
            &Device::Cpu,
        )
        .unwrap()
    };
    let input = Tensor::new(prompt, &Device::Cpu)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    let mut base = qwen3::Model::new(&cfg, vb.clone()).unwrap();
    let states = base.forward(&input, 0).unwrap();
    let last = states.i((0, prompt.len() - 1)).unwrap().to_vec1().unwrap();
    let mut lm = qwen3::ModelForCausalLM::new(&cfg, vb).unwrap();
    let logits = lm
        .forward(&input, 0)
        .unwrap()
        .i((0, 0))
        .unwrap()
        .to_vec1()
        .unwrap();
    (last, logits)
}

/// Runs `request` to its pooled answer.
fn pooled(engine: &EngineHandle, request: Request) -> (Vec<f32>, Usage) {
    let stream = engine.submit(request).expect("submitted");
    match stream.recv() {
        Some(Event::Pooled { values, usage }) => (values, usage),
        Some(Event::Error(e)) => panic!("the request failed: {e}"),
        Some(other) => panic!("a pooling request got {other:?}"),
        None => panic!("the engine stopped"),
    }
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn prompt(len: usize, from: u32) -> Vec<u32> {
    (0..len as u32).map(|i| 3 + (from + i * 7) % 290).collect()
}

#[test]
fn pooled_states_and_logits_are_candle_qwen3s() {
    for fused in [true, false] {
        pooled_match_candle(fused);
    }
}

fn pooled_match_candle(fused: bool) {
    let (dir, engine) = start_on(false, fused);
    for (len, from) in [(1, 0), (5, 4), (31, 9), (77, 50)] {
        let prompt = prompt(len, from);
        let (state, logits) = reference(dir.path(), &prompt);
        let scale = state.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert!(scale > 0.1, "degenerate states (max {scale})");
        let (ours, usage) = pooled(&engine, Request::pooling(prompt.clone(), Pooling::State));
        assert_eq!(usage.prompt_tokens, len);
        assert_eq!(usage.completion_tokens, 0);
        let diff = max_diff(&ours, &state);
        assert!(
            diff < TOLERANCE,
            "{len} tokens (fused {fused}): state differs by {diff}"
        );
        let asked: Arc<[u32]> = Arc::from([7u32, 250, 3]);
        let (ours, _) = pooled(
            &engine,
            Request::pooling(prompt.clone(), Pooling::Logits(Arc::clone(&asked))),
        );
        let theirs: Vec<f32> = asked.iter().map(|&t| logits[t as usize]).collect();
        let diff = max_diff(&ours, &theirs);
        assert!(
            diff < TOLERANCE,
            "{len} tokens (fused {fused}): logits differ by {diff}"
        );
    }
}

#[test]
fn a_prompt_sent_again_reads_its_prefix_from_the_cache_and_pools_the_same() {
    let (_dir, engine) = start(false);
    let prompt = prompt(61, 5);
    let (first, usage) = pooled(&engine, Request::pooling(prompt.clone(), Pooling::State));
    assert_eq!(usage.cached_tokens, 0);
    let (again, usage) = pooled(&engine, Request::pooling(prompt.clone(), Pooling::State));
    assert!(usage.cached_tokens >= 56, "{usage:?}");
    let diff = max_diff(&first, &again);
    assert!(
        diff < TOLERANCE,
        "the cached prefix changed the state by {diff}"
    );
    // A generating request with that prompt reads the pooling request's blocks.
    let stream = engine
        .submit(Request::greedy(prompt, 4, None))
        .expect("submitted");
    let outputs = stream.wait().expect("generated");
    assert!(
        outputs[0].usage.cached_tokens >= 56,
        "{:?}",
        outputs[0].usage
    );
}

#[test]
fn generation_beside_pooling_gives_the_tokens_it_gives_alone() {
    let (_dir, engine) = start(false);
    let generate = |engine: &EngineHandle| {
        let request = Request::greedy(prompt(20, 1), 24, None);
        engine.submit(request).expect("submitted")
    };
    let alone = generate(&engine).wait().expect("generated")[0]
        .token_ids
        .clone();
    let (_dir2, fresh) = start(false);
    let long = prompt(90, 13);
    let alone_state = pooled(&fresh, Request::pooling(long.clone(), Pooling::State)).0;
    // Both in flight at once, in one engine that has seen neither prompt.
    let (_dir3, engine) = start(false);
    let pooling = engine
        .submit(Request::pooling(long, Pooling::State))
        .expect("submitted");
    let beside = generate(&engine).wait().expect("generated")[0]
        .token_ids
        .clone();
    let state = match pooling.recv() {
        Some(Event::Pooled { values, .. }) => values,
        other => panic!("{other:?}"),
    };
    assert_eq!(beside, alone);
    assert!(max_diff(&state, &alone_state) < TOLERANCE);
}

#[test]
fn a_pooling_request_is_one_sample_without_a_format_or_a_prediction() {
    let (_dir, engine) = start(false);
    let base = || Request::pooling(vec![5, 6, 7], Pooling::State);
    let cases = [
        ("n", Request { n: 2, ..base() }),
        (
            "prediction",
            Request {
                prediction: Some(Arc::from([1u32, 2])),
                ..base()
            },
        ),
        (
            "pooling",
            Request::pooling(vec![5], Pooling::Logits(Arc::from([VOCAB as u32]))),
        ),
        (
            "pooling",
            Request::pooling(vec![5], Pooling::Logits(Arc::from([]))),
        ),
    ];
    for (field, request) in cases {
        match engine.submit(request) {
            Err(engine::handle::SubmitError::Invalid(e)) => assert_eq!(e.field, field, "{e}"),
            other => panic!("{field}: {other:?}"),
        }
    }
}

#[test]
fn the_pooling_handle_normalizes_and_appends_the_end_token_the_tokenizer_asks_for() {
    for add_eos in [false, true] {
        let (dir, engine) = start(add_eos);
        let pooler = decoder_pooler(engine, DecoderTask::Embed, 64).unwrap();
        let input = pooler.tokenizer().text("<5> <9> <77>", None).unwrap();
        let expected: Vec<u32> = match add_eos {
            true => vec![5, 9, 77, 2],
            false => vec![5, 9, 77],
        };
        assert_eq!(input.ids, expected);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let out = runtime
            .block_on(pooler.encode(vec![
                input.clone(),
                EncoderInput {
                    ids: vec![11, 12],
                    types: Vec::new(),
                },
            ]))
            .unwrap();
        assert_eq!(out.len(), 2);
        let (state, _) = reference(dir.path(), &expected);
        let norm = state.iter().map(|v| v * v).sum::<f32>().sqrt();
        let unit: Vec<f32> = state.iter().map(|v| v / norm).collect();
        assert!(max_diff(&out[0], &unit) < TOLERANCE);
        let length = out[1].iter().map(|v| v * v).sum::<f32>().sqrt();
        assert!((length - 1.0).abs() < 1e-5, "{length}");
        // A model that embeds reads no pairs.
        assert!(pooler.tokenizer().pair("<1>", "<2>", None).is_err());
    }
}

#[test]
fn a_hybrid_pools_from_a_resumed_state_as_from_scratch() {
    let (model, tokenizer, _) = hybrid_model(Hybrid::Qwen35);
    let spawn = |prefix_caching: bool| {
        let config = hybrid_config(Hybrid::Qwen35, 96, None, prefix_caching);
        engine::spawn(model.clone(), tokenizer.clone(), Vec::new(), config)
            .unwrap()
            .0
    };
    let prompt: Vec<u32> = (0..45u32).map(|i| 10 + (i * 11) % 280).collect();
    let fresh = pooled(
        &spawn(false),
        Request::pooling(prompt.clone(), Pooling::State),
    )
    .0;
    let cached = spawn(true);
    let (first, _) = pooled(&cached, Request::pooling(prompt.clone(), Pooling::State));
    let (again, usage) = pooled(&cached, Request::pooling(prompt.clone(), Pooling::State));
    assert!(usage.cached_tokens >= 40, "{usage:?}");
    // Q8_0 weights: the same arithmetic either way, up to the attention's summation order.
    for (what, v) in [("first", &first), ("resumed", &again)] {
        let diff = max_diff(v, &fresh);
        assert!(diff < 1e-3, "{what}: differs by {diff}");
    }
}
