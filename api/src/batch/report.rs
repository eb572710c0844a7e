//! What a batch job tells its user: a progress bar while it runs (requests done, output
//! tokens/s, ETA) and a summary at the end (requests, failures by status, tokens, wall time,
//! throughput, and mean accepted tokens per speculation method), as text or one JSON object.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use serde_json::Value;

/// What one finished line contributed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outcome {
    /// Its status code.
    pub status: u16,
    /// The speculation method it asked for (the engine default when it named none).
    pub method: String,
    /// Prompt tokens (each prompt once).
    pub prompt_tokens: u64,
    /// Generated tokens over every choice.
    pub completion_tokens: u64,
    /// Draft tokens proposed for it.
    pub draft_tokens: u64,
    /// Draft tokens accepted.
    pub accepted_tokens: u64,
}

impl Outcome {
    /// Reads the counts out of a response body (zero for an error body).
    pub fn from_body(status: u16, method: &str, body: &Value) -> Self {
        let count = |v: &Value| v.as_u64().unwrap_or(0);
        let usage = &body["usage"];
        let spec = &body["thicket"]["speculation"];
        Self {
            status,
            method: method.to_string(),
            prompt_tokens: count(&usage["prompt_tokens"]),
            completion_tokens: count(&usage["completion_tokens"]),
            draft_tokens: count(&spec["draft_tokens"]),
            accepted_tokens: count(&spec["accepted_tokens"]),
        }
    }
}

/// Totals of one speculation method.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct MethodTotals {
    /// Successful requests that used it.
    pub requests: u64,
    /// Their generated tokens.
    pub completion_tokens: u64,
    /// Draft tokens proposed.
    pub draft_tokens: u64,
    /// Draft tokens accepted.
    pub accepted_tokens: u64,
    /// Tokens per verification step: completion / (completion - accepted).
    pub mean_accepted_tokens: f64,
}

/// The end-of-job report.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Summary {
    /// Non-empty input lines.
    pub input_lines: usize,
    /// Lines whose result was already in the output file.
    pub already_done: usize,
    /// Lines skipped because an earlier line had the same id.
    pub duplicate_ids: usize,
    /// Batch-form lines without a `custom_id`.
    pub missing_ids: usize,
    /// Server-side failures found in the output and run again.
    pub retried: usize,
    /// Bytes of a torn last line cut from the output.
    pub torn_bytes: usize,
    /// Lines run by this invocation.
    pub requests: u64,
    /// Of those, the ones that did not succeed.
    pub failed: u64,
    /// Result lines by status code.
    pub by_status: BTreeMap<u16, u64>,
    /// Prompt tokens of successful requests.
    pub prompt_tokens: u64,
    /// Generated tokens of successful requests.
    pub completion_tokens: u64,
    /// Seconds from the engine's start to the last result.
    pub wall_seconds: f64,
    /// Generated tokens per second of wall time.
    pub completion_tokens_per_second: f64,
    /// Requests per second of wall time.
    pub requests_per_second: f64,
    /// Per speculation method.
    pub speculation: BTreeMap<String, MethodTotals>,
}

impl Summary {
    /// Counts one finished line.
    pub fn record(&mut self, outcome: &Outcome) {
        self.requests += 1;
        *self.by_status.entry(outcome.status).or_default() += 1;
        if outcome.status != 200 {
            self.failed += 1;
            return;
        }
        self.prompt_tokens += outcome.prompt_tokens;
        self.completion_tokens += outcome.completion_tokens;
        let method = self.speculation.entry(outcome.method.clone()).or_default();
        method.requests += 1;
        method.completion_tokens += outcome.completion_tokens;
        method.draft_tokens += outcome.draft_tokens;
        method.accepted_tokens += outcome.accepted_tokens;
        let steps = method
            .completion_tokens
            .saturating_sub(method.accepted_tokens);
        method.mean_accepted_tokens = if steps == 0 {
            0.0
        } else {
            method.completion_tokens as f64 / steps as f64
        };
    }

    /// Sets the wall time and the rates over it.
    pub fn finish(&mut self, wall: Duration) {
        self.wall_seconds = wall.as_secs_f64();
        let per_second = |count: u64| {
            if self.wall_seconds > 0.0 {
                count as f64 / self.wall_seconds
            } else {
                0.0
            }
        };
        self.completion_tokens_per_second = per_second(self.completion_tokens);
        self.requests_per_second = per_second(self.requests);
    }

    /// The summary for a person.
    pub fn text(&self) -> String {
        let mut out = format!(
            "{} requests in {:.1}s, {} failed; {} input lines: {} already done, {} duplicate ids skipped, {} without custom_id\n",
            self.requests,
            self.wall_seconds,
            self.failed,
            self.input_lines,
            self.already_done,
            self.duplicate_ids,
            self.missing_ids,
        );
        if self.retried > 0 || self.torn_bytes > 0 {
            out.push_str(&format!(
                "resumed: {} server-side failures run again, {} bytes of a torn last line redone\n",
                self.retried, self.torn_bytes
            ));
        }
        if self.failed > 0 {
            let statuses: Vec<String> = self
                .by_status
                .iter()
                .filter(|(s, _)| **s != 200)
                .map(|(s, n)| format!("{n} x {s}"))
                .collect();
            out.push_str(&format!("failures: {}\n", statuses.join(", ")));
        }
        out.push_str(&format!(
            "tokens: {} prompt, {} completion; {:.1} completion tokens/s, {:.2} requests/s\n",
            self.prompt_tokens,
            self.completion_tokens,
            self.completion_tokens_per_second,
            self.requests_per_second
        ));
        if !self.speculation.is_empty() {
            out.push_str(&format!(
                "{:<14} {:>9} {:>11} {:>9} {:>9} {:>6}\n",
                "speculation", "requests", "completion", "drafted", "accepted", "MAT"
            ));
            for (method, t) in &self.speculation {
                out.push_str(&format!(
                    "{:<14} {:>9} {:>11} {:>9} {:>9} {:>6.2}\n",
                    method,
                    t.requests,
                    t.completion_tokens,
                    t.draft_tokens,
                    t.accepted_tokens,
                    t.mean_accepted_tokens
                ));
            }
        }
        out
    }
}

/// The progress bar (hidden when stderr is not a terminal).
pub struct Progress {
    bar: ProgressBar,
    started: Instant,
    completion_tokens: u64,
    failed: u64,
}

impl Progress {
    /// A bar over `total` requests.
    pub fn new(total: usize) -> Self {
        let bar = ProgressBar::new(total as u64);
        let style = ProgressStyle::with_template(
            "{elapsed_precise} [{wide_bar}] {pos}/{len} requests, {msg}, ETA {eta}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
        bar.set_style(style);
        bar.set_message("0.0 tokens/s");
        Self {
            bar,
            started: Instant::now(),
            completion_tokens: 0,
            failed: 0,
        }
    }

    /// Counts one finished line.
    pub fn advance(&mut self, outcome: &Outcome) {
        self.completion_tokens += outcome.completion_tokens;
        self.failed += u64::from(outcome.status != 200);
        let rate = self.completion_tokens as f64 / self.started.elapsed().as_secs_f64().max(1e-9);
        let failed = if self.failed > 0 {
            format!(", {} failed", self.failed)
        } else {
            String::new()
        };
        self.bar.set_message(format!("{rate:.1} tokens/s{failed}"));
        self.bar.inc(1);
    }

    /// Removes the bar.
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn summary_counts_failures_tokens_and_mat_per_method() {
        let body = |completion: u64, accepted: u64| {
            json!({"usage": {"prompt_tokens": 5, "completion_tokens": completion},
                   "thicket": {"speculation": {"draft_tokens": 10, "accepted_tokens": accepted}}})
        };
        let mut summary = Summary::default();
        summary.record(&Outcome::from_body(200, "auto", &body(12, 4)));
        summary.record(&Outcome::from_body(200, "auto", &body(8, 2)));
        summary.record(&Outcome::from_body(200, "none", &body(10, 0)));
        summary.record(&Outcome::from_body(400, "auto", &json!({"error": {}})));
        summary.finish(Duration::from_secs(2));
        assert_eq!(summary.requests, 4);
        assert_eq!(summary.failed, 1);
        assert_eq!(summary.by_status[&400], 1);
        assert_eq!(summary.prompt_tokens, 15);
        assert_eq!(summary.completion_tokens, 30);
        assert_eq!(summary.completion_tokens_per_second, 15.0);
        let auto = &summary.speculation["auto"];
        assert_eq!(
            (auto.requests, auto.completion_tokens, auto.accepted_tokens),
            (2, 20, 6)
        );
        assert!((auto.mean_accepted_tokens - 20.0 / 14.0).abs() < 1e-12);
        assert_eq!(summary.speculation["none"].mean_accepted_tokens, 1.0);
        let text = summary.text();
        assert!(text.contains("4 requests"), "{text}");
        assert!(text.contains("1 x 400"), "{text}");
        assert!(text.contains("auto"), "{text}");
    }
}
