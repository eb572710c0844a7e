//! `thicket batch` end to end on SmolLM2, run as the real binary: 200 requests whose result
//! bodies equal what `thicket serve` answers for the same requests; a job killed with
//! SIGKILL at random points (and left with a torn last line) that resumes to every id
//! exactly once; malformed lines among good ones, each becoming its own error line; and
//! `--kv-cache-dtype` (f16 by default, twice the tokens of f32 per MiB, either serving).

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::Path;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use crate::support::fixtures::{smollm2_path, PROMPTS};
use crate::support::processes::{thicket, ServerProcess};

/// Engine flags shared by the batch job and the server it is compared with. f32 weights
/// batch well on a CPU; without prefix caching and speculation, `cached_tokens` and the
/// speculation counters do not depend on how requests happened to be batched.
const EXACT_FLAGS: [&str; 10] = [
    "--served-model-name",
    "smollm2",
    "--dtype",
    "f32",
    "--kv-cache-mib",
    "256",
    "--speculation",
    "none",
    "--max-model-len",
    "1024",
];

fn model_path() -> String {
    smollm2_path()
        .to_str()
        .expect("a UTF-8 model path")
        .to_string()
}

/// Runs `thicket batch -i input -o output ARGS --json` to completion.
fn run_batch(input: &Path, output: &Path, args: &[&str]) -> Output {
    thicket()
        .arg("batch")
        .arg("-i")
        .arg(input)
        .arg("-o")
        .arg(output)
        .args(args)
        .args(["--model", &model_path(), "--json"])
        .stdin(Stdio::null())
        .output()
        .expect("running thicket batch")
}

fn write_lines(path: &Path, lines: &[String]) {
    std::fs::write(path, lines.join("\n") + "\n").expect("writing the input");
}

/// Every result line by custom_id; fails on a line that is not whole JSON, or an id twice.
fn results(path: &Path) -> HashMap<String, Value> {
    let text = std::fs::read_to_string(path).expect("reading the output");
    assert!(
        text.is_empty() || text.ends_with('\n'),
        "the output ends in a torn line"
    );
    let mut by_id = HashMap::new();
    for line in text.lines() {
        let value: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("a result line is not JSON ({e}): {line}"));
        let id = value["custom_id"]
            .as_str()
            .expect("a custom_id")
            .to_string();
        assert!(value["id"]
            .as_str()
            .is_some_and(|i| i.starts_with("batch-")));
        assert!(value["response"]["status_code"].as_u64().is_some());
        assert!(
            by_id.insert(id.clone(), value).is_none(),
            "{id} written twice"
        );
    }
    by_id
}

/// A body with the fields that differ between two runs of one request (its id and
/// creation time) removed.
fn comparable(body: &Value) -> Value {
    let mut body = body.clone();
    if let Some(object) = body.as_object_mut() {
        object.remove("id");
        object.remove("created");
    }
    for choice in body["choices"].as_array_mut().into_iter().flatten() {
        for call in choice["message"]["tool_calls"]
            .as_array_mut()
            .into_iter()
            .flatten()
        {
            call.as_object_mut().map(|c| c.remove("id"));
        }
    }
    body
}

/// Whether `body` asks for a call of a named function.
fn forces_a_call(body: &Value) -> bool {
    body["tool_choice"].is_object()
}

/// The 200 requests: both endpoints, both line forms, greedy and seeded sampling, n = 2,
/// stop strings and forced tool calls, with varied prompts and lengths.
fn mixed_requests() -> Vec<(String, &'static str, Value, String)> {
    (0..200)
        .map(|i| {
            let prompt = format!("Note {i}. {}", PROMPTS[i % PROMPTS.len()]);
            let mut body = json!({ "max_tokens": 4 + (i * 7) % 13 });
            if i % 10 == 3 {
                body["temperature"] = json!(0.8);
                body["seed"] = json!(i);
            } else {
                body["temperature"] = json!(0);
            }
            if i % 25 == 7 {
                body["n"] = json!(2);
            }
            if i % 9 == 5 {
                body["stop"] = json!(["\n"]);
            }
            let chat = i % 2 == 1;
            // (Not with a stop string: the call's own newline would end it.)
            if i % 20 == 11 && i % 9 != 5 {
                body["tools"] = json!([{"type": "function", "function": {"name": "note",
                    "parameters": {"type": "object", "properties": {"text": {"type": "string"}},
                        "required": ["text"], "additionalProperties": false}}}]);
                body["tool_choice"] = json!({"type": "function", "function": {"name": "note"}});
                body["max_tokens"] = json!(48);
            }
            let url = if chat {
                body["messages"] = json!([{"role": "user", "content": prompt}]);
                "/v1/chat/completions"
            } else {
                body["prompt"] = json!(prompt);
                "/v1/completions"
            };
            let id = format!("req-{i}");
            let line = if i % 4 < 2 {
                body["model"] = json!("smollm2");
                json!({"custom_id": id, "method": "POST", "url": url, "body": body}).to_string()
            } else {
                let mut simple = body.clone();
                simple["id"] = json!(id);
                simple.to_string()
            };
            (id, url, body, line)
        })
        .collect()
}

#[test]
fn batch_results_equal_the_http_servers_for_200_requests() {
    let dir = tempfile::tempdir().expect("tempdir");
    let input = dir.path().join("in.jsonl");
    let output = dir.path().join("out.jsonl");
    let requests = mixed_requests();
    let lines: Vec<String> = requests.iter().map(|r| r.3.clone()).collect();
    write_lines(&input, &lines);

    let mut flags = EXACT_FLAGS.to_vec();
    flags.push("--no-prefix-cache");
    let run = run_batch(&input, &output, &flags);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "thicket batch failed: {stderr}");
    let summary: Value = serde_json::from_slice(&run.stdout).expect("a JSON summary");
    assert_eq!(summary["requests"], 200);
    assert_eq!(summary["failed"], 0);
    assert!(summary["completion_tokens"].as_u64().unwrap() > 1000);
    let batch = results(&output);
    assert_eq!(batch.len(), 200, "every custom_id exactly once");

    let model = model_path();
    let mut server_args = flags.clone();
    server_args.extend(["--model", model.as_str()]);
    let server = ServerProcess::start(&server_args, &[]);
    let answers: Vec<(u16, Value)> = std::thread::scope(|scope| {
        let server = &server;
        let handles: Vec<_> = requests
            .iter()
            .map(|(_, url, body, _)| scope.spawn(move || server.post(url, body)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a client thread"))
            .collect()
    });
    for ((id, _, body, _), (status, http_body)) in requests.iter().zip(&answers) {
        assert_eq!(*status, 200, "{id}: {http_body}");
        let result = &batch[id];
        assert_eq!(result["response"]["status_code"], 200);
        assert!(result["error"].is_null());
        let batch_body = &result["response"]["body"];
        assert_eq!(result["response"]["request_id"], batch_body["id"]);
        if forces_a_call(body) {
            let call = &batch_body["choices"][0]["message"]["tool_calls"][0];
            assert_eq!(call["function"]["name"], "note", "{id}: {batch_body}");
        }
        assert_eq!(
            comparable(batch_body),
            comparable(http_body),
            "{id}: the batch body differs from the server's"
        );
    }
}

#[test]
fn a_killed_batch_job_resumes_to_every_id_exactly_once() {
    let seed: u64 = std::env::var("THICKET_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("kill points drawn with THICKET_TEST_SEED={seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().expect("tempdir");
    let input = dir.path().join("in.jsonl");
    let output = dir.path().join("out.jsonl");
    let mut lines: Vec<String> = (0..40)
        .map(|i| {
            json!({
                "id": format!("k-{i}"),
                "prompt": format!("{} ({i})", PROMPTS[i % PROMPTS.len()]),
                "max_tokens": 2 + (i * 11) % 47,
                "temperature": 0,
            })
            .to_string()
        })
        .collect();
    lines.insert(13, "{\"id\": \"k-bad\", \"prompt\": ".to_string());
    lines.insert(
        29,
        json!({"id": "k-bad-2", "prompt": "x", "n": 0}).to_string(),
    );
    write_lines(&input, &lines);
    let expected: HashSet<String> = (0..40)
        .map(|i| format!("k-{i}"))
        .chain(["line-14".to_string(), "k-bad-2".to_string()])
        .collect();

    let model = model_path();
    let mut partial_kills = 0;
    for round in 0..4 {
        let before = count_lines(&output);
        let stderr_path = dir.path().join(format!("stderr-{round}.txt"));
        let mut child = thicket()
            .arg("batch")
            .arg("-i")
            .arg(&input)
            .arg("-o")
            .arg(&output)
            .args(["--dtype", "f32", "--kv-cache-mib", "256", "--model", &model])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr_path).expect("stderr file"))
            .spawn()
            .expect("starting thicket batch");
        // Round 0 dies at a random moment (often while loading); later rounds once a random
        // number of further results are on disk.
        let started = Instant::now();
        let deadline = Duration::from_millis(rng.random_range(50..1500));
        let target = before + rng.random_range(1..=(expected.len() - before).div_ceil(2).max(1));
        let mut exited = false;
        loop {
            if child.try_wait().expect("polling the job").is_some() {
                exited = true;
                break;
            }
            let due = if round == 0 {
                started.elapsed() >= deadline
            } else {
                count_lines(&output) >= target
            };
            if due {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(300),
                "round {round} made no progress"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        if !exited {
            child.kill().expect("SIGKILL");
        }
        child.wait().expect("reaping the job");
        let after = count_lines(&output);
        eprintln!(
            "round {round}: {before} -> {after} results, killed: {}",
            !exited
        );
        if !exited && after > 0 && after < expected.len() {
            partial_kills += 1;
        }
        if round == 1 {
            // A crash in the middle of a write leaves a torn last line.
            let mut file = std::fs::OpenOptions::new()
                .append(true)
                .open(&output)
                .expect("output exists after a round with results");
            file.write_all(br#"{"id":"batch-torn","custom_id":"k-3","respo"#)
                .expect("appending a torn line");
        }
        if round == 2 {
            let log = std::fs::read_to_string(&stderr_path).expect("round 2 stderr");
            assert!(
                log.contains("bytes of a torn line cut") && !log.contains(" 0 bytes of a torn"),
                "round 2 did not report cutting the torn line:\n{log}"
            );
        }
    }
    assert!(
        partial_kills >= 2,
        "at least two jobs should have been killed part-way (seed {seed})"
    );

    let run = run_batch(
        &input,
        &output,
        &["--dtype", "f32", "--kv-cache-mib", "256"],
    );
    assert!(
        run.status.success(),
        "the final resume failed: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    let summary: Value = serde_json::from_slice(&run.stdout).expect("a JSON summary");
    assert_eq!(summary["input_lines"], 42);
    let results = results(&output);
    let ids: HashSet<String> = results.keys().cloned().collect();
    assert_eq!(ids, expected, "seed {seed}");
    for (id, result) in &results {
        let status = result["response"]["status_code"].as_u64().unwrap();
        let want = if id.starts_with("k-bad") || id.starts_with("line-") {
            400
        } else {
            200
        };
        assert_eq!(status, want, "{id}: {result}");
        if want == 200 {
            let text = result["response"]["body"]["choices"][0]["text"]
                .as_str()
                .expect("a completion text");
            assert!(!text.is_empty(), "{id}");
        }
    }
}

fn count_lines(path: &Path) -> usize {
    std::fs::read(path)
        .map(|b| b.iter().filter(|&&c| c == b'\n').count())
        .unwrap_or(0)
}

#[test]
fn malformed_lines_become_error_lines_and_the_job_goes_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let input = dir.path().join("in.jsonl");
    let output = dir.path().join("out.jsonl");
    let good = |id: &str, url: &str, body: Value| {
        json!({"custom_id": id, "method": "POST", "url": url, "body": body}).to_string()
    };
    let lines = vec![
        good(
            "ok-1",
            "/v1/completions",
            json!({"prompt": "The sky is", "max_tokens": 3}),
        ),
        "{this is not json".to_string(),
        good("bad-url", "/v1/audio/transcriptions", json!({"input": "x"})),
        good(
            "ok-2",
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}),
        ),
        good(
            "bad-temperature",
            "/v1/completions",
            json!({"prompt": "x", "temperature": "hot"}),
        ),
        good(
            "bad-role",
            "/v1/chat/completions",
            json!({"messages": [{"role": "wizard", "content": "x"}]}),
        ),
        json!({"url": "/v1/completions", "body": {"prompt": "no id"}}).to_string(),
        good(
            "ok-1",
            "/v1/completions",
            json!({"prompt": "a duplicate id", "max_tokens": 3}),
        ),
        String::new(),
        good(
            "streamed",
            "/v1/completions",
            json!({"prompt": "x", "stream": true}),
        ),
        good(
            "other-model",
            "/v1/completions",
            json!({"prompt": "x", "model": "gpt-4"}),
        ),
        good(
            "too-long",
            "/v1/completions",
            json!({"prompt": "x", "max_tokens": 100000}),
        ),
        json!({"id": "ok-3", "prompt": "One, two,", "max_tokens": 3}).to_string(),
    ];
    write_lines(&input, &lines);
    let run = run_batch(
        &input,
        &output,
        &["--served-model-name", "smollm2", "--kv-cache-mib", "256"],
    );
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    assert!(
        stderr.contains("line 8 repeats the id \"ok-1\""),
        "{stderr}"
    );
    assert!(stderr.contains("line 7 has no custom_id"), "{stderr}");
    let summary: Value = serde_json::from_slice(&run.stdout).expect("a JSON summary");
    assert_eq!(summary["duplicate_ids"], 1);
    assert_eq!(summary["missing_ids"], 1);
    assert_eq!(summary["requests"], 11);
    assert_eq!(summary["failed"], 8);
    let results = results(&output);
    let expected = [
        ("ok-1", 200, None),
        ("ok-2", 200, None),
        ("ok-3", 200, None),
        ("line-2", 400, None),
        ("bad-url", 404, Some("url")),
        ("bad-temperature", 400, Some("temperature")),
        ("bad-role", 400, Some("messages[0].role")),
        ("line-7", 400, Some("custom_id")),
        ("streamed", 400, Some("stream")),
        ("other-model", 404, Some("model")),
        ("too-long", 400, None),
    ];
    assert_eq!(results.len(), expected.len(), "{:?}", results.keys());
    for (id, status, param) in expected {
        let result = &results[id];
        assert_eq!(result["response"]["status_code"], status, "{id}: {result}");
        if status == 200 {
            assert!(result["error"].is_null());
            assert!(result["response"]["body"]["choices"][0].is_object());
        } else {
            let error = &result["error"];
            assert!(!error["message"].as_str().unwrap_or("").is_empty(), "{id}");
            assert_eq!(&result["response"]["body"]["error"], error, "{id}");
            if let Some(param) = param {
                assert_eq!(error["param"], param, "{id}: {error}");
            }
        }
    }
    // The same job again finds everything done and runs nothing (the model is not even
    // loaded).
    let again = run_batch(&input, &output, &["--served-model-name", "smollm2"]);
    assert!(again.status.success());
    let summary: Value = serde_json::from_slice(&again.stdout).expect("a JSON summary");
    assert_eq!(summary["requests"], 0);
    assert_eq!(summary["already_done"], 11);
    assert_eq!(count_lines(&output), 11);
}

#[test]
fn the_kv_cache_dtype_sets_what_a_mib_holds_and_either_type_serves() {
    let dir = tempfile::tempdir().expect("tempdir");
    let input = dir.path().join("in.jsonl");
    let line = |id: &str| {
        json!({"custom_id": id, "url": "/v1/completions",
               "body": {"prompt": "The sky is", "max_tokens": 4}})
        .to_string()
    };
    write_lines(&input, &[line("a"), line("b")]);
    // A cache too small for the context asked: the refusal says how many tokens it holds.
    let holds = |dtype: &[&str]| -> usize {
        let output = dir.path().join("refused.jsonl");
        let mut args = vec!["--kv-cache-mib", "4", "--max-model-len", "1024"];
        args.extend(dtype);
        let run = run_batch(&input, &output, &args);
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert!(!run.status.success(), "{stderr}");
        let tokens = stderr
            .split("MiB of KV cache (")
            .nth(1)
            .and_then(|rest| rest.split(" tokens)").next())
            .and_then(|n| n.parse().ok());
        tokens.unwrap_or_else(|| panic!("no token count in: {stderr}"))
    };
    let (halves, default, singles) = (
        holds(&["--kv-cache-dtype", "f16"]),
        holds(&[]),
        holds(&["--kv-cache-dtype", "f32"]),
    );
    assert_eq!(default, halves, "f16 is the default");
    assert!(
        singles > 0 && halves >= 2 * singles,
        "f16 {halves}, f32 {singles}"
    );
    // An unknown type is refused by name, before any work.
    let output = dir.path().join("unknown.jsonl");
    let run = run_batch(&input, &output, &["--kv-cache-dtype", "f64"]);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success());
    assert!(
        stderr.contains("unknown KV cache dtype 'f64' (f16, f32)"),
        "{stderr}"
    );
    // Both types serve the job.
    for dtype in ["f16", "f32"] {
        let output = dir.path().join(format!("{dtype}.jsonl"));
        let args = ["--kv-cache-dtype", dtype, "--kv-cache-mib", "64"];
        let run = run_batch(&input, &output, &args);
        assert!(
            run.status.success(),
            "{}",
            String::from_utf8_lossy(&run.stderr)
        );
        let results = results(&output);
        assert_eq!(results.len(), 2);
        for result in results.values() {
            assert_eq!(result["response"]["status_code"], 200, "{dtype}: {result}");
            let text = &result["response"]["body"]["choices"][0]["text"];
            assert!(!text.as_str().unwrap_or("").is_empty(), "{dtype}: {result}");
        }
    }
}
