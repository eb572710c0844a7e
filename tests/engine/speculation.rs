//! Speculation end to end: for every drafter, greedy output is token-identical to plain
//! decoding (alone, and in batches that mix methods, prefill chunks and preemption), on a
//! tiny random model and on SmolLM2; sampled output has the plain sampling distribution (and
//! is even identical for equal seeds); the Token Recycling matrix is shared between requests
//! and survives a restart; expensive extra rows turn drafting off.

use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;

use engine::handle::EngineHandle;
use engine::model::testing::{write_tiny_hf_model, write_tiny_tokenizer, TinyModelSpec};
use engine::{
    CostCurve, DraftModelSetup, EngineConfig, LoadOptions, LoadedModel, ManagerConfig, Request,
    SampleOutput, SamplingParams, SchedulerConfig, SpecMethod, SpeculationConfig, WeightDType,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::support::fixtures::{smollm2, smollm2_f32, PROMPTS};

const METHODS: [SpecMethod; 6] = [
    SpecMethod::None,
    SpecMethod::Recycling,
    SpecMethod::NgramTrie,
    SpecMethod::PromptLookup,
    SpecMethod::Suffix,
    SpecMethod::Auto,
];

pub(crate) struct Setup {
    pub(crate) draft_model: Option<DraftModelSetup>,
    pub(crate) num_blocks: usize,
    pub(crate) block_size: usize,
    pub(crate) budget: usize,
    pub(crate) max_draft: usize,
    pub(crate) cost: CostCurve,
    pub(crate) recycling_state: Option<std::path::PathBuf>,
    /// The windowed layers' own space, where they have one.
    pub(crate) window: Option<kvcache::WindowConfig>,
}

impl Default for Setup {
    fn default() -> Self {
        Self {
            draft_model: None,
            num_blocks: 256,
            block_size: 16,
            budget: 256,
            max_draft: 8,
            cost: CostCurve::flat(),
            recycling_state: None,
            window: None,
        }
    }
}

pub(crate) fn start(loaded: &LoadedModel, setup: Setup) -> (EngineHandle, JoinHandle<()>) {
    let config = EngineConfig {
        scheduler: SchedulerConfig {
            max_num_batched_tokens: setup.budget,
            max_num_seqs: 16,
            max_model_len: 160,
            kv: ManagerConfig {
                num_blocks: setup.num_blocks,
                block_size: setup.block_size,
                prefix_caching: true,
                watermark: 0.0,
                window: setup.window,
            },
        },
        max_pending: 64,
        speculation: SpeculationConfig {
            max_draft_tokens: setup.max_draft,
            cost: setup.cost,
            recycling_state: setup.recycling_state,
            draft_model: setup.draft_model,
            ..SpeculationConfig::default()
        },
        kv_prefault: false,
        state_snapshots: Default::default(),
    };
    engine::spawn(
        loaded.model.clone(),
        Arc::new(loaded.tokenizer.clone()),
        loaded.tokenizer.eos_ids().to_vec(),
        config,
    )
    .unwrap()
}

pub(crate) fn request(prompt: &[u32], method: SpecMethod, max_tokens: usize) -> Request {
    Request::greedy(prompt.to_vec(), max_tokens, Some(method))
}

/// A greedy request that runs to `max_tokens` whatever it samples (EOS ignored): a tiny
/// random model may sample its EOS anywhere, and on one machine's arithmetic but not
/// another's, so a test that needs sequences of known length to fill a pool asks for this.
pub(crate) fn full_length(
    prompt: Vec<u32>,
    max_tokens: usize,
    method: Option<SpecMethod>,
) -> Request {
    let mut request = Request::greedy(prompt, max_tokens, method);
    request.stop.ignore_eos = true;
    request
}

/// Submits every request together (taken in before the engine's next step, so they share
/// the pool from the first step) and waits for all.
pub(crate) fn run_all(handle: &EngineHandle, requests: Vec<Request>) -> Vec<SampleOutput> {
    handle
        .submit_all(requests)
        .unwrap()
        .into_iter()
        .map(|s| s.wait().unwrap().remove(0))
        .collect()
}

/// Each prompt's greedy output under plain decoding (`none`), one request at a time on a
/// fresh engine: the reference every speculative run must equal.
pub(crate) fn plain_outputs(
    loaded: &LoadedModel,
    prompts: &[Vec<u32>],
    max_tokens: usize,
) -> Vec<Vec<u32>> {
    let (plain, _) = start(loaded, Setup::default());
    prompts
        .iter()
        .map(|p| {
            run_all(&plain, vec![request(p, SpecMethod::None, max_tokens)])[0]
                .token_ids
                .clone()
        })
        .collect()
}

pub(crate) fn tiny_loaded(dir: &Path, vocab: usize) -> LoadedModel {
    let spec = TinyModelSpec {
        vocab_size: vocab,
        ..TinyModelSpec::default()
    };
    tiny_loaded_as(dir, &spec, WeightDType::F32)
}

/// `spec` written to `dir` with a word-level tokenizer, loaded as `dtype`.
pub(crate) fn tiny_loaded_as(dir: &Path, spec: &TinyModelSpec, dtype: WeightDType) -> LoadedModel {
    write_tiny_hf_model(dir, spec).unwrap();
    write_tiny_tokenizer(dir, spec.vocab_size).unwrap();
    let options = LoadOptions {
        dtype,
        ..LoadOptions::default()
    };
    engine::load_model(dir.to_str().unwrap(), &options).unwrap()
}

/// Prompts with repeated stretches, so context drafters find matches.
fn repetitive_prompts(rng: &mut StdRng, count: usize, vocab: u32) -> Vec<Vec<u32>> {
    (0..count)
        .map(|_| {
            let motif: Vec<u32> = (0..rng.random_range(3..9))
                .map(|_| rng.random_range(0..vocab))
                .collect();
            let mut prompt = Vec::new();
            for _ in 0..rng.random_range(2..6) {
                prompt.extend(&motif);
                prompt.push(rng.random_range(0..vocab));
            }
            prompt
        })
        .collect()
}

#[test]
fn every_method_is_lossless_on_a_tiny_model_alone_and_in_mixed_batches() {
    let dir = tempfile::tempdir().unwrap();
    assert_lossless_alone_and_in_mixed_batches(&tiny_loaded(dir.path(), 256));
}

#[test]
fn every_method_is_lossless_on_windowed_gemma3_and_qwen3_shapes() {
    // Gemma 3's windows are 8 keys here, so prompts (up to ~50 tokens) and draft trees reach
    // far past them: a node sees the window counted from its own position. Quantized (Q8_0),
    // the models run the fused CPU pass with thicket's kernel.
    for spec in [
        crate::model::families::tiny_gemma3(),
        crate::model::families::tiny_qwen3(),
    ] {
        let spec = TinyModelSpec {
            vocab_size: 256,
            ..spec
        };
        let dir = tempfile::tempdir().unwrap();
        let loaded = tiny_loaded_as(dir.path(), &spec, WeightDType::Quantized);
        assert!(loaded.model.is_fused());
        assert_lossless_alone_and_in_mixed_batches(&loaded);
    }
}

#[test]
fn every_method_is_lossless_on_mixtures_of_experts() {
    // A step's rows (a batch's sequences, a tree's nodes) route to different experts; each
    // expert runs once over its rows. Quantized (Q8_0): the fused CPU pass on thicket's kernel.
    for arch in [
        engine::Architecture::Qwen3Moe,
        engine::Architecture::Qwen2Moe,
    ] {
        let spec = TinyModelSpec {
            vocab_size: 256,
            ..crate::model::moe::tiny_moe(arch)
        };
        let dir = tempfile::tempdir().unwrap();
        let loaded = tiny_loaded_as(dir.path(), &spec, WeightDType::Quantized);
        assert!(loaded.model.is_fused());
        assert_lossless_alone_and_in_mixed_batches(&loaded);
    }
}

#[test]
fn every_method_is_lossless_on_gptoss() {
    // Sinks, windows of 16 (prompts and trees reach past them), biased experts in MXFP4 on
    // thicket's kernels.
    let dir = tempfile::tempdir().unwrap();
    let spec = engine::model::testing::TinyGptOss {
        vocab_size: 256,
        ..Default::default()
    };
    let loaded = gguf_loaded(dir.path(), "gptoss.gguf", spec.vocab_size, |path| {
        engine::model::testing::write_tiny_gptoss_gguf(
            path,
            &spec,
            candle_core::quantized::GgmlDType::Q8_0,
        )
        .unwrap()
    });
    assert_lossless_alone_and_in_mixed_batches(&loaded);
}

/// The GGUF `write` puts at `dir/name` (quantized, on the fused pass), with a tiny tokenizer of
/// `vocab` tokens beside it.
pub(crate) fn gguf_loaded(
    dir: &Path,
    name: &str,
    vocab: usize,
    write: impl FnOnce(&Path),
) -> LoadedModel {
    let path = dir.join(name);
    write(&path);
    let cpu = candle_core::Device::Cpu;
    let (config, weights) = engine::model::gguf::load_gguf_weights(&path, None, &cpu).unwrap();
    write_tiny_tokenizer(dir, vocab).unwrap();
    let loaded = LoadedModel {
        model: engine::Model::new(config, weights, cpu).unwrap(),
        tokenizer: engine::ModelTokenizer::from_hf_dir(dir, Vec::new()).unwrap(),
        source: engine::model::fetch::ModelSource::Gguf(path),
    };
    assert!(loaded.model.is_fused());
    loaded
}

/// Every method equals plain decoding alone with large trees, and in batches of 4 and 16
/// mixing methods with prefill chunks and preemption.
pub(crate) fn assert_lossless_alone_and_in_mixed_batches(loaded: &LoadedModel) {
    let loaded = loaded.clone();
    let mut rng = StdRng::seed_from_u64(5);
    let prompts = repetitive_prompts(&mut rng, 16, 256);
    let max_tokens = 24;
    let reference = plain_outputs(&loaded, &prompts, max_tokens);
    // Alone, with large trees.
    let (alone, _) = start(
        &loaded,
        Setup {
            max_draft: 64,
            ..Setup::default()
        },
    );
    for method in METHODS {
        let mut accepted = 0;
        for (prompt, want) in prompts.iter().zip(&reference) {
            let out = &run_all(&alone, vec![request(prompt, method, max_tokens)])[0];
            assert_eq!(&out.token_ids, want, "{method:?} alone");
            accepted += out.usage.accepted_tokens;
        }
        if method != SpecMethod::None {
            assert!(accepted > 0, "{method:?} never had a draft accepted");
        }
    }
    // Batches of 4 and 16 mixing methods, with prefill chunks (budget 48) and a pool small
    // enough to preempt.
    for (batch, num_blocks) in [(4, 256), (16, 44)] {
        let (handle, _) = start(
            &loaded,
            Setup {
                num_blocks,
                block_size: 4,
                budget: 48,
                max_draft: 6,
                ..Setup::default()
            },
        );
        let requests = prompts[..batch]
            .iter()
            .enumerate()
            .map(|(i, p)| request(p, METHODS[i % METHODS.len()], max_tokens))
            .collect();
        let outputs = run_all(&handle, requests);
        for (i, out) in outputs.iter().enumerate() {
            assert_eq!(out.token_ids, reference[i], "batch of {batch}, request {i}");
        }
        if batch == 16 {
            let stats = handle.stats().unwrap();
            assert!(stats.scheduler.preemptions > 0, "{stats:?}");
            assert_eq!(stats.cache.in_use, 0);
        }
    }
}

#[test]
fn every_method_is_lossless_on_smollm2() {
    let loaded = smollm2();
    let tokenizer = &loaded.tokenizer;
    let prompts: Vec<Vec<u32>> = [
        PROMPTS[1],
        PROMPTS[5],
        "The list: apples, pears, plums. Again the list: apples, pears, plums. Again the list:",
    ]
    .iter()
    .map(|p| tokenizer.encode(p).unwrap())
    .collect();
    let max_tokens = 12;
    let (handle, _) = start(
        loaded,
        Setup {
            max_draft: 4,
            ..Setup::default()
        },
    );
    let reference: Vec<SampleOutput> = prompts
        .iter()
        .map(|p| run_all(&handle, vec![request(p, SpecMethod::None, max_tokens)]).remove(0))
        .collect();
    for method in &METHODS[1..] {
        let requests = prompts
            .iter()
            .map(|p| request(p, *method, max_tokens))
            .collect();
        for (i, out) in run_all(&handle, requests).iter().enumerate() {
            assert_eq!(
                out.token_ids, reference[i].token_ids,
                "{method:?} prompt {i}"
            );
            assert_eq!(out.text, reference[i].text);
        }
    }
    // A batch of 16 mixing every method, with prompts prefilled in chunks (budget 24) and a
    // pool of blocks of 4 small enough to preempt.
    let (tight, _) = start(
        loaded,
        Setup {
            num_blocks: 44,
            block_size: 4,
            budget: 24,
            max_draft: 4,
            ..Setup::default()
        },
    );
    // Longer prompts (three of the shared ones each) so the batch overflows the pool.
    let batch_prompts: Vec<Vec<u32>> = (0..16)
        .map(|i| {
            let text = format!(
                "{} {} {}",
                PROMPTS[i % 8],
                PROMPTS[(i + 4) % 8],
                PROMPTS[(i / 8 + i + 2) % 8]
            );
            tokenizer.encode(&text).unwrap()
        })
        .collect();
    let requests = batch_prompts
        .iter()
        .enumerate()
        .map(|(i, p)| request(p, METHODS[i % METHODS.len()], max_tokens))
        .collect();
    let outputs = run_all(&tight, requests);
    for (i, (out, prompt)) in outputs.iter().zip(&batch_prompts).enumerate() {
        let solo = run_all(&handle, vec![request(prompt, SpecMethod::None, max_tokens)]);
        assert_eq!(out.token_ids, solo[0].token_ids, "mixed batch, request {i}");
    }
    let stats = tight.stats().unwrap();
    assert!(stats.scheduler.preemptions > 0, "{stats:?}");
    assert!(
        outputs.iter().any(|o| o.usage.accepted_tokens > 0),
        "no draft was accepted in the mixed batch"
    );
    // The repetitive prompt must actually be sped up by the context drafters.
    let out = run_all(
        &handle,
        vec![request(&prompts[2], SpecMethod::PromptLookup, max_tokens)],
    );
    assert!(out[0].usage.accepted_tokens > 0, "{:?}", out[0].usage);
}

/// Two-sample chi-square statistic over token counts.
pub(crate) fn chi_square(a: &[usize], b: &[usize]) -> f64 {
    let (na, nb) = (
        a.iter().sum::<usize>() as f64,
        b.iter().sum::<usize>() as f64,
    );
    a.iter()
        .zip(b)
        .filter(|(&x, &y)| x + y > 0)
        .map(|(&x, &y)| {
            let (x, y) = (x as f64, y as f64);
            let (ea, eb) = ((x + y) * na / (na + nb), (x + y) * nb / (na + nb));
            (x - ea).powi(2) / ea + (y - eb).powi(2) / eb
        })
        .sum()
}

#[test]
fn sampling_keeps_the_plain_distribution_for_every_method() {
    let dir = tempfile::tempdir().unwrap();
    let vocab = 12;
    let loaded = tiny_loaded(dir.path(), vocab);
    let (handle, _) = start(
        &loaded,
        Setup {
            max_draft: 6,
            ..Setup::default()
        },
    );
    let prompt = [1u32, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2];
    let samples = 1200;
    let sampled = |method: SpecMethod, seed: u64| {
        let mut r = request(&prompt, method, 4);
        r.sampling = SamplingParams {
            temperature: 1.0,
            seed: Some(seed),
            ..SamplingParams::default()
        };
        r
    };
    // Counts of the tokens at output positions 2..4 (where drafts are verified).
    let histogram = |method: SpecMethod, first_seed: u64| -> (Vec<usize>, usize, Vec<Vec<u32>>) {
        let mut counts = vec![0; vocab * 3];
        let mut accepted = 0;
        let mut outputs = Vec::new();
        for chunk in (0..samples as u64).collect::<Vec<_>>().chunks(48) {
            let requests = chunk
                .iter()
                .map(|&s| sampled(method, first_seed + s))
                .collect();
            for out in run_all(&handle, requests) {
                for (pos, &t) in out.token_ids.iter().enumerate().skip(1) {
                    counts[(pos - 1) * vocab + t as usize] += 1;
                }
                accepted += out.usage.accepted_tokens;
                outputs.push(out.token_ids);
            }
        }
        (counts, accepted, outputs)
    };
    let (plain, _, plain_outputs) = histogram(SpecMethod::None, 1_000_000);
    // 33 cells at most -> 32 degrees of freedom; p = 0.001 is at 62.5.
    for method in &METHODS[1..] {
        let (counts, accepted, _) = histogram(*method, 0);
        assert!(
            accepted > 0,
            "{method:?} accepted nothing: the test would prove little"
        );
        let chi2 = chi_square(&plain, &counts);
        assert!(chi2 < 62.5, "{method:?}: chi-square {chi2:.1}");
    }
    // Same seeds give the very same output with and without drafting.
    let (_, _, same_seeds) = histogram(SpecMethod::PromptLookup, 1_000_000);
    assert_eq!(same_seeds, plain_outputs);
}

#[test]
fn recycling_matrix_is_shared_between_requests_and_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let loaded = tiny_loaded(dir.path(), 256);
    let state = dir.path().join("recycling.bin");
    let setup = || Setup {
        max_draft: 32,
        recycling_state: Some(state.clone()),
        ..Setup::default()
    };
    // The student is a follow-up of the teacher: its prompt and the start of its answer.
    let teacher: Vec<u32> = (0..12).map(|i| (i * 37) % 256).collect();
    let answer = {
        let (handle, _) = start(
            &loaded,
            Setup {
                recycling_state: None,
                ..setup()
            },
        );
        run_all(&handle, vec![request(&teacher, SpecMethod::None, 8)]).remove(0)
    };
    let mut student = teacher.clone();
    student.extend(&answer.token_ids[..6]);
    let mat = |out: &SampleOutput| {
        (out.usage.spec_steps + out.usage.accepted_tokens) as f64
            / out.usage.spec_steps.max(1) as f64
    };
    let cold = {
        let (handle, _) = start(
            &loaded,
            Setup {
                recycling_state: None,
                ..setup()
            },
        );
        mat(&run_all(&handle, vec![request(&student, SpecMethod::Recycling, 40)])[0])
    };
    let warm = {
        let (handle, thread) = start(&loaded, setup());
        run_all(&handle, vec![request(&teacher, SpecMethod::Recycling, 40)]);
        let warm = mat(&run_all(&handle, vec![request(&student, SpecMethod::Recycling, 40)])[0]);
        handle.shutdown();
        thread.join().unwrap();
        warm
    };
    assert!(warm > cold, "warm MAT {warm:.2} vs cold {cold:.2}");
    assert!(state.is_file(), "the matrix was not saved");
    let (handle, _) = start(&loaded, setup());
    let restarted = mat(&run_all(&handle, vec![request(&student, SpecMethod::Recycling, 40)])[0]);
    assert!(
        restarted > cold,
        "restarted MAT {restarted:.2} vs cold {cold:.2}"
    );
}

#[test]
fn recycling_learns_from_prompt_rows_only_for_requests_that_use_it() {
    use engine::spec::methods::recycling::{RecyclingMatrix, TOP_K};
    let dir = tempfile::tempdir().unwrap();
    let loaded = tiny_loaded(dir.path(), 256);
    // 40 distinct tokens, prefilled in chunks of 16 (at most 32 learning rows a step).
    let prompt: Vec<u32> = (0..40).map(|i| (i * 7 + 3) % 256).collect();
    let filled_rows = |method: SpecMethod| {
        let state = dir.path().join(format!("{method:?}.bin"));
        let (handle, thread) = start(
            &loaded,
            Setup {
                budget: 16,
                recycling_state: Some(state.clone()),
                ..Setup::default()
            },
        );
        run_all(&handle, vec![request(&prompt, method, 1)]);
        handle.shutdown();
        thread.join().unwrap();
        RecyclingMatrix::load(&state, 256, TOP_K)
            .unwrap()
            .filled_rows()
    };
    // Every prompt token is learned (the last one from its sampled row).
    assert_eq!(filled_rows(SpecMethod::Recycling), prompt.len());
    // A request that does not draft with the matrix computes only its sampled row.
    assert_eq!(filled_rows(SpecMethod::PromptLookup), 1);
}

#[test]
fn expensive_rows_turn_drafting_off() {
    let dir = tempfile::tempdir().unwrap();
    let loaded = tiny_loaded(dir.path(), 256);
    let prompt: Vec<u32> = [5u32, 6, 7, 8].repeat(6);
    let drafted = |cost: CostCurve| {
        let (handle, _) = start(
            &loaded,
            Setup {
                cost,
                ..Setup::default()
            },
        );
        let out = run_all(
            &handle,
            vec![request(&prompt, SpecMethod::PromptLookup, 16)],
        );
        out[0].usage.draft_tokens
    };
    assert!(drafted(CostCurve::flat()) > 0);
    // Each row past the first costs a thousand forwards. (A linear curve is not expensive
    // enough here: the engine prices rows against what a whole step costs, and beside this
    // tiny model's forward of a few microseconds the step's own overhead, as measured, makes
    // an extra row that costs one forward cheap enough for a likely node to pay.)
    let steep = CostCurve::new(vec![(1, 1.0), (2, 1001.0), (64, 63001.0)]).unwrap();
    assert_eq!(drafted(steep), 0);
}

#[test]
fn draft_model_path_is_lossless_with_smollm2_drafting_for_itself() {
    // The 4-bit model verifies; the same model in f32 drafts (same tokenizer, close logits).
    let loaded = smollm2();
    let tokenizer = &loaded.tokenizer;
    let draft = DraftModelSetup {
        model: smollm2_f32().model.clone(),
        k_config: vec![2, 1, 1],
        kv: ManagerConfig {
            num_blocks: 64,
            block_size: 16,
            prefix_caching: true,
            watermark: 0.0,
            window: None,
        },
    };
    let (handle, _) = start(
        loaded,
        Setup {
            draft_model: Some(draft),
            max_draft: 4,
            ..Setup::default()
        },
    );
    let prompts: Vec<Vec<u32>> = [PROMPTS[0], PROMPTS[3], PROMPTS[6]]
        .iter()
        .map(|p| tokenizer.encode(p).unwrap())
        .collect();
    let max_tokens = 12;
    let plain: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| {
            run_all(&handle, vec![request(p, SpecMethod::None, max_tokens)])
                .remove(0)
                .token_ids
        })
        .collect();
    // Alone, then together with other methods in one batch.
    let mut accepted = 0;
    for (prompt, want) in prompts.iter().zip(&plain) {
        let out = run_all(
            &handle,
            vec![request(prompt, SpecMethod::DraftModel, max_tokens)],
        );
        assert_eq!(&out[0].token_ids, want);
        accepted += out[0].usage.accepted_tokens;
    }
    assert!(
        accepted > 0,
        "the f32 draft never agreed with the 4-bit target"
    );
    let methods = [
        SpecMethod::DraftModel,
        SpecMethod::NgramTrie,
        SpecMethod::DraftModel,
    ];
    let requests = prompts
        .iter()
        .zip(methods)
        .map(|(p, m)| request(p, m, max_tokens))
        .collect();
    for (out, want) in run_all(&handle, requests).iter().zip(&plain) {
        assert_eq!(&out.token_ids, want);
    }
    // Without a draft model the method is refused with the field named.
    let (bare, _) = start(loaded, Setup::default());
    match bare.submit(request(&prompts[0], SpecMethod::DraftModel, 4)) {
        Err(engine::SubmitError::Invalid(e)) => assert_eq!(e.field, "speculation.method"),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// A conversation of four turns on `handle`, each re-sending the history (prompt and answer
/// so far) with a new user part: the answers (24 tokens each), and the prompt tokens served
/// from the cache over the turns (the replays of the hybrids' tests).
pub(crate) fn replay(handle: &EngineHandle, method: Option<SpecMethod>) -> (Vec<Vec<u32>>, usize) {
    let turns: Vec<Vec<u32>> = vec![
        (1..30).collect(),
        vec![7, 8, 9, 7, 8, 9, 150, 151],
        (60..75).chain(60..75).collect(),
        vec![3, 1, 4, 1, 5, 9, 2, 6],
    ];
    let mut history: Vec<u32> = Vec::new();
    let (mut answers, mut cached) = (Vec::new(), 0);
    for turn in turns {
        history.extend(turn);
        let out = run_all(handle, vec![Request::greedy(history.clone(), 24, method)]);
        cached += out[0].usage.cached_tokens;
        history.extend(&out[0].token_ids);
        answers.push(out[0].token_ids.clone());
    }
    (answers, cached)
}
