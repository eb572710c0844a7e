//! `cache_salt` isolation, observed from outside: a request finds cached prompt blocks only
//! from requests with its salt (or with none, when it has none), in the engine and through
//! the real `thicket serve`, with outputs unchanged; the global suffix index drafts for a
//! request only what requests of its salt taught it; a salt that is not a non-empty string
//! gets a 400 naming the field.

use std::sync::Arc;

use engine::{Request, SpecMethod};
use serde_json::{json, Value};

use super::speculation::{start, tiny_loaded, Setup};
use crate::support::fixtures::{smollm2, smollm2_path};
use crate::support::processes::ServerProcess;

/// One greedy request for `prompt` under `salt`: its output tokens and cached prompt tokens.
fn once(
    handle: &engine::handle::EngineHandle,
    prompt: &[u32],
    salt: Option<&str>,
) -> (Vec<u32>, usize) {
    let mut request = Request::greedy(prompt.to_vec(), 8, Some(SpecMethod::None));
    request.cache_salt = salt.map(Arc::from);
    let out = handle.submit(request).unwrap().wait().unwrap().remove(0);
    (out.token_ids, out.usage.cached_tokens)
}

#[test]
fn cached_prompt_blocks_are_shared_only_within_a_salt() {
    let dir = tempfile::tempdir().unwrap();
    let loaded = tiny_loaded(dir.path(), 64);
    let (handle, _engine) = start(&loaded, Setup::default());
    let prompt: Vec<u32> = (0..64).map(|i| (i * 7 % 61) as u32 + 1).collect();
    // Blocks of 16: a repeated 64-token prompt reads its first three blocks from the cache.
    let hit = 48;
    let (first, cached) = once(&handle, &prompt, None);
    assert_eq!(cached, 0);
    let steps: [(Option<&str>, usize); 6] = [
        (None, hit),
        (Some("tenant-a"), 0),
        (Some("tenant-a"), hit),
        (Some("tenant-b"), 0),
        (Some("tenant-a"), hit),
        (None, hit),
    ];
    for (i, (salt, want)) in steps.into_iter().enumerate() {
        let (tokens, cached) = once(&handle, &prompt, salt);
        assert_eq!(cached, want, "request {i} under {salt:?}");
        assert_eq!(tokens, first, "request {i}: the salt changed the output");
    }
    // An `n` > 1 request's forks leave their blocks under its salt too.
    let mut forked = Request::greedy(prompt[..40].to_vec(), 24, Some(SpecMethod::None));
    forked.n = 2;
    forked.cache_salt = Some(Arc::from("tenant-c"));
    let outputs = handle.submit(forked).unwrap().wait().unwrap();
    let mut longer = prompt[..40].to_vec();
    longer.extend(&outputs[1].token_ids);
    longer.push(1);
    assert!(once(&handle, &longer, Some("tenant-c")).1 >= 48);
    assert_eq!(once(&handle, &longer, Some("tenant-d")).1, 0);
}

#[test]
fn the_global_suffix_index_drafts_only_within_a_salt() {
    let loaded = smollm2();
    let (handle, _engine) = start(
        loaded,
        Setup {
            max_draft: 16,
            ..Setup::default()
        },
    );
    let prompt = loaded
        .tokenizer
        .encode("A lighthouse keeper on a remote island kept a diary. On the first page he wrote")
        .unwrap();
    let run = |salt: Option<&str>| {
        let mut request = Request::greedy(prompt.clone(), 64, Some(SpecMethod::Suffix));
        request.cache_salt = salt.map(Arc::from);
        handle.submit(request).unwrap().wait().unwrap().remove(0)
    };
    // The first request teaches tenant-a's index its prompt and, once done, its output.
    let first = run(Some("tenant-a"));
    assert_eq!(first.token_ids.len(), 64);
    let same = run(Some("tenant-a"));
    let other = run(Some("tenant-b"));
    let none = run(None);
    for out in [&same, &other, &none] {
        assert_eq!(
            out.token_ids, first.token_ids,
            "drafting changed the output"
        );
    }
    let accepted = |o: &engine::SampleOutput| o.usage.accepted_tokens;
    // Tenant a's second request drafts its whole output from the first's.
    assert!(
        accepted(&same) >= 48,
        "tenant-a accepted only {} of 64 tokens from its own earlier output",
        accepted(&same)
    );
    // The others draft only from their own context (and their own salt's empty index).
    for (who, out) in [("tenant-b", &other), ("no salt", &none)] {
        assert!(
            accepted(out) + 16 <= accepted(&same),
            "{who} accepted {} drafts, tenant-a {}: another salt's output leaked",
            accepted(out),
            accepted(&same)
        );
    }
}

#[test]
fn the_server_scopes_cached_tokens_by_salt_and_refuses_bad_salts() {
    let model = smollm2_path();
    let server = ServerProcess::start(
        &[
            "--served-model-name",
            "smollm2",
            "--kv-cache-mib",
            "64",
            "--model",
            model.to_str().expect("a UTF-8 path"),
        ],
        &[],
    );
    let prompt = "The cache salt keeps one tenant's prompts away from another's. ".repeat(6);
    let complete = |salt: Value| {
        let mut body = json!({"model": "smollm2", "prompt": prompt, "max_tokens": 4,
                              "temperature": 0});
        if !salt.is_null() {
            body["cache_salt"] = salt;
        }
        let (status, answer) = server.post("/v1/completions", &body);
        assert_eq!(status, 200, "{answer}");
        let cached = answer["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0);
        (
            answer["choices"][0]["text"].as_str().unwrap().to_string(),
            cached,
        )
    };
    let (text, _) = complete(json!("alpha"));
    assert_eq!(
        complete(json!("beta")).1,
        0,
        "another salt's blocks were served"
    );
    assert_eq!(
        complete(Value::Null).1,
        0,
        "a salted prompt's blocks were served unsalted"
    );
    let (again, cached) = complete(json!("alpha"));
    assert!(cached > 0, "the same salt found nothing cached");
    assert_eq!(again, text);
    // Chat takes the field too.
    let chat = |salt: &str| {
        let body = json!({"model": "smollm2", "max_tokens": 2, "cache_salt": salt,
                          "messages": [{"role": "user", "content": prompt}]});
        let (status, answer) = server.post("/v1/chat/completions", &body);
        assert_eq!(status, 200, "{answer}");
        answer["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0)
    };
    assert_eq!(chat("gamma"), 0);
    assert!(chat("gamma") > 0);
    for bad in [json!(""), json!(5), json!(["a"]), json!("x".repeat(1025))] {
        let body = json!({"model": "smollm2", "prompt": "Hi", "max_tokens": 1, "cache_salt": bad});
        let (status, answer) = server.post("/v1/completions", &body);
        assert_eq!(status, 400, "{bad}: {answer}");
        assert_eq!(answer["error"]["param"], "cache_salt", "{answer}");
    }
    // The global suffix index learnt those requests (every prompt, and every output with
    // its prompt's end), across the salts' indexes, and says so in /metrics. Six requests
    // reached the engine (the bad salts did not), each learnt as a prompt and as an output;
    // the engine learns a finished output just after it sends the response's last event, so
    // the last one may show a moment after its response.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let metrics = loop {
        let (status, metrics) = server.get("/metrics");
        assert_eq!(status, 200);
        let learnt = metrics.lines().find_map(|l| {
            l.strip_prefix("thicket_spec_suffix_index_requests ")?
                .trim()
                .parse::<f64>()
                .ok()
        });
        if learnt >= Some(12.0) || std::time::Instant::now() > deadline {
            break metrics;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let value = |name: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("{name} missing from /metrics"))
    };
    assert_eq!(value("thicket_spec_suffix_index_requests "), 12.0);
    assert!(value("thicket_spec_suffix_index_tokens ") >= 6.0 * 60.0);
    assert!(value("thicket_spec_suffix_index_bytes ") > 0.0);
    assert_eq!(value("thicket_spec_suffix_index_evictions_total "), 0.0);
}

/// Token Recycling's matrix is kept per salt. A teacher request under salt a teaches its
/// salt's matrix; a student (the teacher's prompt and the start of its answer) then drafts
/// better under salt a than under salt b, whose matrix starts cold, as it would in a fresh
/// engine. Outputs are the same (verification is lossless).
#[test]
fn recycling_drafts_only_from_what_its_salt_taught() {
    let dir = tempfile::tempdir().unwrap();
    let loaded = tiny_loaded(dir.path(), 256);
    let setup = || Setup {
        max_draft: 32,
        ..Setup::default()
    };
    let teacher: Vec<u32> = (0..12).map(|i| (i * 37) % 256).collect();
    let run = |handle: &engine::handle::EngineHandle, prompt: &[u32], salt: &str| {
        let mut request = Request::greedy(prompt.to_vec(), 40, Some(SpecMethod::Recycling));
        request.cache_salt = Some(Arc::from(salt));
        handle.submit(request).unwrap().wait().unwrap().remove(0)
    };
    let mat = |out: &engine::SampleOutput| {
        (out.usage.spec_steps + out.usage.accepted_tokens) as f64
            / out.usage.spec_steps.max(1) as f64
    };
    let (handle, _engine) = start(&loaded, setup());
    let answer = run(&handle, &teacher, "a");
    let mut student = teacher.clone();
    student.extend(&answer.token_ids[..6]);
    let other = run(&handle, &student, "b");
    let same = run(&handle, &student, "a");
    let (fresh, _fresh_engine) = start(&loaded, setup());
    let alone = run(&fresh, &student, "b");
    assert_eq!(same.token_ids, other.token_ids);
    assert!(
        mat(&same) > mat(&other),
        "salt a's MAT {:.2} vs salt b's {:.2}",
        mat(&same),
        mat(&other)
    );
    // Salt b saw nothing of salt a's: it drafts as a fresh engine does.
    assert_eq!(other.usage.accepted_tokens, alone.usage.accepted_tokens);
    assert_eq!(other.usage.draft_tokens, alone.usage.draft_tokens);
}
