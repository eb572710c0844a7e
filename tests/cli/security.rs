//! Security defaults of the real `thicket serve`: it binds to loopback unless told
//! otherwise, requires the API key (from `THICKET_API_KEY`) on every route except
//! `/health`, never opens a path a request names, and never writes the key (or a wrong one)
//! to its log, even at debug level, nor to `/metrics`.

use serde_json::json;

use crate::support::fixtures::smollm2_path;
use crate::support::processes::ServerProcess;

const KEY: &str = "sk-thicket-test-0d6f1c2e9a";
const WRONG: &str = "sk-wrong-key-7b3e55aa";

#[test]
fn the_api_key_guards_every_route_and_never_reaches_the_log() {
    let model = smollm2_path();
    let server = ServerProcess::start(
        &[
            "--served-model-name",
            "smollm2",
            "--kv-cache-mib",
            "64",
            "--max-model-len",
            "256",
            "--model",
            model.to_str().expect("a UTF-8 path"),
        ],
        &[("THICKET_API_KEY", KEY), ("THICKET_LOG", "debug")],
    );
    assert!(
        server.base.starts_with("http://127.0.0.1:"),
        "binds to loopback by default: {}",
        server.base
    );
    let bearer = |key: &str| format!("Authorization: Bearer {key}\r\n");
    let completion = json!({"model": "smollm2", "prompt": "Hi", "max_tokens": 2}).to_string();
    let tokenize = json!({"prompt": "Hi"}).to_string();
    let detokenize = json!({"tokens": [1, 2]}).to_string();
    let chat = json!({"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
        .to_string();
    let routes: [(&str, &str, &str); 7] = [
        ("POST", "/v1/completions", &completion),
        ("POST", "/v1/chat/completions", &chat),
        ("GET", "/v1/models", ""),
        ("GET", "/v1/models/smollm2", ""),
        ("POST", "/tokenize", &tokenize),
        ("POST", "/detokenize", &detokenize),
        ("GET", "/metrics", ""),
    ];
    for (method, path, body) in routes {
        for headers in [
            String::new(),
            bearer(WRONG),
            bearer(""),
            format!("Authorization: {KEY}\r\n"),
        ] {
            let (status, _, answer) = server.request_with(method, path, body.as_bytes(), &headers);
            assert_eq!(status, 401, "{method} {path} with {headers:?}: {answer}");
            assert!(answer.contains("invalid_api_key"), "{answer}");
        }
        let (status, _, answer) = server.request_with(method, path, body.as_bytes(), &bearer(KEY));
        assert_eq!(status, 200, "{method} {path}: {answer}");
    }
    assert_eq!(
        server.request("GET", "/health", b"").0,
        200,
        "health needs no key"
    );

    // A model name or a content part that looks like a path is never opened.
    let traversal = json!({"model": "/etc/passwd", "prompt": "x"}).to_string();
    let (status, _, answer) = server.request_with(
        "POST",
        "/v1/completions",
        traversal.as_bytes(),
        &bearer(KEY),
    );
    assert_eq!(status, 404, "{answer}");
    assert!(!answer.contains("root:"), "{answer}");

    let (_, _, metrics) = server.request_with("GET", "/metrics", b"", &bearer(KEY));
    assert!(!metrics.contains(KEY) && !metrics.contains(WRONG));
    let log = server.log.lock().expect("the log").join("\n");
    assert!(log.contains("ready:"), "the log was captured: {log}");
    assert!(!log.contains(KEY), "the API key appears in the log:\n{log}");
    assert!(
        !log.contains(WRONG),
        "a presented key appears in the log:\n{log}"
    );
}
