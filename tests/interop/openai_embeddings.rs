//! End to end with the official `openai` Python package against `thicket serve` on the real
//! all-MiniLM-L6-v2 encoder (an API key, a free port): `tests/e2e/openai_embeddings.py` checks
//! `embeddings.create` as the client calls it by default (base64) and in floats, the model's
//! published similarities, its errors, and rerank and score; then SIGTERM stops the server
//! cleanly.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use super::openai_client::python_deps;
use crate::model::encoder::minilm_dir;
use crate::support::processes::{run_ok, ServerProcess};

#[test]
fn the_openai_client_embeds_against_the_real_server() {
    let deps = python_deps();
    let dir = minilm_dir();
    let key = "e2e-secret";
    let mut server = ServerProcess::start(
        &[
            "--served-model-name",
            "minilm",
            "--model",
            dir.to_str().expect("a UTF-8 model path"),
        ],
        &[("THICKET_API_KEY", key)],
    );
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2e/openai_embeddings.py");
    let stdout = run_ok(
        Command::new("python3")
            .arg(&script)
            .args([&server.base, key, "minilm"])
            .env("PYTHONPATH", &deps),
        "the openai embeddings script",
    );
    assert!(stdout.contains("checks passed"), "{stdout}");
    eprintln!("{stdout}");
    server.terminate();
    let exited = server.exit_within(Duration::from_secs(30));
    assert!(exited.success(), "the server exited with {exited}");
}
