//! The real `thicket serve`'s log and shutdown: its log is never coloured in a pipe and is one
//! JSON object per line under `--log-format json`; on SIGTERM it drains (`/health` and new
//! work answer 503 at once while admitted streams finish).

use std::time::Duration;

use serde_json::Value;

use crate::support::processes::ServerProcess;

#[test]
fn logs_are_uncoloured_in_a_pipe_and_json_on_request() {
    for json in [false, true] {
        let args: &[&str] = if json { &["--log-format", "json"] } else { &[] };
        let server = ServerProcess::start(args, &[]);
        let (status, _) = server.post(
            "/v1/completions",
            &serde_json::json!({"prompt": "Hi", "max_tokens": 2}),
        );
        assert_eq!(status, 200);
        let log = server.log.lock().expect("the log").clone();
        assert!(log.len() >= 3, "{log:?}");
        for line in &log {
            assert!(
                !line.contains('\u{1b}'),
                "a colour code in a pipe: {line:?}"
            );
            if json {
                let event: Value =
                    serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
                assert!(event["level"].is_string() && event["timestamp"].is_string());
                assert!(event["fields"]["message"].is_string(), "{line}");
            }
        }
        assert_eq!(
            log.iter().any(|l| l.starts_with("ready:")),
            !json,
            "the ready line is plain text only without --log-format json: {log:?}"
        );
    }
}

#[test]
fn sigterm_drains_health_turns_503_and_admitted_streams_finish() {
    let server = ServerProcess::start(&["--shutdown-grace-secs", "60"], &[]);
    let body = serde_json::json!({
        "prompt": "Once upon a time",
        "max_tokens": 240,
        "ignore_eos": true,
        "stream": true,
    })
    .to_string();
    let streams: Vec<_> = (0..3)
        .map(|_| {
            let (base, body) = (server.base.clone(), body.clone());
            std::thread::spawn(move || {
                let client = ServerProcess::client(&base);
                client.request("POST", "/v1/completions", body.as_bytes())
            })
        })
        .collect();
    // Wait until all three are admitted, then stop the server.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while server.get("/get_load").1.trim() != r#"{"load":3}"# {
        assert!(
            std::time::Instant::now() < deadline,
            "the streams never started"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    server.terminate();
    // At once, and while the streams still run: the server answers, but not with work.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while server.get("/health").0 != 503 {
        assert!(
            std::time::Instant::now() < deadline,
            "/health never turned 503"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let (status, _) = server.post(
        "/v1/completions",
        &serde_json::json!({"prompt": "Hi", "max_tokens": 2}),
    );
    assert_eq!(status, 503);
    for stream in streams {
        let (status, _, sse) = stream.join().expect("a stream thread");
        assert_eq!(status, 200);
        assert!(sse.contains(r#""finish_reason":"length""#), "{sse}");
        assert!(sse.contains("data: [DONE]"), "{sse}");
        let tokens = sse.matches(r#""text":"#).count();
        assert!(tokens >= 200, "a stream was cut short: {tokens} chunks");
    }
}
