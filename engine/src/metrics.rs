//! Names and descriptions of every metric thicket publishes (through the `metrics` facade;
//! the server installs the Prometheus exporter): the engine's step and request metrics here,
//! then the KV cache's ([`kv`]), the recurrent states' ([`state`]), speculation's ([`spec`])
//! and the HTTP server's ([`http`]). Units are part of every name.

use kvcache::CacheStats;

use crate::engine_loop::StateStats;

/// Counter: engine steps run.
pub const STEPS: &str = "thicket_engine_steps_total";
/// Counter: tokens an encoder read (embeddings, rerank, score).
pub const ENCODER_TOKENS: &str = "thicket_encoder_tokens_total";
/// Histogram: wall time of one encoder step (one packed forward).
pub const ENCODER_STEP_DURATION: &str = "thicket_encoder_step_duration_seconds";
/// Histogram: wall time of one step (schedule, forward, sampling, events).
pub const STEP_DURATION: &str = "thicket_engine_step_duration_seconds";
/// Histogram: seconds of one step spent in each of its phases, by `phase`: `forward`,
/// `drafting` (building the granted draft trees), `lookup` (drafters preparing their offers,
/// matches looked up, and the speculators learning admitted and finished requests),
/// `sampling` (choosing and verifying tokens) and `other` (planning, bookkeeping, emission).
/// What `lookup` and `other` take every step whatever it yields is what the planner calls
/// the step's overhead.
pub const STEP_PHASE: &str = "thicket_engine_step_phase_seconds";
/// Histogram: tokens fed to the model in one step.
pub const BATCH_TOKENS: &str = "thicket_engine_batch_tokens";
/// Gauge: sequences running.
pub const SEQS_RUNNING: &str = "thicket_engine_seqs_running";
/// Gauge: sequences waiting for admission.
pub const SEQS_WAITING: &str = "thicket_engine_seqs_waiting";
/// Counter: sequences preempted (their KV dropped, to be recomputed).
pub const PREEMPTIONS: &str = "thicket_engine_preemptions_total";
/// Histogram: submission to first output token.
pub const TIME_TO_FIRST_TOKEN: &str = "thicket_request_time_to_first_token_seconds";
/// Histogram: time between consecutive output tokens of a sample.
pub const INTER_TOKEN_LATENCY: &str = "thicket_request_inter_token_latency_seconds";
/// Histogram: submission to the end of the request.
pub const E2E_LATENCY: &str = "thicket_request_e2e_latency_seconds";
/// Histogram: submission to first scheduling.
pub const QUEUE_TIME: &str = "thicket_request_queue_time_seconds";
/// Counter: output tokens generated.
pub const GENERATED_TOKENS: &str = "thicket_generation_tokens_total";
/// Counter: prompt tokens admitted.
pub const PROMPT_TOKENS: &str = "thicket_prompt_tokens_total";
/// Histogram: wall time of each part of a step's constraint stage, recorded on steps that
/// have one: the part before the forward (forced tokens, draft pruning) and the token masks
/// computed beside the forward.
pub const CONSTRAINT_DURATION: &str = "thicket_engine_constraint_duration_seconds";

/// Speculation metrics. Their `method` label names the draft source: the method, or under
/// `auto` the source it picked, and `prediction` for drafts from a request's prediction.
pub mod spec {
    /// Counter `{method}`: draft tokens proposed and verified.
    pub const DRAFT_TOKENS: &str = "thicket_spec_draft_tokens_total";
    /// Counter `{method}`: draft tokens accepted.
    pub const ACCEPTED_TOKENS: &str = "thicket_spec_accepted_tokens_total";
    /// Counter `{method}`: verification steps (trees with at least one draft node).
    pub const VERIFY_STEPS: &str = "thicket_spec_verify_steps_total";
    /// Counter `{method, position}`: accepted tokens at each depth of the tree.
    pub const ACCEPTED_PER_POSITION: &str = "thicket_spec_accepted_per_position_total";
    /// Gauge: positions (tokens and request separators) the global suffix indexes hold.
    pub const SUFFIX_TOKENS: &str = "thicket_spec_suffix_index_tokens";
    /// Gauge: requests the global suffix indexes hold.
    pub const SUFFIX_REQUESTS: &str = "thicket_spec_suffix_index_requests";
    /// Gauge: bytes the global suffix indexes hold.
    pub const SUFFIX_BYTES: &str = "thicket_spec_suffix_index_bytes";
    /// Counter: requests evicted from the global suffix indexes (oldest first, to keep
    /// within `--suffix-index-tokens`).
    pub const SUFFIX_EVICTIONS: &str = "thicket_spec_suffix_index_evictions_total";
    /// Counter: lookups of a sequence's recent tokens in the global suffix index.
    pub const SUFFIX_LOOKUPS: &str = "thicket_spec_suffix_index_lookups_total";
    /// Counter: those lookups that found a match.
    pub const SUFFIX_HITS: &str = "thicket_spec_suffix_index_hits_total";
}

/// KV cache metrics.
pub mod kv {
    /// Gauge: blocks in the pool.
    pub const BLOCKS_TOTAL: &str = "thicket_kv_blocks_total";
    /// Gauge: blocks referenced by live sequences.
    pub const BLOCKS_IN_USE: &str = "thicket_kv_blocks_in_use";
    /// Gauge: unreferenced blocks kept for the prefix cache.
    pub const BLOCKS_CACHED: &str = "thicket_kv_blocks_cached";
    /// Gauge: blocks in the windowed layers' own pool (a model with sliding windows).
    pub const WINDOW_BLOCKS_TOTAL: &str = "thicket_kv_window_blocks_total";
    /// Gauge: windowed-pool blocks referenced by live sequences.
    pub const WINDOW_BLOCKS_IN_USE: &str = "thicket_kv_window_blocks_in_use";
    /// Gauge: unreferenced windowed-pool blocks kept for prefix reuse.
    pub const WINDOW_BLOCKS_CACHED: &str = "thicket_kv_window_blocks_cached";
    /// Counter: prompt tokens looked up in the prefix cache (as vLLM counts queries).
    pub const PREFIX_QUERIES: &str = "thicket_prefix_cache_queries_total";
    /// Counter: prompt tokens whose KV was reused from the prefix cache.
    pub const PREFIX_HIT_TOKENS: &str = "thicket_prefix_cache_hit_tokens_total";
}

/// Recurrent-state metrics (a model whose layers carry a state per sequence: Gated
/// DeltaNet, Mamba-2; not published for others).
pub mod state {
    /// Gauge: state slots for running sequences (one per sequence running at once).
    pub const SLOTS_TOTAL: &str = "thicket_state_slots_total";
    /// Gauge: state slots held by running sequences.
    pub const SLOTS_IN_USE: &str = "thicket_state_slots_in_use";
    /// Gauge: snapshots of states kept at block boundaries for the prefix cache.
    pub const SNAPSHOTS: &str = "thicket_state_snapshots";
    /// Gauge: bytes those snapshots take (within `--state-snapshot-mib`).
    pub const SNAPSHOT_BYTES: &str = "thicket_state_snapshot_bytes";
    /// Counter: sequences that started from a kept snapshot (past a cached prefix).
    pub const SNAPSHOT_RESUMES: &str = "thicket_state_snapshot_resumes_total";
}

/// HTTP server metrics.
pub mod http {
    /// Counter `{method, path, status}`: requests answered.
    pub const HTTP_REQUESTS: &str = "thicket_http_requests_total";
    /// Histogram `{method, path}`: seconds from request to response headers.
    pub const HTTP_LATENCY: &str = "thicket_http_request_duration_seconds";
}

/// Publishes KV block counts to the installed `metrics` recorder.
pub fn publish_kv(stats: &CacheStats) {
    use kv::*;
    metrics::gauge!(BLOCKS_TOTAL).set(stats.total as f64);
    metrics::gauge!(BLOCKS_IN_USE).set(stats.in_use as f64);
    metrics::gauge!(BLOCKS_CACHED).set(stats.cached as f64);
    if let Some(window) = &stats.window {
        metrics::gauge!(WINDOW_BLOCKS_TOTAL).set(window.total as f64);
        metrics::gauge!(WINDOW_BLOCKS_IN_USE).set(window.in_use as f64);
        metrics::gauge!(WINDOW_BLOCKS_CACHED).set(window.cached as f64);
    }
    metrics::counter!(PREFIX_QUERIES).absolute(stats.prefix_query_tokens);
    metrics::counter!(PREFIX_HIT_TOKENS).absolute(stats.prefix_hit_tokens);
}

/// Publishes recurrent-state slot and snapshot counts to the installed `metrics` recorder.
pub fn publish_states(stats: &StateStats) {
    use state::*;
    metrics::gauge!(SLOTS_TOTAL).set(stats.slots_total as f64);
    metrics::gauge!(SLOTS_IN_USE).set(stats.slots_in_use as f64);
    metrics::gauge!(SNAPSHOTS).set(stats.snapshots as f64);
    metrics::gauge!(SNAPSHOT_BYTES).set(stats.snapshot_bytes as f64);
    metrics::counter!(SNAPSHOT_RESUMES).absolute(stats.resumes);
}

/// Registers descriptions of every metric with the installed recorder.
pub fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(STEPS, "Engine steps run");
    describe_counter!(
        ENCODER_TOKENS,
        "Tokens an encoder read (embeddings, rerank, score)"
    );
    describe_histogram!(
        ENCODER_STEP_DURATION,
        Unit::Seconds,
        "Wall time of one encoder step (one packed forward)"
    );
    describe_histogram!(STEP_DURATION, Unit::Seconds, "Wall time of one engine step");
    describe_histogram!(
        STEP_PHASE,
        Unit::Seconds,
        "Wall time of one engine step's phase: forward, drafting, lookup, sampling or other"
    );
    describe_histogram!(BATCH_TOKENS, "Tokens fed to the model in one step");
    describe_gauge!(SEQS_RUNNING, "Sequences running");
    describe_gauge!(SEQS_WAITING, "Sequences waiting for admission");
    describe_counter!(PREEMPTIONS, "Sequences preempted for recomputation");
    describe_histogram!(
        TIME_TO_FIRST_TOKEN,
        Unit::Seconds,
        "Submission to first token"
    );
    describe_histogram!(
        INTER_TOKEN_LATENCY,
        Unit::Seconds,
        "Time between output tokens"
    );
    describe_histogram!(E2E_LATENCY, Unit::Seconds, "Submission to request end");
    describe_histogram!(QUEUE_TIME, Unit::Seconds, "Submission to first scheduling");
    describe_counter!(GENERATED_TOKENS, "Output tokens generated");
    describe_counter!(PROMPT_TOKENS, "Prompt tokens admitted");
    describe_histogram!(
        CONSTRAINT_DURATION,
        Unit::Seconds,
        "Pruning and token masks of constrained sequences in one step"
    );
    use kv::*;
    describe_gauge!(BLOCKS_TOTAL, "KV cache blocks in the pool");
    describe_gauge!(
        BLOCKS_IN_USE,
        "KV cache blocks referenced by live sequences"
    );
    describe_gauge!(
        BLOCKS_CACHED,
        "Unreferenced KV blocks kept for prefix reuse"
    );
    describe_gauge!(
        WINDOW_BLOCKS_TOTAL,
        "KV cache blocks in the windowed layers' pool"
    );
    describe_gauge!(
        WINDOW_BLOCKS_IN_USE,
        "Windowed-layer KV blocks referenced by live sequences"
    );
    describe_gauge!(
        WINDOW_BLOCKS_CACHED,
        "Unreferenced windowed-layer KV blocks kept for prefix reuse"
    );
    describe_counter!(
        PREFIX_QUERIES,
        "Prompt tokens looked up in the prefix cache"
    );
    describe_counter!(
        PREFIX_HIT_TOKENS,
        "Prompt tokens served from the prefix cache"
    );
    use state::*;
    describe_gauge!(SLOTS_TOTAL, "Recurrent-state slots for running sequences");
    describe_gauge!(
        SLOTS_IN_USE,
        "Recurrent-state slots held by running sequences"
    );
    describe_gauge!(
        SNAPSHOTS,
        "Snapshots of recurrent states kept for the prefix cache"
    );
    describe_gauge!(
        SNAPSHOT_BYTES,
        Unit::Bytes,
        "Bytes the kept recurrent-state snapshots take"
    );
    describe_counter!(
        SNAPSHOT_RESUMES,
        "Sequences that started from a kept recurrent-state snapshot"
    );
    use spec::*;
    describe_counter!(DRAFT_TOKENS, "Draft tokens verified, by method");
    describe_counter!(ACCEPTED_TOKENS, "Draft tokens accepted, by method");
    describe_counter!(VERIFY_STEPS, "Verification steps with a draft, by method");
    describe_counter!(
        ACCEPTED_PER_POSITION,
        "Accepted draft tokens by tree depth, by method"
    );
    describe_gauge!(SUFFIX_TOKENS, "Positions the global suffix indexes hold");
    describe_gauge!(SUFFIX_REQUESTS, "Requests the global suffix indexes hold");
    describe_gauge!(
        SUFFIX_BYTES,
        Unit::Bytes,
        "Bytes the global suffix indexes hold"
    );
    describe_counter!(
        SUFFIX_EVICTIONS,
        "Requests evicted from the global suffix indexes"
    );
    describe_counter!(SUFFIX_LOOKUPS, "Global suffix index lookups");
    describe_counter!(
        SUFFIX_HITS,
        "Global suffix index lookups that found a match"
    );
    use http::*;
    describe_counter!(HTTP_REQUESTS, "HTTP requests answered, by route and status");
    describe_histogram!(
        HTTP_LATENCY,
        Unit::Seconds,
        "Seconds from an HTTP request to its response headers, by route"
    );
}
