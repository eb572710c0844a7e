//! A thinking model's answer through the official clients: starts the real `thicket serve`
//! on SmolLM2 with `--reasoning-parser deepseek_r1` and runs `tests/e2e/reasoning_clients.py`
//! (the `openai` package reading `reasoning_content` and a `reasoning` item, the `anthropic`
//! package reading thinking blocks, whole and streamed), both pinned and installed under
//! `target/` on first use.

use std::path::Path;
use std::process::Command;

use crate::support::fixtures::smollm2_path;
use crate::support::processes::{python_packages, run_ok, ServerProcess};

/// The `openai` client version the test runs with.
const OPENAI_VERSION: &str = "3.54.0";
/// The `anthropic` client version the test runs with.
const ANTHROPIC_VERSION: &str = "2.10.0";

#[test]
fn the_openai_and_anthropic_clients_read_the_thinking_apart_from_the_answer() {
    let deps = python_packages(
        &format!("openai-{OPENAI_VERSION}-anthropic-{ANTHROPIC_VERSION}"),
        &[
            &format!("openai=={OPENAI_VERSION}"),
            &format!("anthropic=={ANTHROPIC_VERSION}"),
        ],
        "anthropic",
    );
    let key = "reasoning-secret";
    let model = smollm2_path();
    let server = ServerProcess::start(
        &[
            "--served-model-name",
            "smollm2",
            "--kv-cache-mib",
            "64",
            "--max-model-len",
            "1024",
            "--reasoning-parser",
            "deepseek_r1",
            "--model",
            model.to_str().expect("a UTF-8 model path"),
        ],
        &[("THICKET_API_KEY", key)],
    );
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2e/reasoning_clients.py");
    let stdout = run_ok(
        Command::new("python3")
            .arg(&script)
            .args([&server.base, key, "smollm2"])
            .env("PYTHONPATH", &deps),
        "the reasoning clients script",
    );
    assert!(stdout.contains("checks passed"), "{stdout}");
    eprintln!("{stdout}");
}
