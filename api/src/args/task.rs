//! `--task` (vLLM's `--convert`) and `--runner`: whether a generating model also serves the
//! pooling routes, as an embedder or a reranker (`engine::encoder::DecoderTask`).

use engine::encoder::DecoderTask;

/// `--task`: `generate` (no pooling) or a pooling task.
#[derive(Debug, Clone, Copy)]
pub struct TaskArg(pub Option<DecoderTask>);

/// Reads `--task`.
pub fn task_value(s: &str) -> Result<TaskArg, String> {
    match s {
        "generate" => Ok(TaskArg(None)),
        other => other.parse::<DecoderTask>().map(|t| TaskArg(Some(t))),
    }
}

impl TaskArg {
    /// The pooling task under vLLM's `--runner`: `pooling` is `embed` unless `--task` says
    /// otherwise.
    pub fn with_runner(self, runner: &str) -> Option<DecoderTask> {
        match (self.0, runner) {
            (Some(task), _) => Some(task),
            (None, "pooling") => Some(DecoderTask::Embed),
            (None, _) => None,
        }
    }
}
