//! Reads a batch input file: one JSON object per line, either in the OpenAI batch format
//! (`{"custom_id", "method", "url", "body"}`, as `vllm run-batch` reads it; generation, or
//! the pooling routes: embeddings, rerank, score) or the simple
//! form (`{"prompt": ...}` or `{"messages": [...]}` with an optional `id`). Every line
//! becomes a [`BatchLine`] with the id its result is written under; a line that cannot be
//! run carries the error its result line will hold, so the job goes on past it.

use std::collections::HashSet;

use serde_json::{Map, Value};

use crate::server::error::ApiError;
use crate::server::openai::body::Endpoint;

/// The endpoints a batch line may target.
pub const URLS: [&str; 5] = [
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/embeddings",
    "/v1/rerank",
    "/v1/score",
];

/// Where a line goes: a generation endpoint, or a pooling route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// `/v1/completions` or `/v1/chat/completions`.
    Generate(Endpoint),
    /// `/v1/embeddings`.
    Embeddings,
    /// `/v1/rerank`.
    Rerank,
    /// `/v1/score`.
    Score,
}

/// One non-empty input line.
#[derive(Debug, Clone)]
pub struct BatchLine {
    /// 1-based line number in the input file.
    pub line: usize,
    /// The id its result is written under: `custom_id` (or the simple form's `id`), else
    /// `line-N`.
    pub custom_id: String,
    /// What to do with it.
    pub work: Work,
}

/// What a line asks for.
#[derive(Debug, Clone)]
pub enum Work {
    /// A request for `endpoint` with this body.
    Request {
        /// Which endpoint.
        endpoint: Target,
        /// The request body, exactly as the HTTP endpoint would receive it.
        body: Value,
    },
    /// A line that cannot be run; its result line holds this error.
    Invalid(ApiError),
}

/// The id of a line that names none.
pub fn line_id(line: usize) -> String {
    format!("line-{line}")
}

/// Parses one line (`line` is 1-based).
pub fn parse_line(line: usize, text: &str) -> BatchLine {
    let invalid = |custom_id: String, error: ApiError| BatchLine {
        line,
        custom_id,
        work: Work::Invalid(error),
    };
    let object = match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(object)) => object,
        Ok(_) => {
            return invalid(
                line_id(line),
                ApiError::bad_body(format!("line {line} is not a JSON object")),
            )
        }
        Err(e) => {
            return invalid(
                line_id(line),
                ApiError::bad_body(format!("line {line} is not valid JSON: {e}")),
            )
        }
    };
    let batch_form = ["custom_id", "url", "method", "body"]
        .iter()
        .any(|k| object.contains_key(*k));
    let parsed = if batch_form {
        parse_batch_form(line, object)
    } else {
        parse_simple_form(line, object)
    };
    match parsed {
        Ok(ok) => ok,
        Err((custom_id, error)) => invalid(custom_id, error),
    }
}

type Parsed = Result<BatchLine, (String, ApiError)>;

/// `{"custom_id", "method", "url", "body"}`.
fn parse_batch_form(line: usize, mut object: Map<String, Value>) -> Parsed {
    let custom_id = match object.get("custom_id") {
        Some(Value::String(id)) if !id.is_empty() => id.clone(),
        Some(Value::String(_)) | None | Some(Value::Null) => {
            return Err((
                line_id(line),
                ApiError::invalid(
                    "custom_id",
                    format!(
                        "line {line} has no custom_id; its result is written as {:?}",
                        line_id(line)
                    ),
                ),
            ))
        }
        Some(_) => {
            return Err((
                line_id(line),
                ApiError::invalid(
                    "custom_id",
                    format!("line {line}: custom_id must be a string"),
                ),
            ))
        }
    };
    let fail = |error: ApiError| Err((custom_id.clone(), error));
    let url = match object.get("url") {
        Some(Value::String(url)) => url.clone(),
        _ => {
            return fail(ApiError::invalid(
                "url",
                format!("url is required: one of {}", URLS.join(", ")),
            ))
        }
    };
    let endpoint = match url.as_str() {
        "/v1/completions" => Target::Generate(Endpoint::Completion),
        "/v1/chat/completions" => Target::Generate(Endpoint::Chat),
        "/v1/embeddings" => Target::Embeddings,
        "/v1/rerank" => Target::Rerank,
        "/v1/score" => Target::Score,
        _ => {
            return fail(ApiError {
                param: Some("url".into()),
                ..ApiError::unknown_path(
                    "POST",
                    &format!("{url} (batch lines may target {})", URLS.join(", ")),
                )
            })
        }
    };
    match object.get("method") {
        None => {}
        Some(Value::String(m)) if m.eq_ignore_ascii_case("POST") => {}
        Some(other) => {
            let method = other
                .as_str()
                .map_or_else(|| other.to_string(), str::to_string);
            return fail(ApiError::wrong_method(&method, &url));
        }
    }
    match object.remove("body") {
        Some(body @ Value::Object(_)) => Ok(BatchLine {
            line,
            custom_id,
            work: Work::Request { endpoint, body },
        }),
        _ => fail(ApiError::invalid(
            "body",
            "body must be a JSON object (the request body)",
        )),
    }
}

/// `{"prompt": ...}` or `{"messages": [...]}`, with an optional `id`; every other field is
/// part of the request body.
fn parse_simple_form(line: usize, mut object: Map<String, Value>) -> Parsed {
    let custom_id = match object.remove("id") {
        None | Some(Value::Null) => line_id(line),
        Some(Value::String(id)) if !id.is_empty() => id,
        Some(Value::Number(n)) => n.to_string(),
        Some(_) => {
            return Err((
                line_id(line),
                ApiError::invalid(
                    "id",
                    format!("line {line}: id must be a string or a number"),
                ),
            ))
        }
    };
    let endpoint = match (
        object.contains_key("prompt"),
        object.contains_key("messages"),
    ) {
        (true, false) => Target::Generate(Endpoint::Completion),
        (false, true) => Target::Generate(Endpoint::Chat),
        (has_prompt, _) => {
            let which = if has_prompt { "both" } else { "neither" };
            return Err((
                custom_id,
                ApiError::bad_body(format!(
                    "line {line} has {which} \"prompt\" and \"messages\": give one, or use the batch form {{\"custom_id\", \"url\", \"body\"}}"
                )),
            ));
        }
    };
    Ok(BatchLine {
        line,
        custom_id,
        work: Work::Request {
            endpoint,
            body: Value::Object(object),
        },
    })
}

/// A parsed input file.
#[derive(Debug, Default)]
pub struct BatchInput {
    /// Lines to run, each id once, in input order.
    pub lines: Vec<BatchLine>,
    /// Lines skipped because an earlier line has the same id: (line, id).
    pub duplicates: Vec<(usize, String)>,
    /// Lines in the batch form without a `custom_id` (their results are written as
    /// `line-N`).
    pub missing_ids: Vec<usize>,
}

/// Parses the whole input; blank lines are ignored.
pub fn parse_input(text: &str) -> BatchInput {
    let mut input = BatchInput::default();
    let mut seen = HashSet::new();
    for (index, raw) in text.lines().enumerate() {
        if raw.trim().is_empty() {
            continue;
        }
        let parsed = parse_line(index + 1, raw);
        if matches!(&parsed.work, Work::Invalid(e) if e.param.as_deref() == Some("custom_id")) {
            input.missing_ids.push(parsed.line);
        }
        if seen.insert(parsed.custom_id.clone()) {
            input.lines.push(parsed);
        } else {
            input.duplicates.push((parsed.line, parsed.custom_id));
        }
    }
    input
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(line: &BatchLine) -> (Target, &Value) {
        match &line.work {
            Work::Request { endpoint, body } => (*endpoint, body),
            Work::Invalid(e) => panic!("line {} is invalid: {e:?}", line.line),
        }
    }

    fn error(line: &BatchLine) -> &ApiError {
        match &line.work {
            Work::Invalid(e) => e,
            Work::Request { .. } => panic!("line {} parsed", line.line),
        }
    }

    #[test]
    fn batch_form_lines_keep_their_body_and_id() {
        let line = parse_line(
            3,
            r#"{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}}"#,
        );
        assert_eq!(line.custom_id, "a");
        let (endpoint, body) = request(&line);
        assert_eq!(endpoint, Target::Generate(Endpoint::Chat));
        assert_eq!(body["max_tokens"], 4);
        let line = parse_line(
            1,
            r#"{"custom_id": "b", "url": "/v1/completions", "body": {"prompt": "x"}}"#,
        );
        assert_eq!(request(&line).0, Target::Generate(Endpoint::Completion));
        for (url, target) in [
            ("/v1/embeddings", Target::Embeddings),
            ("/v1/rerank", Target::Rerank),
            ("/v1/score", Target::Score),
        ] {
            let text = format!(r#"{{"custom_id": "p", "url": "{url}", "body": {{"input": "x"}}}}"#);
            assert_eq!(request(&parse_line(1, &text)).0, target);
        }
    }

    #[test]
    fn simple_form_lines_pick_the_endpoint_by_field() {
        let line = parse_line(2, r#"{"id": 7, "prompt": "Hello", "max_tokens": 3}"#);
        assert_eq!(line.custom_id, "7");
        let (endpoint, body) = request(&line);
        assert_eq!(endpoint, Target::Generate(Endpoint::Completion));
        assert!(body.get("id").is_none(), "the id is not part of the body");
        assert_eq!(body["prompt"], "Hello");
        let line = parse_line(5, r#"{"messages": [{"role": "user", "content": "hi"}]}"#);
        assert_eq!(line.custom_id, "line-5");
        assert_eq!(request(&line).0, Target::Generate(Endpoint::Chat));
    }

    #[test]
    fn bad_lines_become_errors_with_the_right_status() {
        let cases = [
            ("{not json", "line-1", 400),
            ("[1, 2]", "line-1", 400),
            (
                r#"{"custom_id": "u", "url": "/v1/audio/transcriptions", "body": {}}"#,
                "u",
                404,
            ),
            (
                r#"{"custom_id": "m", "method": "GET", "url": "/v1/completions", "body": {}}"#,
                "m",
                405,
            ),
            (
                r#"{"custom_id": "b", "url": "/v1/completions", "body": "prompt"}"#,
                "b",
                400,
            ),
            (r#"{"custom_id": "n", "body": {}}"#, "n", 400),
            (
                r#"{"url": "/v1/completions", "body": {"prompt": "x"}}"#,
                "line-1",
                400,
            ),
            (
                r#"{"custom_id": 5, "url": "/v1/completions", "body": {}}"#,
                "line-1",
                400,
            ),
            (
                r#"{"id": "both", "prompt": "x", "messages": []}"#,
                "both",
                400,
            ),
            (r#"{"id": "neither", "max_tokens": 3}"#, "neither", 400),
            (r#"{"id": [1], "prompt": "x"}"#, "line-1", 400),
        ];
        for (text, id, status) in cases {
            let line = parse_line(1, text);
            assert_eq!(line.custom_id, id, "{text}");
            assert_eq!(error(&line).status.as_u16(), status, "{text}");
            assert!(!error(&line).message.is_empty());
        }
    }

    #[test]
    fn duplicates_and_missing_ids_are_reported() {
        let text = [
            r#"{"custom_id": "a", "url": "/v1/completions", "body": {"prompt": "x"}}"#,
            "",
            r#"{"custom_id": "a", "url": "/v1/completions", "body": {"prompt": "y"}}"#,
            r#"{"url": "/v1/completions", "body": {"prompt": "z"}}"#,
            r#"{"prompt": "w"}"#,
            "   ",
        ]
        .join("\n");
        let input = parse_input(&text);
        let ids: Vec<&str> = input.lines.iter().map(|l| l.custom_id.as_str()).collect();
        assert_eq!(ids, ["a", "line-4", "line-5"]);
        assert_eq!(input.duplicates, vec![(3, "a".to_string())]);
        assert_eq!(input.missing_ids, vec![4]);
    }
}
