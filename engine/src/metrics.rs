//! Names and descriptions of the engine's metrics (published through the `metrics` facade;
//! the server installs the Prometheus exporter). Units are part of every name.

pub use crate::kv_cache::metric_names as kv;

/// Counter: engine steps run.
pub const STEPS: &str = "thicket_engine_steps_total";
/// Histogram: wall time of one step (schedule, forward, sampling, events).
pub const STEP_DURATION: &str = "thicket_engine_step_duration_seconds";
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

/// Registers descriptions of every engine metric with the installed recorder.
pub fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(STEPS, "Engine steps run");
    describe_histogram!(STEP_DURATION, Unit::Seconds, "Wall time of one engine step");
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
    crate::kv_cache::describe_metrics();
    crate::speculation::describe_metrics();
}
