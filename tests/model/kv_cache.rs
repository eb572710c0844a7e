//! The KV cache end to end on SmolLM2: a repeated long prompt is served from the prefix
//! cache with the same greedy output, `n` samples of one prompt share its full blocks and
//! copy the partial one on first write, and nothing stays in use afterwards.

use crate::support::plain_greedy::{generate_greedy, generate_greedy_with, GreedyOptions, KvCache};
use engine::{LogitRows, TokenTree, TreeBatch};
use kvcache::ManagerConfig;

use crate::support::fixtures::{smollm2, PROMPTS};

/// Exactly `len` tokens of varied text.
fn long_prompt(len: usize) -> Vec<u32> {
    let tokenizer = &smollm2().tokenizer;
    let mut tokens = Vec::new();
    let mut i = 0;
    while tokens.len() < len {
        tokens.extend(tokenizer.encode(PROMPTS[i % PROMPTS.len()]).unwrap());
        i += 1;
    }
    tokens.truncate(len);
    tokens
}

fn cache(prefix_caching: bool) -> KvCache {
    KvCache::new(
        &smollm2().model,
        ManagerConfig {
            num_blocks: 128,
            block_size: 16,
            prefix_caching,
            watermark: 0.0,
            window: None,
        },
    )
}

#[test]
fn repeated_prompt_reuses_cached_blocks_with_identical_output() {
    let prompt = vec![long_prompt(500)];
    let options = GreedyOptions {
        max_tokens: 12,
        ..GreedyOptions::default()
    };
    let mut kv = cache(true);
    let first = generate_greedy_with(&mut kv, &prompt, &options).unwrap();
    assert_eq!(first[0].cached_tokens, 0);
    let after_first = kv.stats();
    assert_eq!(after_first.in_use, 0);
    assert!(after_first.cached >= 31, "{after_first:?}");

    let second = generate_greedy_with(&mut kv, &prompt, &options).unwrap();
    // 31 full blocks (496 tokens) are reused; the last 4 tokens are computed for logits.
    assert_eq!(second[0].cached_tokens, 496);
    assert_eq!(kv.stats().prefix_hit_tokens, 496);
    assert_eq!(kv.stats().prefix_query_tokens, 1000);
    assert_eq!(second[0].token_ids, first[0].token_ids);
    assert_eq!(kv.stats().in_use, 0);

    // With the cache off nothing is reused, and the output is still the same.
    let mut off = cache(false);
    generate_greedy_with(&mut off, &prompt, &options).unwrap();
    let third = generate_greedy_with(&mut off, &prompt, &options).unwrap();
    assert_eq!(third[0].cached_tokens, 0);
    assert_eq!(off.stats().cached, 0);
    assert_eq!(third[0].token_ids, first[0].token_ids);
}

#[test]
fn n_samples_share_the_prompt_blocks_and_copy_on_write() {
    let prompt = long_prompt(40); // 2 full blocks + 8 tokens in a partial one
    let mut kv = cache(true);
    let parent = kv.new_seq_id();
    assert_eq!(kv.admit(parent, &prompt, prompt.len()).unwrap(), Some(0));
    let mut batch = TreeBatch::new(16);
    batch
        .push(
            0,
            kv.table(parent).unwrap(),
            &TokenTree::chain(&prompt),
            LogitRows::Last,
        )
        .unwrap();
    kv.forward(&batch).unwrap();
    kv.commit(parent, &prompt).unwrap();
    let children = [kv.new_seq_id(), kv.new_seq_id()];
    for &child in &children {
        kv.fork(parent, child).unwrap();
    }
    // One copy of the prompt: three blocks, each held three times.
    assert_eq!(kv.stats().in_use, 3);
    let shared = kv.table(parent).unwrap().blocks().to_vec();
    for &block in &shared {
        assert_eq!(kv.blocks().pool().ref_count(block), 3);
    }
    // First write into the partial block: each child gets its own copy, the parent keeps
    // the original; the two full blocks stay shared.
    for seq in [children[0], children[1], parent] {
        assert!(kv.ensure_capacity(seq, prompt.len() + 1).unwrap());
    }
    assert_eq!(kv.stats().in_use, 2 + 3);
    for &child in &children {
        let table = kv.table(child).unwrap().blocks();
        assert_eq!(&table[..2], &shared[..2]);
        assert_ne!(table[2], shared[2]);
    }
    for seq in [parent, children[0], children[1]] {
        kv.release(seq).unwrap();
    }
    assert_eq!(kv.stats().in_use, 0);
    kv.blocks().check_invariants().unwrap();
}

#[test]
fn n_forked_samples_decode_exactly_like_one() {
    let loaded = smollm2();
    let model = &loaded.model;
    let prompts = vec![long_prompt(40), long_prompt(23)];
    let solo = generate_greedy(model, &prompts, &GreedyOptions::default()).unwrap();
    let options = GreedyOptions {
        n: 3,
        ..GreedyOptions::default()
    };
    let mut kv = cache(true);
    let forked = generate_greedy_with(&mut kv, &prompts, &options).unwrap();
    assert_eq!(forked.len(), 6);
    for (i, generation) in forked.iter().enumerate() {
        assert_eq!(generation.token_ids, solo[i / 3].token_ids, "sample {i}");
    }
    assert_eq!(kv.stats().in_use, 0);
    kv.blocks().check_invariants().unwrap();
}
