//! The engine thread on SmolLM2: concurrent greedy requests produce exactly their solo
//! output (also when a small KV pool forces preemption), seeded sampling does not depend on
//! batch mates, stop strings and end tokens behave, n samples, log-probabilities,
//! cancellation by dropping the stream, and overload.

use crate::support::plain_greedy::{generate_greedy, GreedyOptions};
use engine::handle::EngineHandle;
use engine::{
    EngineConfig, FinishReason, Request, SamplingParams, SpeculationConfig, StopConditions,
    SubmitError,
};
use kvcache::ManagerConfig;
use scheduler::SchedulerConfig;

use crate::support::fixtures::{smollm2, spawn_smollm2, PROMPTS};

fn config(num_blocks: usize, max_num_seqs: usize) -> EngineConfig {
    EngineConfig {
        scheduler: SchedulerConfig {
            max_num_batched_tokens: 256,
            max_num_seqs,
            max_model_len: 256,
            kv: ManagerConfig {
                num_blocks,
                block_size: 16,
                prefix_caching: true,
                watermark: 0.01,
                window: None,
            },
        },
        max_pending: 256,
        speculation: SpeculationConfig::default(),
        // The engine must behave the same with its pool mapped up front.
        kv_prefault: true,
        state_snapshots: Default::default(),
    }
}

fn start(config: EngineConfig) -> EngineHandle {
    spawn_smollm2(config)
}

fn greedy(prompt: Vec<u32>, max_tokens: usize) -> Request {
    Request::greedy(prompt, max_tokens, None)
}

/// 32 prompts of varied length: the shared prompts, alone and with varied preambles.
fn varied_prompts() -> Vec<Vec<u32>> {
    let tokenizer = &smollm2().tokenizer;
    let preambles = [
        "",
        "Answer briefly. ",
        "Read this carefully, then continue the text that follows it without repeating anything. ",
        "Note: ",
    ];
    let mut prompts = Vec::new();
    for preamble in preambles {
        for prompt in PROMPTS {
            prompts.push(tokenizer.encode(&format!("{preamble}{prompt}")).unwrap());
        }
    }
    prompts
}

fn solo_outputs(prompts: &[Vec<u32>], max_tokens: &[usize]) -> Vec<Vec<u32>> {
    let loaded = smollm2();
    prompts
        .iter()
        .zip(max_tokens)
        .map(|(prompt, &max_tokens)| {
            let options = GreedyOptions {
                max_tokens,
                eos_ids: loaded.tokenizer.eos_ids().to_vec(),
                n: 1,
            };
            let mut out =
                generate_greedy(&loaded.model, std::slice::from_ref(prompt), &options).unwrap();
            out.remove(0).token_ids
        })
        .collect()
}

fn run_concurrently(
    handle: &EngineHandle,
    prompts: &[Vec<u32>],
    max_tokens: &[usize],
) -> Vec<Vec<u32>> {
    let streams: Vec<_> = prompts
        .iter()
        .zip(max_tokens)
        .map(|(p, &m)| handle.submit(greedy(p.clone(), m)).unwrap())
        .collect();
    streams
        .into_iter()
        .map(|s| s.wait().unwrap().remove(0).token_ids)
        .collect()
}

#[test]
fn concurrent_greedy_requests_match_their_solo_output_with_and_without_preemption() {
    let prompts = varied_prompts();
    let max_tokens: Vec<usize> = (0..prompts.len()).map(|i| 6 + (i * 7) % 19).collect();
    let solo = solo_outputs(&prompts, &max_tokens);

    let roomy = start(config(512, 32));
    let together = run_concurrently(&roomy, &prompts, &max_tokens);
    for (i, (got, want)) in together.iter().zip(&solo).enumerate() {
        assert_eq!(got, want, "request {i} in a batch of 32");
    }
    let stats = roomy.stats().unwrap();
    assert_eq!(stats.cache.in_use, 0);
    assert_eq!(stats.requests, 0);

    // 66 blocks of 4 = 264 positions for 32 sequences of 10-70 tokens: preemption is certain.
    let mut cramped = config(66, 32);
    cramped.scheduler.kv.block_size = 4;
    let tight = start(cramped);
    let squeezed = run_concurrently(&tight, &prompts, &max_tokens);
    let stats = tight.stats().unwrap();
    assert!(stats.scheduler.preemptions > 0, "{stats:?}");
    for (i, (got, want)) in squeezed.iter().zip(&solo).enumerate() {
        assert_eq!(got, want, "request {i} under preemption");
    }
    assert_eq!(stats.cache.in_use, 0);
}

#[test]
fn seeded_sampling_does_not_depend_on_batch_mates() {
    let tokenizer = &smollm2().tokenizer;
    let handle = start(config(256, 16));
    let sampled = |seed: u64| Request {
        prompt: tokenizer.encode(PROMPTS[3]).unwrap(),
        sampling: SamplingParams {
            temperature: 0.9,
            top_p: 0.95,
            top_k: Some(40),
            seed: Some(seed),
            ..SamplingParams::default()
        },
        stop: StopConditions {
            max_tokens: 16,
            ..StopConditions::default()
        },
        n: 2,
        speculation: None,
        constraint: None,
        thinking: None,
        prediction: None,
        cache_salt: None,
        pooling: None,
    };
    let alone = handle.submit(sampled(7)).unwrap().wait().unwrap();
    // The same request among others with other seeds and prompts.
    let mut others = Vec::new();
    for (i, prompt) in PROMPTS.iter().enumerate() {
        let mut r = sampled(100 + i as u64);
        r.prompt = tokenizer.encode(prompt).unwrap();
        others.push(handle.submit(r).unwrap());
    }
    let crowded = handle.submit(sampled(7)).unwrap().wait().unwrap();
    let texts = |out: &[engine::SampleOutput]| -> Vec<(Vec<u32>, String)> {
        out.iter()
            .map(|s| (s.token_ids.clone(), s.text.clone()))
            .collect()
    };
    assert_eq!(texts(&alone), texts(&crowded));
    assert_ne!(
        alone[0].token_ids, alone[1].token_ids,
        "the two samples should differ"
    );
    let other_seed = handle.submit(sampled(8)).unwrap().wait().unwrap();
    assert_ne!(alone[0].token_ids, other_seed[0].token_ids);
    for stream in others {
        assert_eq!(stream.wait().unwrap().len(), 2);
    }
}

#[test]
fn stop_strings_spanning_tokens_cut_the_text() {
    let loaded = smollm2();
    let tokenizer = &loaded.tokenizer;
    let handle = start(config(128, 8));
    let prompt = tokenizer.encode(PROMPTS[3]).unwrap();
    let full = handle
        .submit(greedy(prompt.clone(), 24))
        .unwrap()
        .wait()
        .unwrap();
    let full = &full[0];
    assert_eq!(
        full.text,
        tokenizer.decode_skip_special(&full.token_ids).unwrap()
    );
    // A stop string made of the end of token 4's text and the start of token 5's.
    let before = tokenizer.decode_skip_special(&full.token_ids[..4]).unwrap();
    let through = tokenizer.decode_skip_special(&full.token_ids[..5]).unwrap();
    assert!(
        before.len() >= 2 && through.len() > before.len() + 1,
        "{before:?} {through:?}"
    );
    let stop = through[before.len() - 2..before.len() + 2].to_string();
    let cut = full.text.find(&stop).unwrap();
    let mut request = greedy(prompt, 24);
    request.stop.stop = vec!["never appears".into(), stop.clone()];
    let stopped = handle.submit(request).unwrap().wait().unwrap();
    assert_eq!(stopped[0].text, full.text[..cut]);
    assert_eq!(stopped[0].finish, Some(FinishReason::StopString(stop)));
    assert!(stopped[0].token_ids.len() <= 5);
}

#[test]
fn end_tokens_min_tokens_and_stop_token_ids() {
    let loaded = smollm2();
    let tokenizer = &loaded.tokenizer;
    let handle = start(config(128, 8));
    let chat = tokenizer
        .encode("<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")
        .unwrap();
    let short = handle
        .submit(greedy(chat.clone(), 64))
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(short[0].finish, Some(FinishReason::Eos));
    let eos = *short[0].token_ids.last().unwrap();
    assert!(tokenizer.eos_ids().contains(&eos));
    assert!(!short[0].text.contains("<|im_end|>"));

    let long_enough = short[0].token_ids.len() + 5;
    let mut request = greedy(chat.clone(), long_enough);
    request.stop.min_tokens = long_enough;
    let forced = handle.submit(request).unwrap().wait().unwrap();
    assert_eq!(forced[0].token_ids.len(), long_enough);
    assert!(forced[0]
        .token_ids
        .iter()
        .all(|t| !tokenizer.eos_ids().contains(t)));
    assert_eq!(forced[0].finish, Some(FinishReason::Length));

    let mut request = greedy(chat.clone(), 64);
    request.stop.ignore_eos = true;
    request.stop.max_tokens = short[0].token_ids.len() + 3;
    let ignored = handle.submit(request).unwrap().wait().unwrap();
    assert_eq!(ignored[0].token_ids.len(), short[0].token_ids.len() + 3);

    let second = short[0].token_ids[1];
    let mut request = greedy(chat, 64);
    request.stop.stop_token_ids = vec![second];
    let stopped = handle.submit(request).unwrap().wait().unwrap();
    assert_eq!(stopped[0].finish, Some(FinishReason::StopToken(second)));
    assert_eq!(stopped[0].token_ids, short[0].token_ids[..2]);
}

#[test]
fn logprobs_usage_cancellation_and_overload() {
    let loaded = smollm2();
    let tokenizer = &loaded.tokenizer;
    let handle = start(EngineConfig {
        max_pending: 2,
        ..config(128, 8)
    });
    let prompt = tokenizer.encode(PROMPTS[0]).unwrap();
    let mut request = greedy(prompt.clone(), 4);
    request.sampling.logprobs = Some(3);
    let out = handle.submit(request).unwrap().wait().unwrap();
    assert_eq!(out[0].logprobs.len(), 4);
    for (lp, &token) in out[0].logprobs.iter().zip(&out[0].token_ids) {
        assert_eq!(lp.token_id, token);
        assert_eq!(lp.top.len(), 3);
        assert_eq!(lp.top[0].0, token, "greedy picks the most likely token");
        assert!(lp.logprob <= 0.0 && (lp.logprob - lp.top[0].1).abs() < 1e-6);
    }
    assert_eq!(out[0].usage.prompt_tokens, prompt.len());
    assert_eq!(out[0].usage.completion_tokens, 4);

    // Dropping the stream cancels: the request leaves and its blocks are freed.
    let stream = handle.submit(greedy(prompt.clone(), 200)).unwrap();
    assert!(stream.recv().is_some());
    drop(stream);
    let mut stats = handle.stats().unwrap();
    for _ in 0..100 {
        if stats.requests == 0 {
            break;
        }
        stats = handle.stats().unwrap();
    }
    assert_eq!(stats.requests, 0);
    assert_eq!(stats.cache.in_use, 0);
    assert_eq!(handle.pending(), 0);

    // Beyond max_pending the engine refuses at once.
    let a = handle.submit(greedy(prompt.clone(), 50)).unwrap();
    let b = handle.submit(greedy(prompt.clone(), 50)).unwrap();
    assert!(matches!(
        handle.submit(greedy(prompt.clone(), 5)),
        Err(SubmitError::Overloaded(_))
    ));
    drop((a, b));
    let bad = Request {
        prompt: vec![1_000_000],
        ..greedy(prompt.clone(), 5)
    };
    match handle.submit(bad.clone()) {
        Err(SubmitError::Invalid(e)) => assert_eq!(e.field, "prompt"),
        other => panic!("expected an invalid prompt, got {other:?}"),
    }
    wait_until_idle(&handle);

    // Submitted together: all or none. One invalid request refuses the lot, and more than
    // max_pending at once is refused whole; nothing of either runs.
    match handle.submit_all(vec![greedy(prompt.clone(), 3), bad]) {
        Err(SubmitError::Invalid(e)) => assert_eq!(e.field, "prompt"),
        other => panic!("expected an invalid prompt, got {other:?}"),
    }
    let three = vec![greedy(prompt.clone(), 3); 3];
    assert!(matches!(
        handle.submit_all(three),
        Err(SubmitError::Overloaded(0))
    ));
    assert_eq!(handle.pending(), 0);
    assert_eq!(handle.stats().unwrap().requests, 0);
    let alone = handle
        .submit(greedy(prompt.clone(), 6))
        .unwrap()
        .wait()
        .unwrap();
    let together: Vec<_> = handle
        .submit_all(vec![greedy(prompt.clone(), 6), greedy(prompt, 6)])
        .unwrap()
        .into_iter()
        .map(|s| s.wait().unwrap().remove(0).token_ids)
        .collect();
    assert_eq!(together, vec![alone[0].token_ids.clone(); 2]);
}

/// Waits for the engine to drop every cancelled request.
fn wait_until_idle(handle: &EngineHandle) {
    for _ in 0..1000 {
        if handle.pending() == 0 {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    panic!(
        "cancelled requests were never dropped: {:?}",
        handle.stats()
    );
}
