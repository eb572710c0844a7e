//! What routers read to balance replicas: vLLM's load metrics under their own names
//! (`vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc` and
//! the older `vllm:gpu_cache_usage_perc`, `vllm:prefix_cache_queries_total`,
//! `vllm:prefix_cache_hits_total`, `vllm:cache_config_info`), each labelled with the served
//! model, appended to `/metrics` from the engine's numbers at scrape time; `GET /get_load`
//! (requests accepted and not finished, which vllm-router's `power_of_two` policy polls); and
//! `GET /version`.

use std::fmt::Write;

use axum::extract::State;
use axum::Json;
use engine::handle::EngineStats;

use crate::server::error::{ApiError, ApiResult};
use crate::server::AppState;

/// `{"load": N}`: the requests accepted and not yet finished (running, waiting, and those
/// still on their way to the engine thread).
pub(in crate::server) async fn get_load(
    State(state): State<AppState>,
) -> ApiResult<Json<serde_json::Value>> {
    state.ready()?;
    Ok(Json(serde_json::json!({"load": state.pending()})))
}

/// `{"version": ...}`: thicket's version.
pub(in crate::server) async fn version() -> Json<serde_json::Value> {
    Json(serde_json::json!({"version": env!("CARGO_PKG_VERSION")}))
}

fn stats(state: &AppState) -> ApiResult<EngineStats> {
    state
        .engine()?
        .stats()
        .ok_or_else(|| ApiError::unavailable("the engine stopped".to_string()))
}

/// The vLLM-named metrics in Prometheus text, for `model` (empty while the model loads).
pub(super) fn vllm_metrics(state: &AppState) -> String {
    let Ok(stats) = stats(state) else {
        return String::new();
    };
    let model = state
        .model_name()
        .replace('\\', "\\\\")
        .replace('"', "\\\"");
    let label = format!("model_name=\"{model}\"");
    let usage = if stats.cache.total == 0 {
        0.0
    } else {
        stats.cache.in_use as f64 / stats.cache.total as f64
    };
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, labels: &str, value: String| {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        let _ = writeln!(out, "{name}{{{labels}}} {value}");
    };
    let s = &stats.scheduler;
    metric(
        "vllm:num_requests_running",
        "gauge",
        "Sequences running now.",
        &label,
        s.running.to_string(),
    );
    metric(
        "vllm:num_requests_waiting",
        "gauge",
        "Sequences waiting for admission.",
        &label,
        s.waiting.to_string(),
    );
    for name in ["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"] {
        metric(
            name,
            "gauge",
            "Fraction of KV blocks in use (1 = full).",
            &label,
            usage.to_string(),
        );
    }
    metric(
        "vllm:prefix_cache_queries_total",
        "counter",
        "Prompt tokens looked up in the prefix cache.",
        &label,
        stats.cache.prefix_query_tokens.to_string(),
    );
    metric(
        "vllm:prefix_cache_hits_total",
        "counter",
        "Prompt tokens found in the prefix cache.",
        &label,
        stats.cache.prefix_hit_tokens.to_string(),
    );
    metric(
        "vllm:cache_config_info",
        "gauge",
        "KV cache configuration.",
        &format!(
            "{label},block_size=\"{}\",num_gpu_blocks=\"{}\"",
            stats.block_size, stats.cache.total
        ),
        "1".to_string(),
    );
    out
}
