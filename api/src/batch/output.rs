//! The batch output file: one result line per input line, each written whole with a single
//! write and flushed as its request finishes, so a crash leaves at most one torn last line.
//! Opening an existing file resumes it: complete results are kept and their ids skipped, a
//! torn last line is cut off and redone, and results that failed on the server side (5xx)
//! are removed (through a temporary file and an atomic rename) so they are run again.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use serde::Serialize;
use serde_json::Value;

use crate::server::error::ApiError;

/// What an existing output file held.
#[derive(Debug, Default)]
pub struct Resumed {
    /// Ids whose results are complete and kept.
    pub done: HashSet<String>,
    /// Bytes of a torn last line that were cut off.
    pub torn_bytes: usize,
    /// Ids whose server-side failures were removed, to be run again.
    pub retried: Vec<String>,
    /// Ids that appear more than once in the file (left as they are).
    pub duplicated: Vec<String>,
}

/// The output file, open for appending results.
#[derive(Debug)]
pub struct OutputLog {
    file: File,
    path: PathBuf,
}

/// One line of an output file, as far as resuming cares.
struct ResultLine<'a> {
    text: &'a [u8],
    custom_id: String,
    status: u16,
}

fn read_result(text: &[u8]) -> Option<(String, u16)> {
    let value: Value = serde_json::from_slice(text).ok()?;
    let custom_id = value.get("custom_id")?.as_str()?.to_string();
    let status = value
        .get("response")
        .and_then(|r| r.get("status_code"))
        .and_then(Value::as_u64)
        .and_then(|s| u16::try_from(s).ok())?;
    Some((custom_id, status))
}

impl OutputLog {
    /// Opens `path` for appending, creating it if needed; an existing file is resumed.
    pub fn open(path: &Path) -> anyhow::Result<(Self, Resumed)> {
        let mut resumed = Resumed::default();
        let existing = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        let complete_len = existing
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |i| i + 1);
        resumed.torn_bytes = existing.len() - complete_len;
        let mut lines = Vec::new();
        for (index, text) in existing[..complete_len]
            .split(|&b| b == b'\n')
            .enumerate()
            .filter(|(_, t)| !t.is_empty())
        {
            let Some((custom_id, status)) = read_result(text) else {
                bail!(
                    "{} line {} is not a batch result line; refusing to append to it (move it aside, or fix that line)",
                    path.display(),
                    index + 1
                );
            };
            lines.push(ResultLine {
                text,
                custom_id,
                status,
            });
        }
        let total = lines.len();
        let mut kept = Vec::with_capacity(total);
        for line in lines {
            if line.status >= 500 {
                resumed.retried.push(line.custom_id);
            } else {
                if !resumed.done.insert(line.custom_id.clone()) {
                    resumed.duplicated.push(line.custom_id.clone());
                }
                kept.push(line);
            }
        }
        // A server-side failure is redone; drop it first so its id ends up once.
        resumed.retried.retain(|id| !resumed.done.contains(id));
        if kept.len() != total {
            rewrite(path, kept.iter().map(|l| l.text))?;
        } else if resumed.torn_bytes > 0 {
            let file = OpenOptions::new()
                .write(true)
                .open(path)
                .with_context(|| format!("opening {}", path.display()))?;
            file.set_len(complete_len as u64)
                .with_context(|| format!("cutting the torn last line of {}", path.display()))?;
            file.sync_all()
                .with_context(|| format!("syncing {}", path.display()))?;
        }
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("opening {} for writing", path.display()))?;
        Ok((
            Self {
                file,
                path: path.to_path_buf(),
            },
            resumed,
        ))
    }

    /// Appends one result line and flushes it.
    pub fn append(&mut self, result: &ResultRecord) -> anyhow::Result<()> {
        let mut text = serde_json::to_string(result).context("serializing a result line")?;
        text.push('\n');
        self.file
            .write_all(text.as_bytes())
            .and_then(|()| self.file.flush())
            .with_context(|| format!("writing to {}", self.path.display()))
    }

    /// Forces every written line to disk.
    pub fn sync(&self) -> anyhow::Result<()> {
        self.file
            .sync_all()
            .with_context(|| format!("syncing {}", self.path.display()))
    }
}

/// Replaces `path` with `lines` atomically (a temporary file beside it, then a rename).
fn rewrite<'a>(path: &Path, lines: impl Iterator<Item = &'a [u8]>) -> anyhow::Result<()> {
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(".resume-tmp");
    let temporary = PathBuf::from(temporary);
    let mut file =
        File::create(&temporary).with_context(|| format!("creating {}", temporary.display()))?;
    for line in lines {
        file.write_all(line)
            .and_then(|()| file.write_all(b"\n"))
            .with_context(|| format!("writing {}", temporary.display()))?;
    }
    file.sync_all()
        .with_context(|| format!("syncing {}", temporary.display()))?;
    std::fs::rename(&temporary, path).with_context(|| format!("replacing {}", path.display()))?;
    Ok(())
}

/// One result line, serialized with its fields in the batch format's order.
#[derive(Debug, Clone, Serialize)]
pub struct ResultRecord {
    /// A fresh id of this result.
    pub id: String,
    /// The input line's id.
    pub custom_id: String,
    /// What the endpoint answered.
    pub response: ResponseRecord,
    /// The error object when the request failed, else null.
    pub error: Value,
}

/// The `response` of a result line.
#[derive(Debug, Clone, Serialize)]
pub struct ResponseRecord {
    /// HTTP status the endpoint would answer with.
    pub status_code: u16,
    /// The response's id (a fresh one for an error).
    pub request_id: String,
    /// The response body, exactly as the endpoint answers it.
    pub body: Value,
}

/// The result line of one request: `{"id", "custom_id", "response": {"status_code",
/// "request_id", "body"}, "error"}`. `body` is what the HTTP endpoint answers, an error
/// body included; `error` repeats the error object when the request failed.
pub fn result_line(custom_id: &str, outcome: Result<Value, ApiError>) -> ResultRecord {
    let random_id = |prefix: &str| format!("{prefix}-{:032x}", rand::random::<u128>());
    let (status_code, body, error) = match outcome {
        Ok(body) => (200, body, Value::Null),
        Err(e) => {
            let body = e.body();
            let error = body.get("error").cloned().unwrap_or(Value::Null);
            (e.status.as_u16(), body, error)
        }
    };
    let request_id = body
        .get("id")
        .and_then(Value::as_str)
        .map_or_else(|| random_id("batch-req"), str::to_string);
    ResultRecord {
        id: random_id("batch"),
        custom_id: custom_id.to_string(),
        response: ResponseRecord {
            status_code,
            request_id,
            body,
        },
        error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ok_line(id: &str) -> ResultRecord {
        result_line(id, Ok(json!({"id": "cmpl-1", "choices": []})))
    }

    fn ids(path: &Path) -> Vec<String> {
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .map(|l| {
                let v: Value = serde_json::from_str(l).unwrap();
                v["custom_id"].as_str().unwrap().to_string()
            })
            .collect()
    }

    #[test]
    fn result_lines_have_the_batch_shape() {
        let ok = serde_json::to_string(&ok_line("a")).unwrap();
        assert!(
            ok.starts_with(r#"{"id":"batch-"#) && ok.contains(r#"","custom_id":"a","response":{"status_code":200,"request_id":"cmpl-1","body":"#),
            "fields keep the batch format's order: {ok}"
        );
        let ok: Value = serde_json::from_str(&ok).unwrap();
        assert_eq!(ok["response"]["status_code"], 200);
        assert_eq!(ok["response"]["request_id"], "cmpl-1");
        assert!(ok["error"].is_null());
        let failed = result_line("b", Err(ApiError::invalid("n", "must be positive")));
        let failed = serde_json::to_value(failed).unwrap();
        assert_eq!(failed["response"]["status_code"], 400);
        assert_eq!(failed["response"]["body"]["error"]["param"], "n");
        assert_eq!(failed["error"]["message"], "must be positive");
        assert!(failed["response"]["request_id"]
            .as_str()
            .unwrap()
            .starts_with("batch-req-"));
    }

    #[test]
    fn resuming_cuts_a_torn_line_and_keeps_complete_ones() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.jsonl");
        {
            let (mut log, resumed) = OutputLog::open(&path).unwrap();
            assert!(resumed.done.is_empty());
            log.append(&ok_line("a")).unwrap();
            log.append(&ok_line("b")).unwrap();
        }
        let mut file = OpenOptions::new().append(true).open(&path).unwrap();
        file.write_all(br#"{"id": "batch-x", "custom_id": "c", "respo"#)
            .unwrap();
        drop(file);
        let (mut log, resumed) = OutputLog::open(&path).unwrap();
        assert_eq!(resumed.torn_bytes, 42);
        assert_eq!(resumed.done, HashSet::from(["a".into(), "b".into()]));
        log.append(&ok_line("c")).unwrap();
        assert_eq!(ids(&path), ["a", "b", "c"]);
    }

    #[test]
    fn server_failures_are_removed_and_redone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.jsonl");
        {
            let (mut log, _) = OutputLog::open(&path).unwrap();
            log.append(&ok_line("a")).unwrap();
            log.append(&result_line("b", Err(ApiError::unavailable("stopped"))))
                .unwrap();
            log.append(&result_line("c", Err(ApiError::invalid("n", "bad"))))
                .unwrap();
        }
        let (_, resumed) = OutputLog::open(&path).unwrap();
        assert_eq!(resumed.retried, ["b"]);
        assert_eq!(resumed.done, HashSet::from(["a".into(), "c".into()]));
        assert_eq!(ids(&path), ["a", "c"], "the 503 line is gone from the file");
    }

    #[test]
    fn a_foreign_line_in_the_middle_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.jsonl");
        let good = serde_json::to_string(&ok_line("a")).unwrap();
        std::fs::write(&path, format!("{good}\nnot a result\n{good}\n")).unwrap();
        let err = OutputLog::open(&path).unwrap_err().to_string();
        assert!(err.contains("line 2"), "{err}");
    }
}
