//! Predicted Outputs in the engine: a request's `prediction` drafts first under every
//! method but `none`, and output stays exactly what plain decoding gives: greedy with a
//! prediction that is right, wrong from its first token, or departing and rejoining (alone
//! and in batches with preemption), seeded sampling token for token, `n` > 1 forks, and the
//! sampled distribution at temperature 1 (chi-square). The usage counts what was drafted
//! from the prediction and accepted or rejected.

use std::sync::Arc;

use engine::{Request, SamplingParams, SpecMethod};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::speculation::{chi_square, plain_outputs, request, run_all, start, tiny_loaded, Setup};

fn predicted(prompt: &[u32], method: SpecMethod, max_tokens: usize, prediction: &[u32]) -> Request {
    let mut r = request(prompt, method, max_tokens);
    r.prediction = Some(Arc::from(prediction));
    r
}

/// `reference` edited: a stretch replaced, one inserted and one deleted, so an output that
/// is `reference` leaves the prediction and rejoins it three times.
fn edited(reference: &[u32], rng: &mut StdRng, vocab: u32) -> Vec<u32> {
    let n = reference.len();
    let mut out = reference[..n / 4].to_vec();
    out.extend((0..3).map(|_| rng.random_range(0..vocab)));
    out.extend(&reference[n / 4 + 3..n / 2]);
    out.extend((0..4).map(|_| rng.random_range(0..vocab)));
    out.extend(&reference[n / 2..3 * n / 4]);
    out.extend(&reference[3 * n / 4 + 2..]);
    out
}

#[test]
fn greedy_output_is_the_same_with_any_prediction_under_every_method() {
    let dir = tempfile::tempdir().unwrap();
    let vocab = 256;
    let loaded = tiny_loaded(dir.path(), vocab);
    let mut rng = StdRng::seed_from_u64(11);
    let prompts: Vec<Vec<u32>> = (0..6)
        .map(|_| {
            (0..rng.random_range(5..20))
                .map(|_| rng.random_range(0..vocab as u32))
                .collect()
        })
        .collect();
    let max_tokens = 40;
    let reference = plain_outputs(&loaded, &prompts, max_tokens);
    let (handle, _) = start(
        &loaded,
        Setup {
            max_draft: 32,
            ..Setup::default()
        },
    );
    let methods = [
        SpecMethod::Auto,
        SpecMethod::PromptLookup,
        SpecMethod::Recycling,
        SpecMethod::NgramTrie,
    ];
    let mut accepted_right = 0;
    let mut accepted_edited = 0;
    let mut rejected_wrong = 0;
    for (i, (prompt, want)) in prompts.iter().zip(&reference).enumerate() {
        let method = methods[i % methods.len()];
        // Right: the output itself.
        let out = &run_all(&handle, vec![predicted(prompt, method, max_tokens, want)])[0];
        assert_eq!(&out.token_ids, want, "right prediction, {method:?}");
        assert!(out.usage.accepted_prediction_tokens() <= out.usage.accepted_tokens);
        accepted_right += out.usage.accepted_prediction_tokens();
        // Wrong from its first token: random tokens that never start the output.
        let wrong: Vec<u32> = (0..60)
            .map(|_| rng.random_range(0..vocab as u32))
            .filter(|&t| t != want[0])
            .collect();
        let out = &run_all(&handle, vec![predicted(prompt, method, max_tokens, &wrong)])[0];
        assert_eq!(&out.token_ids, want, "wrong prediction, {method:?}");
        rejected_wrong += out.usage.rejected_prediction_tokens();
        // Departing from the output and rejoining it.
        let edit = edited(want, &mut rng, vocab as u32);
        let out = &run_all(&handle, vec![predicted(prompt, method, max_tokens, &edit)])[0];
        assert_eq!(&out.token_ids, want, "edited prediction, {method:?}");
        accepted_edited += out.usage.accepted_prediction_tokens();
        // `none` ignores it.
        let out = &run_all(
            &handle,
            vec![predicted(prompt, SpecMethod::None, max_tokens, want)],
        )[0];
        assert_eq!(&out.token_ids, want);
        assert_eq!(out.usage.draft_tokens, 0, "none drafted: {:?}", out.usage);
        // An empty prediction does nothing.
        let out = &run_all(&handle, vec![predicted(prompt, method, max_tokens, &[])])[0];
        assert_eq!(&out.token_ids, want);
        assert_eq!(out.usage.source(SpecMethod::Prediction).drafted, 0);
    }
    // A right prediction is followed for most of the output; an edited one too.
    let total = (max_tokens * prompts.len()) as f64;
    assert!(
        accepted_right as f64 > 0.6 * total,
        "right: {accepted_right} of {total}"
    );
    assert!(
        accepted_edited as f64 > 0.3 * total,
        "edited: {accepted_edited} of {total}"
    );
    assert!(rejected_wrong > 0, "a wrong prediction was never drafted");

    // A batch of 12 with a pool small enough to preempt, prefill in chunks, predictions of
    // every kind, methods mixed.
    let (tight, _) = start(
        &loaded,
        Setup {
            num_blocks: 44,
            block_size: 4,
            budget: 48,
            max_draft: 16,
            ..Setup::default()
        },
    );
    let requests: Vec<Request> = (0..12)
        .map(|i| {
            let (prompt, want) = (&prompts[i % prompts.len()], &reference[i % prompts.len()]);
            let prediction = match i % 3 {
                0 => want.clone(),
                1 => edited(want, &mut rng, vocab as u32),
                _ => want.iter().map(|t| (t + 1) % vocab as u32).collect(),
            };
            predicted(prompt, methods[i % methods.len()], max_tokens, &prediction)
        })
        .collect();
    let outputs = run_all(&tight, requests);
    for (i, out) in outputs.iter().enumerate() {
        assert_eq!(
            out.token_ids,
            reference[i % prompts.len()],
            "batch request {i}"
        );
    }
    assert!(tight.stats().unwrap().scheduler.preemptions > 0);
}

#[test]
fn sampling_with_a_prediction_keeps_the_distribution_and_the_seeds() {
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
    let prompt = [1u32, 2, 3, 4, 5];
    // A prediction of what the greedy output would be, roughly: tokens the model often
    // samples, so that drafts are accepted and rejected alike.
    let greedy = run_all(&handle, vec![request(&prompt, SpecMethod::None, 6)])[0]
        .token_ids
        .clone();
    let samples = 1200;
    let sampled = |method: SpecMethod, seed: u64, prediction: Option<&[u32]>| {
        let mut r = request(&prompt, method, 5);
        r.sampling = SamplingParams {
            temperature: 1.0,
            seed: Some(seed),
            ..SamplingParams::default()
        };
        r.prediction = prediction.map(Arc::from);
        r
    };
    let histogram = |method: SpecMethod, first_seed: u64, prediction: Option<&[u32]>| {
        let mut counts = vec![0; vocab * 4];
        let mut accepted = 0;
        let mut outputs = Vec::new();
        for chunk in (0..samples as u64).collect::<Vec<_>>().chunks(48) {
            let requests = chunk
                .iter()
                .map(|&s| sampled(method, first_seed + s, prediction))
                .collect();
            for out in run_all(&handle, requests) {
                for (pos, &t) in out.token_ids.iter().enumerate().skip(1) {
                    counts[(pos - 1) * vocab + t as usize] += 1;
                }
                accepted += out.usage.accepted_prediction_tokens();
                outputs.push(out.token_ids);
            }
        }
        (counts, accepted, outputs)
    };
    let (plain, _, plain_outputs) = histogram(SpecMethod::None, 1_000_000, None);
    let (counts, accepted, _) = histogram(SpecMethod::Auto, 0, Some(&greedy));
    assert!(
        accepted > 0,
        "no prediction token accepted: the test would prove little"
    );
    // 48 cells at most -> 47 degrees of freedom; p = 0.001 is at 82.7.
    let chi2 = chi_square(&plain, &counts);
    assert!(chi2 < 82.7, "chi-square {chi2:.1}");
    // Same seeds: the very same outputs with a prediction as without.
    let (_, _, same_seeds) = histogram(SpecMethod::Auto, 1_000_000, Some(&greedy));
    assert_eq!(same_seeds, plain_outputs);
}

#[test]
fn forks_of_an_n_request_follow_the_prediction_and_keep_their_seeds() {
    let dir = tempfile::tempdir().unwrap();
    let vocab = 64;
    let loaded = tiny_loaded(dir.path(), vocab);
    let (handle, _) = start(
        &loaded,
        Setup {
            max_draft: 16,
            ..Setup::default()
        },
    );
    let prompt = [7u32, 8, 9, 10, 11, 12];
    let make = |prediction: Option<Vec<u32>>, method: SpecMethod| {
        let mut r = request(&prompt, method, 24);
        r.n = 4;
        r.sampling = SamplingParams {
            temperature: 0.7,
            seed: Some(42),
            ..SamplingParams::default()
        };
        r.prediction = prediction.map(Arc::from);
        r
    };
    let plain = handle
        .submit(make(None, SpecMethod::None))
        .unwrap()
        .wait()
        .unwrap();
    // The prediction: the first sample's output, so the others' forks follow it for as long
    // as they agree with it.
    let prediction = plain[0].token_ids.clone();
    let with = handle
        .submit(make(Some(prediction), SpecMethod::Auto))
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(plain.len(), 4);
    for (a, b) in plain.iter().zip(&with) {
        assert_eq!(a.token_ids, b.token_ids);
    }
    assert!(
        with[0].usage.accepted_prediction_tokens() > 0,
        "{:?}",
        with[0].usage
    );
}

/// `thicket batch` with a prediction on a line: a first job gives a prompt's output, a
/// second sends it back as the prediction (as a client that knows the answer would) beside
/// a line whose prediction is malformed. The output is the same, the usage says how much of
/// the prediction was accepted, and the bad line alone fails with a 400 naming the field.
#[test]
fn a_batch_line_with_a_prediction() {
    use serde_json::{json, Value};

    let dir = tempfile::tempdir().unwrap();
    let model = crate::support::fixtures::smollm2_path();
    let run = |lines: &[Value], name: &str| -> Vec<Value> {
        let input = dir.path().join(format!("{name}.in.jsonl"));
        let output = dir.path().join(format!("{name}.out.jsonl"));
        let text: String = lines.iter().map(|l| l.to_string() + "\n").collect();
        std::fs::write(&input, text).unwrap();
        let out = crate::support::processes::thicket()
            .args(["batch", "-i"])
            .arg(&input)
            .arg("-o")
            .arg(&output)
            .args(["--kv-cache-mib", "128", "--model"])
            .arg(&model)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut results: Vec<Value> = std::fs::read_to_string(&output)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        results.sort_by_key(|r| r["custom_id"].as_str().unwrap_or("").to_string());
        results
    };
    let body = json!({
        "prompt": "Here is a list of ten fruits, one per line:\n1.",
        "max_tokens": 64,
        "temperature": 0,
    });
    let line = |id: &str, body: &Value| json!({"custom_id": id, "method": "POST", "url": "/v1/completions", "body": body});
    let first = run(&[line("plain", &body)], "first");
    let text = first[0]["response"]["body"]["choices"][0]["text"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(text.len() > 40, "{text:?}");
    let mut predicted = body.clone();
    predicted["prediction"] = json!({"type": "content", "content": text});
    let mut bad = body.clone();
    bad["prediction"] = json!({"type": "contents", "content": text});
    let second = run(
        &[line("bad", &bad), line("predicted", &predicted)],
        "second",
    );
    assert_eq!(second[0]["response"]["status_code"], 400, "{}", second[0]);
    assert_eq!(
        second[0]["error"]["param"], "prediction.type",
        "{}",
        second[0]
    );
    let body = &second[1]["response"]["body"];
    assert_eq!(body["choices"][0]["text"], text.as_str());
    let details = &body["usage"]["completion_tokens_details"];
    let accepted = details["accepted_prediction_tokens"].as_u64().unwrap();
    assert!(accepted > 10, "{}", body["usage"]);
    assert_eq!(
        body["thicket"]["speculation"]["sources"]["prediction"]["accepted_tokens"],
        accepted
    );
}
