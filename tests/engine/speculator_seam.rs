//! The speculator seam from outside the engine: two drafting methods defined only here, on
//! the public `Speculator` and `Drafter` traits, are registered by name and run inside the
//! engine on the mock backend, with no engine code naming them. One drafts the mock model's
//! own continuation (every node must be accepted), the other always a wrong token (none
//! may be); output stays exact either way, the batched prepare sees several sequences at
//! once, every computed row is observed, asked-for prompt rows are computed, and each
//! sequence is released once when it leaves. A speculator maps its own KV at start exactly
//! when the engine is asked to prefault. Bad registrations and unknown names are refused.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use engine::model::testing::write_tiny_tokenizer;
use engine::model::tokenizer::ModelTokenizer;
use engine::spec::speculator::{Granted, ObservedRow, Speculator, SpeculatorFactory};
use engine::spec::{DraftContext, Drafter, NewSequence};
use engine::{
    CostCurve, EngineConfig, ManagerConfig, MockBackend, Request, SchedulerConfig, SpecMethod,
    SpeculationConfig, TokenTree,
};
use kvcache::SeqId;

// Large enough that outputs and drafts seldom feed a prompt token again.
const VOCAB: usize = 4096;
const ORACLE: SpecMethod = SpecMethod::Named("oracle");
const CONTRARIAN: SpecMethod = SpecMethod::Named("contrarian");

/// What the test speculators saw.
#[derive(Debug, Default)]
struct Seen {
    /// Calls asking for the speculator's own KV to be mapped.
    prefaulted: usize,
    /// Sequences granted per `prepare` call.
    prepared: Vec<usize>,
    /// Tokens fed in rows the forward computed.
    observed: HashSet<u32>,
    /// Rows observed.
    rows: usize,
    /// Sequences released.
    released: Vec<SeqId>,
}

/// A chain drafter: each next token is `next(tokens so far)`.
struct ChainDrafter {
    method: SpecMethod,
    next: fn(&[u32]) -> u32,
    depth: usize,
}

impl Drafter for ChainDrafter {
    fn method(&self) -> SpecMethod {
        self.method
    }

    fn prepare(&mut self, _ctx: &DraftContext<'_>) -> usize {
        self.depth
    }

    fn draft(&mut self, ctx: &DraftContext<'_>, budget: usize) -> TokenTree {
        let mut tokens = ctx.tokens.to_vec();
        for _ in 0..budget.min(self.depth) {
            tokens.push((self.next)(&tokens));
        }
        TokenTree::chain(&tokens[ctx.tokens.len() - 1..])
    }

    fn observe(&mut self, _tokens: &[u32], _appended: usize) {}
}

struct TestSpeculator {
    method: SpecMethod,
    next: fn(&[u32]) -> u32,
    learns_prompts: bool,
    seen: Arc<Mutex<Seen>>,
}

impl Speculator for TestSpeculator {
    fn method(&self) -> SpecMethod {
        self.method
    }

    fn drafter(&self, _seq: &NewSequence<'_>) -> Option<Box<dyn Drafter>> {
        Some(Box::new(ChainDrafter {
            method: self.method,
            next: self.next,
            depth: 5,
        }))
    }

    fn prepare(&mut self, granted: &[Granted<'_>]) -> engine::Result<()> {
        assert!(granted.iter().all(|g| g.budget > 0 && !g.tokens.is_empty()));
        self.seen.lock().unwrap().prepared.push(granted.len());
        Ok(())
    }

    fn wants_logits(&self, _token: u32, _cache_scope: Option<kvcache::BlockHash>) -> bool {
        self.learns_prompts
    }

    fn observe_row(&mut self, row: &ObservedRow<'_>) {
        assert_eq!(row.logits.len(), VOCAB);
        let mut seen = self.seen.lock().unwrap();
        seen.observed.insert(row.token);
        seen.rows += 1;
    }

    fn release(&mut self, seq: SeqId) {
        self.seen.lock().unwrap().released.push(seq);
    }

    fn prefault_kv(&mut self) {
        self.seen.lock().unwrap().prefaulted += 1;
    }
}

fn oracle_next(tokens: &[u32]) -> u32 {
    MockBackend::next_token(tokens, VOCAB)
}

fn contrarian_next(tokens: &[u32]) -> u32 {
    (MockBackend::next_token(tokens, VOCAB) + 1) % VOCAB as u32
}

fn factory(
    method: SpecMethod,
    next: fn(&[u32]) -> u32,
    learns_prompts: bool,
    seen: &Arc<Mutex<Seen>>,
) -> SpeculatorFactory {
    let seen = Arc::clone(seen);
    SpeculatorFactory::new(method.as_str(), move |vocab| {
        assert_eq!(vocab, VOCAB);
        Box::new(TestSpeculator {
            method,
            next,
            learns_prompts,
            seen: Arc::clone(&seen),
        })
    })
}

fn config(speculators: Vec<SpeculatorFactory>) -> EngineConfig {
    let kv = ManagerConfig {
        num_blocks: 200,
        block_size: 4,
        prefix_caching: true,
        watermark: 0.01,
        window: None,
    };
    EngineConfig {
        scheduler: SchedulerConfig {
            max_num_batched_tokens: 256,
            max_num_seqs: 16,
            max_model_len: 200,
            kv,
        },
        max_pending: 64,
        speculation: SpeculationConfig {
            cost: CostCurve::flat(),
            max_draft_tokens: 8,
            speculators,
            ..SpeculationConfig::default()
        },
        kv_prefault: false,
        state_snapshots: Default::default(),
    }
}

fn tokenizer(dir: &std::path::Path) -> Arc<ModelTokenizer> {
    write_tiny_tokenizer(dir, VOCAB).unwrap();
    Arc::new(ModelTokenizer::from_hf_dir(dir, Vec::new()).unwrap())
}

fn request(prompt: Vec<u32>, method: SpecMethod, max_tokens: usize) -> Request {
    Request::greedy(prompt, max_tokens, Some(method))
}

#[test]
fn a_drafter_defined_outside_the_engine_drafts_inside_it() {
    let dir = tempfile::tempdir().unwrap();
    let oracle_seen = Arc::new(Mutex::new(Seen::default()));
    let contrarian_seen = Arc::new(Mutex::new(Seen::default()));
    let config = config(vec![
        factory(ORACLE, oracle_next, true, &oracle_seen),
        factory(CONTRARIAN, contrarian_next, false, &contrarian_seen),
    ]);
    let backend = Box::new(MockBackend::new(VOCAB, 200 * 4));
    let (handle, thread) =
        engine::spawn_with_backend(backend, tokenizer(dir.path()), Vec::new(), config).unwrap();
    // Oracle prompts use tokens 0..24 (each once); contrarian prompts 40..64.
    let mut cases = Vec::new();
    for i in 0..4u32 {
        let prompt: Vec<u32> = (i * 6..i * 6 + 6).collect();
        cases.push((ORACLE, prompt, 30));
        let prompt: Vec<u32> = (40 + i * 6..40 + i * 6 + 6).collect();
        cases.push((CONTRARIAN, prompt, 30));
    }
    let streams: Vec<_> = cases
        .iter()
        .map(|(method, prompt, max)| handle.submit(request(prompt.clone(), *method, *max)))
        .collect::<Result<_, _>>()
        .unwrap();
    for ((method, prompt, max), stream) in cases.iter().zip(streams) {
        let out = stream.wait().unwrap().remove(0);
        assert_eq!(
            out.token_ids,
            MockBackend::continuation(prompt, *max, VOCAB),
            "{method:?} {prompt:?}"
        );
        let usage = out.usage;
        assert!(
            usage.draft_tokens > 0,
            "{method:?} never drafted: {usage:?}"
        );
        if *method == ORACLE {
            assert_eq!(usage.accepted_tokens, usage.draft_tokens, "{usage:?}");
            // Five accepted drafts and a bonus token per step: far fewer steps than tokens.
            assert!(usage.spec_steps * 3 <= *max, "{usage:?}");
        } else {
            assert_eq!(usage.accepted_tokens, 0, "{usage:?}");
        }
    }
    {
        let seen = oracle_seen.lock().unwrap();
        assert!(
            seen.prepared.iter().any(|&n| n > 1),
            "prepare never saw sequences together: {:?}",
            seen.prepared
        );
        // Every prompt token of the oracle's requests was computed (the last from its
        // sampled row, the others because the oracle asked for them).
        for token in 0..24 {
            assert!(
                seen.observed.contains(&token),
                "prompt token {token} unseen"
            );
        }
        assert_eq!(seen.released.len(), 4, "{:?}", seen.released);
        assert_eq!(seen.released.iter().collect::<HashSet<_>>().len(), 4);
    }
    {
        let seen = contrarian_seen.lock().unwrap();
        assert_eq!(seen.released.len(), 4, "{:?}", seen.released);
        // Every speculator sees every computed row, its own sequences' or not.
        assert_eq!(seen.rows, oracle_seen.lock().unwrap().rows);
    }
    // A name no speculator serves is a client error, not a silent plain decode.
    let unknown = handle.submit(request(vec![1, 2, 3], SpecMethod::Named("medusa"), 4));
    match unknown {
        Err(engine::SubmitError::Invalid(e)) => assert_eq!(e.field, "speculation.method"),
        other => panic!("{:?}", other.map(|_| ())),
    }
    handle.shutdown();
    thread.join().unwrap();
}

#[test]
fn a_registered_method_must_have_a_new_name() {
    let dir = tempfile::tempdir().unwrap();
    let seen = Arc::new(Mutex::new(Seen::default()));
    for taken in [SpecMethod::Recycling, SpecMethod::None, ORACLE] {
        let mut speculators = vec![factory(taken, oracle_next, false, &seen)];
        if taken == ORACLE {
            speculators.push(factory(ORACLE, contrarian_next, false, &seen));
        }
        let backend = Box::new(MockBackend::new(VOCAB, 200 * 4));
        let started = engine::spawn_with_backend(
            backend,
            tokenizer(dir.path()),
            Vec::new(),
            config(speculators),
        );
        let error = started.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(error.contains("needs a new name"), "{taken:?}: {error:?}");
    }
}

#[test]
fn a_speculator_maps_its_own_kv_at_start_when_the_engine_does() {
    let dir = tempfile::tempdir().unwrap();
    for prefault in [false, true] {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let config = EngineConfig {
            kv_prefault: prefault,
            ..config(vec![factory(ORACLE, oracle_next, false, &seen)])
        };
        let backend = Box::new(MockBackend::new(VOCAB, 200 * 4));
        let (handle, thread) =
            engine::spawn_with_backend(backend, tokenizer(dir.path()), Vec::new(), config).unwrap();
        let prompt: Vec<u32> = (0..6).collect();
        let out = handle
            .submit(request(prompt.clone(), ORACLE, 12))
            .unwrap()
            .wait()
            .unwrap()
            .remove(0);
        assert_eq!(out.token_ids, MockBackend::continuation(&prompt, 12, VOCAB));
        handle.shutdown();
        thread.join().unwrap();
        assert_eq!(seen.lock().unwrap().prefaulted, usize::from(prefault));
    }
}
