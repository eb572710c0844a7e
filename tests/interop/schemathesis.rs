//! Conformance fuzzing with schemathesis (pinned, installed under `target/` on first use):
//! the OpenAI OpenAPI specification's `/completions`, `/chat/completions` and `/models`
//! (the subset in `tests/fuzz/openai-subset.yaml`), and the Responses API's routes as
//! thicket serves them (`tests/fuzz/responses-subset.yaml`), against the real `thicket serve` on
//! SmolLM2, checking that no response is a server error and every response conforms to the
//! schema. A fixed seed keeps CI reproducible; at least 2,000 requests are sent, and the
//! server's own counters must show no 5xx and the server must still be healthy afterwards.

use std::path::Path;
use std::process::Command;

use crate::support::fixtures::smollm2_path;
use crate::support::processes::{python_packages, ServerProcess};

const SCHEMATHESIS_VERSION: &str = "4.32.5";

/// Sum of `thicket_http_requests_total` samples whose labels satisfy `keep`.
fn http_requests(metrics: &str, keep: impl Fn(&str) -> bool) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with("thicket_http_requests_total{") && keep(l))
        .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
        .sum()
}

#[test]
fn schemathesis_finds_no_server_errors_and_no_schema_violations() {
    let deps = python_packages(
        &format!("schemathesis-{SCHEMATHESIS_VERSION}"),
        &[&format!("schemathesis=={SCHEMATHESIS_VERSION}")],
        "schemathesis",
    );
    let model = smollm2_path();
    // Small limits keep every valid generation short: n <= 4, prompt + output <= 64 tokens.
    let server = ServerProcess::start(
        &[
            "--served-model-name",
            "smollm2",
            "--max-model-len",
            "64",
            "--max-num-seqs",
            "4",
            "--kv-cache-mib",
            "64",
            "--model",
            model.to_str().expect("a UTF-8 path"),
        ],
        &[],
    );
    let fuzz_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz");
    let python_path = format!("{}:{}", deps.display(), fuzz_dir.display());
    // schemathesis and Hypothesis keep caches (`.schemathesis/`, `.hypothesis/`) in their
    // working directory: a temporary one, not the source tree.
    let work = tempfile::tempdir().expect("a temporary directory");
    let run = |schema: &str, examples: &str| {
        Command::new("python3")
            .args(["-m", "schemathesis.cli", "run"])
            .arg(fuzz_dir.join(schema))
            .args(["--url", &format!("{}/v1", server.base)])
            .args(["--checks", "not_a_server_error,response_schema_conformance"])
            // One worker: with two, Hypothesis in one thread raises the interpreter-wide
            // recursion limit while the other parses a lambda's source, and CPython 3.11 can
            // abort the run (`SystemError: AST constructor recursion depth mismatch`), a
            // fault in the fuzzer's process that repeated runs did not always escape.
            .args(["--max-examples", examples, "--workers", "1", "--seed", "1"])
            // Generations are short, but other tests may be sharing the two cores.
            .args(["--request-timeout", "300"])
            .current_dir(work.path())
            .env("PYTHONPATH", &python_path)
            .env("SCHEMATHESIS_HOOKS", "hooks")
            .env("THICKET_FUZZ_MODEL", "smollm2")
            .env("NO_COLOR", "1")
            .output()
            .expect("running schemathesis")
    };
    // OpenAI's own description of chat, completions and models; thicket's of the Responses
    // subset it serves.
    for (schema, examples) in [
        ("openai-subset.yaml", "300"),
        ("responses-subset.yaml", "150"),
    ] {
        let output = run(schema, examples);
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        let tail: String = stdout
            .lines()
            .rev()
            .take(40)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n");
        eprintln!("{tail}");
        assert!(
            output.status.success(),
            "schemathesis found failures in {schema}:\n{stdout}\n{stderr}"
        );
    }

    let (status, metrics) = server.get("/metrics");
    assert_eq!(status, 200);
    let sent = http_requests(&metrics, |_| true);
    let server_errors = http_requests(&metrics, |l| l.contains("status=\"5"));
    let generated = http_requests(&metrics, |l| {
        l.contains("status=\"200\"") && l.contains("completions")
    });
    eprintln!("{sent} requests, {generated} generations, {server_errors} server errors");
    assert!(sent >= 2000.0, "only {sent} requests were sent");
    assert_eq!(server_errors, 0.0, "5xx answers:\n{metrics}");
    assert!(generated > 0.0, "no request reached generation");
    let responded = http_requests(&metrics, |l| {
        l.contains("status=\"200\"") && l.contains("path=\"/v1/responses\"")
    });
    assert!(responded > 0.0, "no Responses request reached generation");
    assert_eq!(server.get("/health").0, 200, "the server is still healthy");
}
