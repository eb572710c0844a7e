//! End to end with the official `openai` Python package: starts the real `thicket serve` on
//! SmolLM2 (with an API key, on a free port), runs `tests/e2e/openai_client.py` against it
//! (chat, completions, streaming, n, stop strings, logprobs, seeds, invalid requests, 20
//! clients that disconnect mid-stream) and `tests/e2e/openai_prediction.py` (Predicted
//! Outputs: both shapes, streamed usage, n, a JSON schema, bad predictions), then stops the
//! server with SIGTERM and checks it exits cleanly. The Python package is installed, pinned, under `target/` on first use.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::support::fixtures::smollm2_path;
use crate::support::processes::{python_packages, run_ok, ServerProcess};

/// The `openai` client version the test runs with.
const OPENAI_VERSION: &str = "3.54.0";
/// The plain HTTP client the disconnect check uses.
const HTTPX_VERSION: &str = "0.28.1";

pub(crate) fn python_deps() -> PathBuf {
    python_packages(
        &format!("openai-{OPENAI_VERSION}-httpx-{HTTPX_VERSION}"),
        &[
            &format!("openai=={OPENAI_VERSION}"),
            &format!("httpx=={HTTPX_VERSION}"),
        ],
        "openai",
    )
}

#[test]
fn the_openai_client_works_against_the_real_server() {
    let deps = python_deps();
    let model = smollm2_path();
    let key = "e2e-secret";
    let model = model.to_str().expect("a UTF-8 model path");
    let mut server = ServerProcess::start(
        &[
            "--served-model-name",
            "smollm2",
            "--kv-cache-mib",
            "256",
            "--max-model-len",
            "1024",
            "--shutdown-grace-secs",
            "5",
            "--model",
            model,
        ],
        &[("THICKET_API_KEY", key)],
    );
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2e/openai_client.py");
    let stdout = run_ok(
        Command::new("python3")
            .arg(&script)
            .args([&server.base, key, "smollm2"])
            .env("PYTHONPATH", &deps),
        "the openai client script",
    );
    assert!(stdout.contains("checks passed"), "{stdout}");
    eprintln!("{stdout}");
    // Predicted Outputs, on the same server.
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2e/openai_prediction.py");
    let stdout = run_ok(
        Command::new("python3")
            .arg(&script)
            .args([&server.base, key, "smollm2"])
            .env("PYTHONPATH", &deps),
        "the openai prediction script",
    );
    assert!(stdout.contains("checks passed"), "{stdout}");
    eprintln!("{stdout}");

    // SIGTERM: the server stops on its own, successfully.
    server.terminate();
    let exited = server.exit_within(Duration::from_secs(30));
    assert!(exited.success(), "the server exited with {exited}");
}
