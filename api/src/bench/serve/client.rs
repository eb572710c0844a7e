//! A small HTTP/1.1 client for OpenAI-compatible servers (thicket, vLLM, llama.cpp's
//! `llama-server`): one connection per request, JSON bodies, and streamed server-sent events
//! timed as they arrive, giving each request's time to first token, the gaps between chunks,
//! its end-to-end latency and token counts. Only the OpenAI API is used.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper::Request;
use hyper_util::rt::TokioIo;
use serde::Serialize;
use serde_json::Value;
use tokio::net::TcpStream;

/// Where the server is.
#[derive(Debug, Clone)]
pub struct ServerUrl {
    /// `host:port`.
    pub authority: String,
    /// Path prefix before `/v1/...` (usually empty).
    pub prefix: String,
    /// Bearer token.
    pub api_key: Option<String>,
}

impl ServerUrl {
    /// Parses `http://host:port[/prefix]`.
    pub fn parse(url: &str, api_key: Option<String>) -> anyhow::Result<Self> {
        let Some(rest) = url.strip_prefix("http://") else {
            bail!("the URL must start with http:// (got {url:?}); https is not supported");
        };
        let (authority, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if authority.is_empty() {
            bail!("no host in {url:?}");
        }
        let authority = if authority.contains(':') {
            authority.to_string()
        } else {
            format!("{authority}:80")
        };
        let prefix = prefix.trim_end_matches('/');
        Ok(Self {
            authority,
            prefix: if prefix.is_empty() {
                String::new()
            } else {
                format!("/{prefix}")
            },
            api_key,
        })
    }

    async fn send(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> anyhow::Result<hyper::Response<hyper::body::Incoming>> {
        let stream = TcpStream::connect(&self.authority)
            .await
            .with_context(|| format!("connecting to {}", self.authority))?;
        let _ = stream.set_nodelay(true);
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .context("HTTP handshake")?;
        tokio::spawn(connection);
        let mut request = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.prefix))
            .header(HOST, &self.authority);
        if let Some(key) = &self.api_key {
            request = request.header(AUTHORIZATION, format!("Bearer {key}"));
        }
        let payload = match body {
            Some(body) => {
                request = request.header(CONTENT_TYPE, "application/json");
                Bytes::from(serde_json::to_vec(body)?)
            }
            None => Bytes::new(),
        };
        let request = request.body(Full::new(payload))?;
        sender
            .send_request(request)
            .await
            .context("sending the request")
    }

    /// `GET path`, parsed as JSON.
    pub async fn get_json(&self, path: &str) -> anyhow::Result<Value> {
        let response = self.send("GET", path, None).await?;
        let status = response.status();
        let bytes = response.into_body().collect().await?.to_bytes();
        if !status.is_success() {
            bail!("GET {path}: {status}: {}", String::from_utf8_lossy(&bytes));
        }
        serde_json::from_slice(&bytes).with_context(|| format!("GET {path}: not JSON"))
    }

    /// The first model `GET /v1/models` lists.
    pub async fn first_model(&self) -> anyhow::Result<String> {
        let models = self.get_json("/v1/models").await?;
        models["data"][0]["id"]
            .as_str()
            .map(str::to_string)
            .context("/v1/models lists no model; pass --model")
    }
}

/// What one streamed request measured.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RequestResult {
    /// Whether it completed.
    pub success: bool,
    /// Why not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Seconds after the benchmark's start it was sent.
    pub sent_at: f64,
    /// Prompt tokens (from the final usage, else 0).
    pub prompt_tokens: u64,
    /// Output tokens (from the final usage, else the number of content chunks).
    pub output_tokens: u64,
    /// Seconds to the first content.
    pub ttft: f64,
    /// Seconds between consecutive content chunks.
    #[serde(skip)]
    pub itl: Vec<f64>,
    /// Seconds to the end of the stream.
    pub e2el: f64,
    /// The generated text.
    #[serde(skip)]
    pub text: String,
}

/// Splits server-sent events out of a byte stream.
#[derive(Debug, Default)]
pub struct SseParser {
    buffer: Vec<u8>,
}

impl SseParser {
    /// Feeds bytes; returns the `data:` payloads of every event completed by them.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<String> {
        self.buffer.extend_from_slice(bytes);
        let mut events = Vec::new();
        loop {
            let end = find(&self.buffer, b"\n\n")
                .map(|i| (i, 2))
                .into_iter()
                .chain(find(&self.buffer, b"\r\n\r\n").map(|i| (i, 4)))
                .min_by_key(|(i, _)| *i);
            let Some((at, separator)) = end else {
                break;
            };
            let event: Vec<u8> = self.buffer.drain(..at + separator).collect();
            let text = String::from_utf8_lossy(&event[..at]);
            let data: Vec<&str> = text
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(|d| d.strip_prefix(' ').unwrap_or(d))
                .collect();
            if !data.is_empty() {
                events.push(data.join("\n"));
            }
        }
        events
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The text a chunk carries (chat `delta.content` or completion `text`) over its choices.
fn chunk_text(chunk: &Value) -> String {
    chunk["choices"]
        .as_array()
        .map(|choices| {
            choices
                .iter()
                .filter_map(|c| c["delta"]["content"].as_str().or(c["text"].as_str()))
                .collect()
        })
        .unwrap_or_default()
}

/// Sends one streaming request to `path` and times it; `started` is the benchmark's start.
pub async fn stream_request(
    server: &ServerUrl,
    path: &str,
    body: &Value,
    started: Instant,
    timeout: Duration,
) -> RequestResult {
    let sent = Instant::now();
    let mut result = RequestResult {
        sent_at: sent.duration_since(started).as_secs_f64(),
        ..RequestResult::default()
    };
    match tokio::time::timeout(timeout, stream_into(server, path, body, sent, &mut result)).await {
        Ok(Ok(())) => result.success = true,
        Ok(Err(e)) => result.error = Some(format!("{e:#}")),
        Err(_) => result.error = Some(format!("timed out after {}s", timeout.as_secs())),
    }
    result.e2el = sent.elapsed().as_secs_f64();
    result
}

async fn stream_into(
    server: &ServerUrl,
    path: &str,
    body: &Value,
    sent: Instant,
    result: &mut RequestResult,
) -> anyhow::Result<()> {
    let response = server.send("POST", path, Some(body)).await?;
    let status = response.status();
    let mut body = response.into_body();
    if !status.is_success() {
        let bytes = body.collect().await?.to_bytes();
        bail!("{status}: {}", String::from_utf8_lossy(&bytes));
    }
    let mut parser = SseParser::default();
    let mut last_chunk: Option<Instant> = None;
    let mut chunks = 0u64;
    let mut usage_tokens = None;
    let mut done = false;
    while let Some(frame) = body.frame().await {
        let frame = frame.context("reading the stream")?;
        let Some(data) = frame.data_ref() else {
            continue;
        };
        for event in parser.feed(data) {
            if event.trim() == "[DONE]" {
                done = true;
                continue;
            }
            let chunk: Value = serde_json::from_str(&event)
                .with_context(|| format!("an event is not JSON: {event}"))?;
            if let Some(error) = chunk.get("error") {
                bail!("error event: {error}");
            }
            if let Some(usage) = chunk.get("usage").filter(|u| u.is_object()) {
                result.prompt_tokens = usage["prompt_tokens"].as_u64().unwrap_or(0);
                usage_tokens = usage["completion_tokens"].as_u64();
            }
            let text = chunk_text(&chunk);
            if text.is_empty() {
                continue;
            }
            let now = Instant::now();
            match last_chunk {
                None => result.ttft = now.duration_since(sent).as_secs_f64(),
                Some(previous) => result.itl.push(now.duration_since(previous).as_secs_f64()),
            }
            last_chunk = Some(now);
            chunks += 1;
            result.text.push_str(&text);
        }
    }
    if !done {
        bail!("the stream ended without [DONE]");
    }
    result.output_tokens = usage_tokens.unwrap_or(chunks);
    Ok(())
}

/// Sends one non-streaming request and returns its JSON body.
pub async fn post_json(server: &ServerUrl, path: &str, body: &Value) -> anyhow::Result<Value> {
    let response = server.send("POST", path, Some(body)).await?;
    let status = response.status();
    let bytes = response.into_body().collect().await?.to_bytes();
    if !status.is_success() {
        bail!("POST {path}: {status}: {}", String::from_utf8_lossy(&bytes));
    }
    serde_json::from_slice(&bytes).with_context(|| format!("POST {path}: not JSON"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_with_and_without_port_and_prefix() {
        let u = ServerUrl::parse("http://127.0.0.1:8000", None).unwrap();
        assert_eq!(
            (u.authority.as_str(), u.prefix.as_str()),
            ("127.0.0.1:8000", "")
        );
        let u = ServerUrl::parse("http://localhost/api/", None).unwrap();
        assert_eq!(
            (u.authority.as_str(), u.prefix.as_str()),
            ("localhost:80", "/api")
        );
        assert!(ServerUrl::parse("https://x:1", None).is_err());
        assert!(ServerUrl::parse("http://", None).is_err());
    }

    #[test]
    fn sse_events_split_across_reads() {
        let mut p = SseParser::default();
        assert!(p.feed(b"data: {\"a\"").is_empty());
        assert_eq!(
            p.feed(b": 1}\n\ndata: [DONE]\n\n"),
            vec!["{\"a\": 1}", "[DONE]"]
        );
        assert_eq!(p.feed(b": comment\r\n\r\ndata:x\r\n\r\n"), vec!["x"]);
        let chat = serde_json::json!({"choices": [{"delta": {"content": "hi"}}]});
        assert_eq!(chunk_text(&chat), "hi");
        let completion = serde_json::json!({"choices": [{"text": "a"}, {"text": "b"}]});
        assert_eq!(chunk_text(&completion), "ab");
        assert_eq!(chunk_text(&serde_json::json!({"usage": {}})), "");
    }
}
