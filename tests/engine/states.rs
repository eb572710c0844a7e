//! The state slots and snapshots of a hybrid (tiny Qwen3.5, Gated DeltaNet) as the engine
//! reports them: `EngineStats::states` counts the slots running sequences hold, the
//! snapshots kept and their bytes, and the sequences that resumed from one; the snapshot
//! interval and memory bound (`--state-snapshot-interval`, `--state-snapshot-mib`) decide how
//! many stay, from the command line to the engine's configuration, and never change the
//! tokens, nor does mapping the states at start (`--kv-prefault`); `/metrics` publishes the
//! same numbers as `thicket_state_*`.

use api::server::{router, AppState, Choice, ServerConfig};
use axum::body::Body;
use clap::Parser;
use engine::handle::EngineHandle;
use engine::{EngineConfig, SpecMethod, StateSnapshotConfig, StateStats};
use http_body_util::BodyExt;
use tower::ServiceExt;

use super::qwen35::{config, model, prompts, Hybrid, BLOCK};
use super::speculation::{full_length, run_all};

/// A tiny Qwen3.5 engine (256 blocks, the DeltaNet inputs in a space of their own, the prefix
/// cache on) keeping snapshots as `snapshots` says.
fn start(snapshots: StateSnapshotConfig) -> EngineHandle {
    let (model, tokenizer, _) = model(Hybrid::Qwen35);
    let config = EngineConfig {
        state_snapshots: snapshots,
        ..config(Hybrid::Qwen35, 256, Some(120), true)
    };
    let (handle, _thread) =
        engine::spawn(model.clone(), tokenizer.clone(), Vec::new(), config).unwrap();
    handle
}

fn states(handle: &EngineHandle) -> StateStats {
    handle
        .stats()
        .unwrap()
        .states
        .expect("a model with recurrent layers reports its state slots")
}

/// Bytes of one sequence's recurrent state (one snapshot's).
fn state_bytes() -> usize {
    model(Hybrid::Qwen35).0.state_bytes_per_sequence()
}

/// The first prompt (63 tokens), greedy and plain, for `max_tokens` tokens whatever it samples.
fn once(handle: &EngineHandle, max_tokens: usize) -> engine::SampleOutput {
    let prompt = prompts()[0].clone();
    assert_eq!(prompt.len(), 63);
    run_all(
        handle,
        vec![full_length(prompt, max_tokens, Some(SpecMethod::None))],
    )
    .remove(0)
}

#[test]
fn a_hybrid_reports_its_state_slots_snapshots_and_resumes() {
    assert!(state_bytes() > 0);
    let handle = start(StateSnapshotConfig::default());
    assert_eq!(
        states(&handle),
        StateStats {
            slots_total: 8,
            ..StateStats::default()
        },
        "max_num_seqs slots, nothing held yet"
    );
    // 63 prompt tokens and 7 fed outputs pass the boundaries of blocks 1 to 8; the latest
    // four stay (5 to 8, the prompt's last, 56, among them), none on the interval of 8 but 8.
    let first = once(&handle, 8);
    let stats = states(&handle);
    assert_eq!(stats.slots_in_use, 0, "{stats:?}");
    assert_eq!(stats.snapshots, 4, "{stats:?}");
    assert_eq!(stats.snapshot_bytes, 4 * state_bytes());
    assert_eq!(stats.resumes, 0, "nothing was cached yet");
    // The prompt again starts from the snapshot at its last boundary.
    let again = once(&handle, 8);
    assert_eq!(again.token_ids, first.token_ids);
    assert_eq!(again.usage.cached_tokens, (63 - 1) / BLOCK * BLOCK);
    let stats = states(&handle);
    assert_eq!(
        (stats.slots_in_use, stats.snapshots, stats.resumes),
        (0, 4, 1),
        "{stats:?}"
    );
    // Several sequences at once, and each of them again: every one resumes.
    let three: Vec<_> = prompts()
        .into_iter()
        .map(|p| full_length(p, 4, Some(SpecMethod::None)))
        .collect();
    run_all(&handle, three.clone());
    run_all(&handle, three);
    let stats = states(&handle);
    assert_eq!(
        (stats.slots_in_use, stats.resumes),
        (0, 1 + 1 + 3),
        "{stats:?}"
    );
}

#[test]
fn a_smaller_snapshot_interval_keeps_more_and_the_memory_bound_caps_them() {
    // 63 prompt tokens and 63 fed outputs pass the boundaries of blocks 1 to 15; past the
    // latest four (12 to 15) stay the prompt's last (7) and the interval's.
    let mut outputs = Vec::new();
    for (interval, max_bytes, want) in [
        (2, 1 << 30, 10), // 2, 4, 6, 7, 8, 10, 12, 13, 14, 15
        (8, 1 << 30, 6),  // 7, 8, 12, 13, 14, 15
        (0, 1 << 30, 5),  // 7, 12, 13, 14, 15
        (2, 7 * state_bytes(), 7),
    ] {
        let handle = start(StateSnapshotConfig {
            interval,
            max_bytes,
        });
        outputs.push(once(&handle, 64).token_ids);
        let stats = states(&handle);
        assert_eq!(stats.slots_in_use, 0, "interval {interval}: {stats:?}");
        assert_eq!(stats.snapshots, want, "interval {interval}: {stats:?}");
        assert_eq!(stats.snapshot_bytes, want * state_bytes());
        assert!(stats.snapshot_bytes <= max_bytes);
    }
    assert!(
        outputs.windows(2).all(|w| w[0] == w[1]),
        "the snapshots kept changed the tokens"
    );
}

#[test]
fn without_a_prefix_cache_no_snapshot_is_taken() {
    let (model, tokenizer, _) = model(Hybrid::Qwen35);
    let handle = |caching: bool| {
        let (handle, _thread) = engine::spawn(
            model.clone(),
            tokenizer.clone(),
            Vec::new(),
            config(Hybrid::Qwen35, 256, Some(120), caching),
        )
        .unwrap();
        handle
    };
    let (cached, uncached) = (handle(true), handle(false));
    let (a, b) = (once(&cached, 8), once(&uncached, 8));
    assert_eq!(a.token_ids, b.token_ids);
    assert_eq!(states(&cached).snapshots, 4);
    // Nothing could resume from one: none is copied or held.
    let stats = states(&uncached);
    assert_eq!((stats.snapshots, stats.snapshot_bytes), (0, 0), "{stats:?}");
    let again = once(&uncached, 8);
    assert_eq!(again.token_ids, a.token_ids);
    assert_eq!(
        (again.usage.cached_tokens, states(&uncached).resumes),
        (0, 0)
    );
}

#[test]
fn a_zero_snapshot_bound_is_refused_at_start() {
    let err = engine::spawn(
        model(Hybrid::Qwen35).0.clone(),
        model(Hybrid::Qwen35).1.clone(),
        Vec::new(),
        EngineConfig {
            state_snapshots: StateSnapshotConfig {
                interval: 8,
                max_bytes: 0,
            },
            ..config(Hybrid::Qwen35, 64, None, true)
        },
    )
    .expect_err("no engine without room for a snapshot")
    .to_string();
    assert!(err.contains("--state-snapshot-mib"), "{err}");
}

/// The engine flags alone, as every command that runs the engine takes them.
#[derive(Debug, Parser)]
struct Flags {
    #[command(flatten)]
    engine: api::args::EngineArgs,
}

#[test]
fn the_snapshot_flags_reach_the_engine_config_and_bad_values_are_refused() {
    let (model, _, _) = model(Hybrid::Qwen35);
    let parse = |extra: &[&str]| {
        let argv = ["thicket", "--spec-cost", "flat", "--speculation", "none"];
        Flags::try_parse_from(argv.iter().chain(extra).copied())
    };
    let defaults = parse(&[]).unwrap().engine.config(model).unwrap();
    assert_eq!(defaults.state_snapshots, StateSnapshotConfig::default());
    let set = parse(&[
        "--state-snapshot-interval",
        "0",
        "--state-snapshot-mib",
        "64",
    ])
    .unwrap();
    let config = set.engine.config(model).unwrap();
    assert_eq!(
        config.state_snapshots,
        StateSnapshotConfig {
            interval: 0,
            max_bytes: 64 << 20,
        }
    );
    for (flag, value, says) in [
        ("--state-snapshot-mib", "0", "1 MiB or more"),
        ("--state-snapshot-mib", "1.5", "whole number of MiB"),
        ("--state-snapshot-mib", "18446744073709551615", "addressed"),
        ("--state-snapshot-interval", "eight", "invalid digit"),
    ] {
        let err = parse(&[flag, value]).unwrap_err().to_string();
        assert!(
            err.contains(flag) && err.contains(says),
            "{flag} {value}: {err}"
        );
        // `serve` refuses it the same way, before loading anything.
        let serve = api::commands::try_parse_from(["thicket", "serve", flag, value]);
        assert!(serve.is_err(), "serve {flag} {value}");
    }
    let serve = api::commands::try_parse_from([
        "thicket",
        "serve",
        "--state-snapshot-interval",
        "4",
        "--state-snapshot-mib",
        "256",
    ]);
    assert!(serve.is_ok(), "{serve:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_publish_the_state_slots_of_a_hybrid() {
    // The server's recorder first, so that the engine's numbers reach it.
    let state = AppState::new(ServerConfig {
        served_model_name: "qwen35".into(),
        api_key: None,
        max_body_bytes: 1 << 20,
        reasoning_parser: Choice::Off,
        tool_call_parser: Choice::Auto,
        template: Default::default(),
    });
    let handle = start(StateSnapshotConfig::default());
    state.set_engine(handle.clone());
    let run = handle.clone();
    tokio::task::spawn_blocking(move || {
        once(&run, 8);
        once(&run, 8);
    })
    .await
    .unwrap();
    let scrape = axum::http::Request::get("/metrics")
        .body(Body::empty())
        .unwrap();
    let response = router(state).oneshot(scrape).await.unwrap();
    assert_eq!(response.status(), 200);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8(body.to_vec()).unwrap();
    // Other engines of this process publish to the same recorder: the names, not the values.
    for line in [
        "# TYPE thicket_state_slots_total gauge",
        "# TYPE thicket_state_slots_in_use gauge",
        "# TYPE thicket_state_snapshots gauge",
        "# TYPE thicket_state_snapshot_bytes gauge",
        "# TYPE thicket_state_snapshot_resumes_total counter",
        "thicket_state_slots_total ",
        "thicket_state_snapshot_resumes_total ",
    ] {
        assert!(text.contains(line), "{line} missing from /metrics:\n{text}");
    }
}

#[test]
fn a_prefaulted_hybrid_gives_the_same_tokens_and_still_resumes() {
    let (model, tokenizer, _) = model(Hybrid::Qwen35);
    let plain = once(&start(StateSnapshotConfig::default()), 16);
    let config = EngineConfig {
        kv_prefault: true,
        ..config(Hybrid::Qwen35, 256, Some(120), true)
    };
    let (handle, _thread) =
        engine::spawn(model.clone(), tokenizer.clone(), Vec::new(), config).unwrap();
    let first = once(&handle, 16);
    assert_eq!(first.token_ids, plain.token_ids);
    let again = once(&handle, 16);
    assert_eq!(again.token_ids, plain.token_ids);
    assert_eq!(again.usage.cached_tokens, (63 - 1) / BLOCK * BLOCK);
    assert_eq!(states(&handle).resumes, 1);
}
