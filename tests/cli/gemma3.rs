//! Gemma 3 270M (alias `gemma3-270m`, a base model without a chat template) through the real
//! binary: `thicket serve --model gemma3-270m` answers completions with
//! the greedy text `thicket generate` writes, and refuses chat with a 400 that says why; and
//! `thicket batch` runs a JSONL of completions on it.

use std::process::Stdio;

use serde_json::{json, Value};

use crate::support::fixtures::gemma3_path;
use crate::support::processes::{thicket, ServerProcess};

fn model() -> String {
    gemma3_path().to_str().expect("a UTF-8 path").to_string()
}

#[test]
fn gemma3_serves_completions_and_refuses_chat() {
    let model = model();
    let server = ServerProcess::start(
        &[
            "--model",
            &model,
            "--kv-cache-mib",
            "64",
            "--max-model-len",
            "2048",
        ],
        &[],
    );
    let prompt = "The capital of France is";
    let (status, body) = server.post(
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": 16, "temperature": 0}),
    );
    assert_eq!(status, 200, "{body}");
    let text = body["choices"][0]["text"].as_str().unwrap().to_string();
    assert_eq!(body["usage"]["completion_tokens"], 16, "{body}");
    // The same greedy text as `thicket generate` (its own process and engine).
    let generated = thicket()
        .args([
            "generate",
            "--model",
            &model,
            "--prompt",
            prompt,
            "--max-tokens",
            "16",
        ])
        .args(["--speculation", "none"])
        .stdin(Stdio::null())
        .output()
        .expect("running thicket generate");
    assert!(generated.status.success());
    let stdout = String::from_utf8_lossy(&generated.stdout);
    assert!(
        stdout.contains(text.trim()),
        "serve wrote {text:?}, generate {stdout:?}"
    );
    let (status, body) = server.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}),
    );
    assert_eq!(status, 400, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("no chat template"), "{body}");
}

#[test]
fn gemma3_runs_a_batch_of_completions() {
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (dir.path().join("in.jsonl"), dir.path().join("out.jsonl"));
    let lines: Vec<String> = ["Photosynthesis is", "def add(a, b):", "1, 2, 3,"]
        .iter()
        .enumerate()
        .map(|(i, p)| {
            json!({
                "custom_id": format!("r{i}"),
                "method": "POST",
                "url": "/v1/completions",
                "body": {"prompt": p, "max_tokens": 12, "temperature": 0},
            })
            .to_string()
        })
        .collect();
    std::fs::write(&input, lines.join("\n") + "\n").unwrap();
    let run = thicket()
        .arg("batch")
        .arg("-i")
        .arg(&input)
        .arg("-o")
        .arg(&output)
        .args(["--model", &model(), "--json"])
        .stdin(Stdio::null())
        .output()
        .expect("running thicket batch");
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let results: Vec<Value> = std::fs::read_to_string(&output)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(results.len(), 3);
    for r in &results {
        assert_eq!(r["response"]["status_code"], 200, "{r}");
        let body = &r["response"]["body"];
        assert_eq!(body["usage"]["completion_tokens"], 12, "{r}");
        assert!(!body["choices"][0]["text"].as_str().unwrap().is_empty());
    }
}
