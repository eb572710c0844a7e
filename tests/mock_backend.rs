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
