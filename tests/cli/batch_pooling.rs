//! `thicket batch` with pooling lines (`/v1/embeddings`, `/v1/rerank`, `/v1/score`, as `vllm
//! run-batch` takes them), run as the real binary: on all-MiniLM-L6-v2 (an encoder, no flag)
//! the embeddings give the similarities sentence-transformers prints for this model, score and
//! rerank agree with them, and a generation line or a bad body becomes its own error line; on
//! SmolLM2 with `--task embed` the same job embeds beside a completion line.

use std::collections::HashMap;
use std::path::Path;
use std::process::Stdio;

use serde_json::{json, Value};

use crate::http::pooling::{vectors, WEATHER};
use crate::support::fixtures::smollm2_path;
use crate::support::processes::thicket;

/// Published similarities of WEATHER's pairs (0, 1), (0, 2), (1, 2).
const SIMILARITIES: [f64; 3] = [0.6660, 0.1046, 0.1411];

fn line(id: &str, url: &str, body: Value) -> String {
    json!({"custom_id": id, "method": "POST", "url": url, "body": body}).to_string()
}

/// Runs `thicket batch` over `lines` with `args`; every result by its custom_id.
fn run(dir: &Path, lines: &[String], args: &[&str]) -> HashMap<String, Value> {
    let (input, output) = (dir.join("in.jsonl"), dir.join("out.jsonl"));
    std::fs::write(&input, lines.join("\n") + "\n").unwrap();
    let out = thicket()
        .arg("batch")
        .arg("-i")
        .arg(&input)
        .arg("-o")
        .arg(&output)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("running thicket batch");
    assert!(
        out.status.success(),
        "thicket batch failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read_to_string(&output)
        .unwrap()
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            (v["custom_id"].as_str().unwrap().to_string(), v)
        })
        .collect()
}

fn body<'a>(results: &'a HashMap<String, Value>, id: &str, status: u64) -> &'a Value {
    let response = &results[id]["response"];
    assert_eq!(response["status_code"], status, "{id}: {response}");
    &response["body"]
}

fn dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(x, y)| f64::from(x * y)).sum()
}

#[test]
fn an_encoder_batch_embeds_scores_and_reranks() {
    let dir = tempfile::tempdir().unwrap();
    let lines = [
        line("embed", "/v1/embeddings", json!({"input": WEATHER})),
        line(
            "score",
            "/v1/score",
            json!({"text_1": WEATHER[0], "text_2": [WEATHER[1], WEATHER[2]]}),
        ),
        line(
            "rerank",
            "/v1/rerank",
            json!({"query": WEATHER[0], "documents": [WEATHER[2], WEATHER[1]]}),
        ),
        line(
            "chat",
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}]}),
        ),
        line("empty", "/v1/embeddings", json!({"input": []})),
    ];
    let results = run(dir.path(), &lines, &["--model", "all-minilm-l6-v2"]);
    assert_eq!(results.len(), lines.len());
    let v = vectors(body(&results, "embed", 200));
    let pairs = [(0, 1), (0, 2), (1, 2)];
    for ((i, j), want) in pairs.into_iter().zip(SIMILARITIES) {
        let got = dot(&v[i], &v[j]);
        assert!((got - want).abs() < 6e-4, "({i}, {j}): {got} vs {want}");
    }
    let scores: Vec<f64> = body(&results, "score", 200)["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["score"].as_f64().unwrap())
        .collect();
    assert!((scores[0] - SIMILARITIES[0]).abs() < 6e-4, "{scores:?}");
    assert!((scores[1] - SIMILARITIES[1]).abs() < 6e-4, "{scores:?}");
    let ranked = &body(&results, "rerank", 200)["results"];
    assert_eq!(ranked[0]["index"], 1, "{ranked}");
    assert_eq!(body(&results, "chat", 400)["error"]["param"], "model");
    assert_eq!(body(&results, "empty", 400)["error"]["param"], "input");
}

#[test]
fn a_decoder_batch_embeds_beside_generation_under_task_embed() {
    let dir = tempfile::tempdir().unwrap();
    let lines = [
        line("embed", "/v1/embeddings", json!({"input": WEATHER})),
        line(
            "complete",
            "/v1/completions",
            json!({"prompt": "The weather", "max_tokens": 4}),
        ),
    ];
    let model = smollm2_path();
    let model = model.to_str().unwrap();
    let results = run(
        dir.path(),
        &lines,
        &["--model", model, "--task", "embed", "--speculation", "none"],
    );
    let v = vectors(body(&results, "embed", 200));
    assert_eq!(v.len(), 3);
    for vector in &v {
        assert_eq!(vector.len(), 576);
        assert!((dot(vector, vector) - 1.0).abs() < 1e-5);
    }
    assert!(
        dot(&v[0], &v[1]) < 0.9999,
        "distinct sentences, distinct vectors"
    );
    let text = &body(&results, "complete", 200)["choices"][0]["text"];
    assert!(text.as_str().is_some_and(|t| !t.is_empty()), "{text}");
}
