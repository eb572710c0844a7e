//! The whole engine (scheduler, KV bookkeeping, speculation, sampling, events) over the
//! tensor-free mock backend, whose greedy continuation is known in closed form: 64
//! concurrent requests with mixed methods, chunked prefill and preemption all produce
//! exactly the mock model's continuation, and nothing stays in use afterwards.

use std::sync::Arc;

use engine::model::testing::write_tiny_tokenizer;
use engine::model::tokenizer::ModelTokenizer;
use engine::{
    CostCurve, EngineConfig, ManagerConfig, MockBackend, Request, SchedulerConfig, SpecMethod,
    SpeculationConfig,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const VOCAB: usize = 64;

#[test]
fn sixty_four_mixed_requests_on_the_mock_backend_are_exact() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_tokenizer(dir.path(), VOCAB).unwrap();
    let tokenizer = Arc::new(ModelTokenizer::from_hf_dir(dir.path(), Vec::new()).unwrap());
    let kv = ManagerConfig {
        num_blocks: 120,
        block_size: 4,
        prefix_caching: true,
        watermark: 0.01,
        window: None,
    };
    let config = EngineConfig {
        scheduler: SchedulerConfig {
            max_num_batched_tokens: 96,
            max_num_seqs: 32,
            max_model_len: 200,
            kv,
        },
        max_pending: 128,
        speculation: SpeculationConfig {
            cost: CostCurve::flat(),
            max_draft_tokens: 12,
            ..SpeculationConfig::default()
        },
        kv_prefault: false,
        state_snapshots: Default::default(),
    };
    let backend = Box::new(MockBackend::new(VOCAB, kv.num_blocks * kv.block_size));
    let (handle, _) = engine::spawn_with_backend(backend, tokenizer, Vec::new(), config).unwrap();
    let methods = [
        SpecMethod::None,
        SpecMethod::Recycling,
        SpecMethod::NgramTrie,
        SpecMethod::PromptLookup,
        SpecMethod::Auto,
    ];
    let mut rng = StdRng::seed_from_u64(3);
    let mut cases = Vec::new();
    for i in 0..64 {
        let len = rng.random_range(1..60);
        let prompt: Vec<u32> = (0..len)
            .map(|_| rng.random_range(0..VOCAB as u32))
            .collect();
        let max_tokens = rng.random_range(1..50);
        let method = methods[i % methods.len()];
        let request = Request::greedy(prompt.clone(), max_tokens, Some(method));
        cases.push((
            handle.submit(request).unwrap(),
            MockBackend::continuation(&prompt, max_tokens, VOCAB),
        ));
    }
    let mut accepted = 0;
    for (i, (stream, want)) in cases.into_iter().enumerate() {
        let out = stream.wait().unwrap().remove(0);
        assert_eq!(out.token_ids, want, "request {i}");
        accepted += out.usage.accepted_tokens;
    }
    assert!(accepted > 0, "no draft was ever accepted");
    let stats = handle.stats().unwrap();
    assert!(stats.scheduler.preemptions > 0, "{stats:?}");
    assert_eq!(stats.cache.in_use, 0);
    assert_eq!(stats.requests, 0);
}

/// A right prediction drafts past where the output ends (its length, a stop token): usage
/// counts only the accepted tokens the client received, for the method's own drafter and
/// for `auto`, whose tree merges the prediction with its other sources.
#[test]
fn accepted_prediction_tokens_never_exceed_the_tokens_returned() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_tokenizer(dir.path(), VOCAB).unwrap();
    let tokenizer = Arc::new(ModelTokenizer::from_hf_dir(dir.path(), Vec::new()).unwrap());
    let kv = ManagerConfig {
        num_blocks: 64,
        block_size: 4,
        prefix_caching: false,
        watermark: 0.01,
        window: None,
    };
    let config = EngineConfig {
        scheduler: SchedulerConfig {
            max_num_batched_tokens: 96,
            max_num_seqs: 8,
            max_model_len: 200,
            kv,
        },
        max_pending: 16,
        speculation: SpeculationConfig {
            // Rows cost nothing here: every request drafts its whole prediction.
            cost: CostCurve::flat(),
            max_draft_tokens: 32,
            ..SpeculationConfig::default()
        },
        kv_prefault: false,
        state_snapshots: Default::default(),
    };
    let backend = Box::new(MockBackend::new(VOCAB, kv.num_blocks * kv.block_size));
    let (handle, _) = engine::spawn_with_backend(backend, tokenizer, Vec::new(), config).unwrap();
    let mut rng = StdRng::seed_from_u64(11);
    let mut checked = 0;
    for method in [SpecMethod::PromptLookup, SpecMethod::Auto] {
        for max_tokens in [2, 5, 9, 17] {
            let prompt: Vec<u32> = (0..12).map(|_| rng.random_range(0..VOCAB as u32)).collect();
            // The prediction is the model's continuation, far longer than the output.
            let prediction = MockBackend::continuation(&prompt, 60, VOCAB);
            let mut want = prediction[..max_tokens].to_vec();
            let mut request = Request::greedy(prompt.clone(), 60, Some(method));
            request.prediction = Some(prediction.clone().into());
            if max_tokens % 2 == 1 {
                // Ended by a stop token in the middle of a drafted chain, which is output
                // (and counted) but whose followers are not.
                let stop = want[max_tokens - 1];
                let first = want.iter().position(|&t| t == stop).unwrap();
                want.truncate(first + 1);
                request.stop.stop_token_ids = vec![stop];
            } else {
                request.stop.max_tokens = max_tokens;
            }
            let out = handle.submit(request).unwrap().wait().unwrap().remove(0);
            assert_eq!(out.token_ids, want, "{method:?}, {max_tokens} tokens");
            let usage = &out.usage;
            assert_eq!(usage.completion_tokens, want.len());
            // The first output token comes from the prompt's row, never from a draft.
            assert!(
                usage.accepted_tokens < usage.completion_tokens,
                "{method:?}: accepted {} of {} returned ({usage:?})",
                usage.accepted_tokens,
                usage.completion_tokens
            );
            assert!(
                usage.accepted_prediction_tokens() <= usage.accepted_tokens,
                "{usage:?}"
            );
            let by_source: usize = usage.sources.iter().map(|s| s.accepted).max().unwrap_or(0);
            assert!(by_source <= usage.accepted_tokens, "{usage:?}");
            // A prediction that is right drafts and has every token after the first accepted.
            if want.len() > 1 {
                assert_eq!(
                    usage.accepted_prediction_tokens(),
                    want.len() - 1,
                    "{method:?}: {usage:?}"
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 6, "too few outputs past one token: {checked}");
}
