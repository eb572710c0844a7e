//! Sampling under an output format keeps the masked distribution, on SmolLM2. The first token
//! sampled under a regex is distributed as the model's own first token given that it is one
//! the regex allows (unconstrained samples that happen to be allowed are exactly such draws):
//! a two-sample chi-square compares the two. Later tokens sampled with speculation (drafts
//! pruned to the format, each node verified against its own mask) are distributed as without
//! it, and the same seeds give the same tokens either way.

use std::collections::HashMap;

use engine::constraint::ConstraintSpec;
use engine::handle::EngineHandle;
use engine::{
    CostCurve, EngineConfig, Request, SamplingParams, SpecMethod, SpecRequest, SpeculationConfig,
    StopConditions,
};
use kvcache::ManagerConfig;
use scheduler::SchedulerConfig;

use crate::support::fixtures::{smollm2, spawn_smollm2};

const PROMPT: &str = "Words made of the letters a to h: bad, cab, ace, fed, dab, bed, cafe, bead, fade, deaf, head, each,";
/// A comma-separated list of words, as the prompt is: the context drafters' proposals (the
/// prompt's list from a matched word on) are text the format allows, so drafts reach
/// verification. A format of one word alone ends after a token or two, and nearly every draft
/// (the prompt's "," after a word) was pruned: a run then verified two draft tokens in 6,000.
const FORMAT: &str = " [a-z]{1,10}(, [a-z]{1,10})*";
const SAMPLES: u64 = 1500;

fn engine() -> EngineHandle {
    spawn_smollm2(EngineConfig {
        scheduler: SchedulerConfig {
            max_num_batched_tokens: 512,
            max_num_seqs: 64,
            max_model_len: 256,
            kv: ManagerConfig {
                num_blocks: 512,
                block_size: 16,
                prefix_caching: true,
                watermark: 0.01,
                window: None,
            },
        },
        max_pending: 2048,
        // A flat cost curve makes every draft look free, so drafters draft whatever the load.
        speculation: SpeculationConfig {
            cost: CostCurve::flat(),
            ..SpeculationConfig::default()
        },
        kv_prefault: false,
        state_snapshots: Default::default(),
    })
}

/// `SAMPLES` samples of `max_tokens` tokens (seeds from `first_seed`): their tokens, and the
/// draft tokens accepted over all of them.
fn sample(
    handle: &EngineHandle,
    format: bool,
    method: SpecMethod,
    max_tokens: usize,
    first_seed: u64,
) -> (Vec<Vec<u32>>, usize) {
    let prompt = smollm2().tokenizer.encode(PROMPT).unwrap();
    let streams: Vec<_> = (0..SAMPLES)
        .map(|i| {
            let request = Request {
                prompt: prompt.clone(),
                sampling: SamplingParams {
                    temperature: 1.0,
                    seed: Some(first_seed + i),
                    ..SamplingParams::default()
                },
                stop: StopConditions {
                    max_tokens,
                    ..StopConditions::default()
                },
                n: 1,
                speculation: Some(SpecRequest {
                    method,
                    max_draft_tokens: Some(4),
                }),
                constraint: format.then(|| ConstraintSpec::Regex(FORMAT.into())),
                thinking: None,
                prediction: None,
                cache_salt: None,
                pooling: None,
            };
            handle.submit(request).unwrap()
        })
        .collect();
    let mut tokens = Vec::new();
    let mut accepted = 0;
    for stream in streams {
        let out = stream.wait().unwrap().remove(0);
        accepted += out.usage.accepted_tokens;
        tokens.push(out.token_ids);
    }
    (tokens, accepted)
}

/// Two-sample chi-square over the tokens of `a` and `b`, cells with fewer than 10 draws in
/// both together pooled into one, and its critical value at p = 0.001 (Wilson-Hilferty).
fn chi_square(a: &[u32], b: &[u32]) -> (f64, f64) {
    let mut cells: HashMap<u32, (f64, f64)> = HashMap::new();
    for &t in a {
        cells.entry(t).or_default().0 += 1.0;
    }
    for &t in b {
        cells.entry(t).or_default().1 += 1.0;
    }
    let mut pooled = (0.0, 0.0);
    let mut kept: Vec<(f64, f64)> = Vec::new();
    for (x, y) in cells.into_values() {
        if x + y < 10.0 {
            pooled.0 += x;
            pooled.1 += y;
        } else {
            kept.push((x, y));
        }
    }
    if pooled.0 + pooled.1 > 0.0 {
        kept.push(pooled);
    }
    let (na, nb) = (a.len() as f64, b.len() as f64);
    let statistic = kept
        .iter()
        .map(|&(x, y)| {
            let (ea, eb) = ((x + y) * na / (na + nb), (x + y) * nb / (na + nb));
            (x - ea).powi(2) / ea + (y - eb).powi(2) / eb
        })
        .sum();
    let df = (kept.len().max(2) - 1) as f64;
    let z = 3.09;
    let critical = df * (1.0 - 2.0 / (9.0 * df) + z * (2.0 / (9.0 * df)).sqrt()).powi(3);
    (statistic, critical)
}

/// Whether the format lets token `t` come first: a space, then up to ten lower-case letters.
fn allowed_first(t: u32) -> bool {
    let text = smollm2().tokenizer.decode(&[t]).unwrap();
    text.strip_prefix(' ')
        .is_some_and(|rest| rest.len() <= 10 && rest.bytes().all(|b| b.is_ascii_lowercase()))
}

#[test]
fn sampling_under_a_format_keeps_the_masked_distribution() {
    // Each run on an engine of its own, so no prefix cache or drafter learning crosses over.
    let (free, _) = sample(&engine(), false, SpecMethod::None, 1, 1_000_000);
    let kept: Vec<u32> = free
        .iter()
        .map(|t| t[0])
        .filter(|&t| allowed_first(t))
        .collect();
    assert!(
        kept.len() as u64 > SAMPLES / 3,
        "only {} of {SAMPLES} free samples were allowed: the comparison would be weak",
        kept.len()
    );
    let (masked, _) = sample(&engine(), true, SpecMethod::None, 4, 0);
    let first: Vec<u32> = masked.iter().map(|t| t[0]).collect();
    assert!(first.iter().all(|&t| allowed_first(t)));
    let (chi2, critical) = chi_square(&kept, &first);
    assert!(
        chi2 < critical,
        "first token under the format: chi-square {chi2:.1} >= {critical:.1}"
    );

    // With speculation: the same distribution at every position, the same tokens per seed.
    for method in [SpecMethod::PromptLookup, SpecMethod::NgramTrie] {
        let (drafted, accepted) = sample(&engine(), true, method, 4, 0);
        assert!(
            accepted > 0,
            "{method:?}: no draft accepted, the check would prove little"
        );
        assert_eq!(
            drafted, masked,
            "{method:?}: the same seeds gave other tokens"
        );
        let (other_seeds, _) = sample(&engine(), true, method, 4, 7_000_000);
        for pos in 0..4 {
            let at = |runs: &[Vec<u32>]| -> Vec<u32> {
                runs.iter().filter_map(|t| t.get(pos).copied()).collect()
            };
            let (chi2, critical) = chi_square(&at(&masked), &at(&other_seeds));
            assert!(
                chi2 < critical,
                "{method:?}, position {pos}: chi-square {chi2:.1} >= {critical:.1}"
            );
        }
    }
}
