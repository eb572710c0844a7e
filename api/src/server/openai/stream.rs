//! The stream writer `/v1/completions` and `/v1/chat/completions` share: the engine events
//! of every prompt are merged, each becomes a chunk (`data: {...}`), a chat choice opens
//! with the assistant role and every choice closes with its finish reason; with
//! `stream_options.include_usage` every chunk carries `"usage": null` and a last chunk
//! carries the totals; `data: [DONE]` ends the stream. An engine failure mid-stream is sent
//! as an error object before `[DONE]`. Each choice's text is read as parts
//! (`server::parts`: thinking, text, tool calls as they are written) and sent as chat deltas
//! (`chat::stream`). When the client goes away the stream is dropped, and with it the engine
//! streams, which cancels their requests.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;

use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use engine::handle::RequestStream;
use engine::{Event, Failure, ModelTokenizer};
use futures_util::stream::{self, BoxStream, SelectAll, StreamExt};

use engine::request::TokenLogprob;

use super::body::{chunk, usage_chunk, Endpoint, ResponseMeta};
use super::chat::stream::deltas;
use super::choice::{ChoiceState, ChunkParts};
use crate::server::error::{engine_failure, not_generated};
use crate::server::parts::{ChoiceReader, Part};
use crate::server::pipeline::Submitted;
use crate::server::settings::ResponseOptions;
use crate::server::tools::{Calls, Piece};

/// `(prompt index, event)` of every prompt, merged.
type Events = SelectAll<BoxStream<'static, (usize, Event)>>;

fn events_of(prompt: usize, stream: RequestStream) -> BoxStream<'static, (usize, Event)> {
    stream::unfold(stream, move |s| async move {
        s.recv_async().await.map(|event| ((prompt, event), s))
    })
    .boxed()
}

struct StreamState {
    meta: ResponseMeta,
    tokenizer: Arc<ModelTokenizer>,
    options: ResponseOptions,
    events: Events,
    choices: Vec<ChoiceState>,
    /// Characters sent per choice (completions' logprob offsets).
    sent_chars: Vec<usize>,
    /// Per choice, its text read as parts (for chat: its thinking split off with a
    /// reasoning parser, its answer read for tool calls with tools).
    readers: Vec<ChoiceReader>,
    open: usize,
    ready: VecDeque<SseEvent>,
    done: bool,
}

impl StreamState {
    fn push(&mut self, value: serde_json::Value) {
        self.ready
            .push_back(SseEvent::default().data(value.to_string()));
    }

    fn chunk(&mut self, parts: ChunkParts<'_>) -> serde_json::Value {
        chunk(
            &self.meta,
            &self.tokenizer,
            parts,
            self.options.include_usage,
        )
    }

    /// The opening chunks: the chat role, or the echoed prompt, of every choice.
    fn open_choices(&mut self, echoes: &[Option<String>]) {
        let n = self.options.n;
        for index in 0..self.choices.len() {
            let opening = match self.meta.endpoint {
                Endpoint::Chat => Some((String::new(), true)),
                Endpoint::Completion => echoes
                    .get(index / n)
                    .cloned()
                    .flatten()
                    .map(|text| (text, false)),
            };
            if let Some((text, role)) = opening {
                self.sent_chars[index] += text.chars().count();
                let value = self.chunk(ChunkParts {
                    index,
                    text,
                    logprobs: None,
                    offset: 0,
                    role,
                    finish: None,
                    tool_calls: None,
                    called: false,
                    reasoning: None,
                });
                self.push(value);
            }
        }
    }

    fn handle(&mut self, prompt: usize, event: Event) {
        let n = self.options.n;
        match event {
            Event::Output {
                index,
                text,
                logprobs,
                token_ids,
            } => {
                let at = prompt * n + index;
                if at >= self.choices.len() {
                    return;
                }
                if self.options.reasoning.is_some() {
                    self.choices[at].token_ids.extend(token_ids);
                }
                let want = self.options.logprobs;
                let parts = self.readers[at].push(&text);
                self.send_parts(at, parts, want.then_some(logprobs.as_slice()));
            }
            Event::Finished {
                index,
                reason,
                usage,
            } => {
                let at = prompt * n + index;
                if at >= self.choices.len() {
                    return;
                }
                let parts = self.readers[at].finish();
                self.send_parts(at, parts, None);
                let called = self.readers[at].calls() > 0;
                let value = self.chunk(ChunkParts {
                    index: at,
                    text: String::new(),
                    logprobs: None,
                    offset: self.sent_chars[at],
                    role: false,
                    finish: Some(&reason),
                    tool_calls: None,
                    called,
                    reasoning: None,
                });
                self.push(value);
                let reasoning = self.options.reasoning.map(|r| (r, &*self.tokenizer));
                self.choices[at].finish(reason, usage, reasoning);
                self.open = self.open.saturating_sub(1);
            }
            Event::Error(failure) => {
                self.push(engine_failure(&failure, self.options.format_field).body());
                self.done = true;
            }
            Event::Pooled { .. } => {
                self.push(engine_failure(&not_generated(), "").body());
                self.done = true;
            }
        }
    }

    /// Chunks for a choice's parts: thinking as `reasoning_content` deltas, the rest as chat
    /// deltas (see [`deltas`]: content, tool-call pieces); `logprobs` go with the first chunk,
    /// or alone in an empty one when there are no parts.
    fn send_parts(&mut self, at: usize, parts: Vec<Part>, logprobs: Option<&[TokenLogprob]>) {
        let mut logprobs = logprobs;
        let mut run = Vec::new();
        for part in parts {
            match part {
                Part::Thinking(text) => {
                    self.send_run(at, std::mem::take(&mut run), &mut logprobs);
                    let value = self.chunk(ChunkParts {
                        index: at,
                        text: String::new(),
                        logprobs: logprobs.take(),
                        offset: self.sent_chars[at],
                        role: false,
                        finish: None,
                        tool_calls: None,
                        called: false,
                        reasoning: Some(text),
                    });
                    self.push(value);
                }
                Part::Answer(piece) => run.push(piece),
                Part::End(_) => {}
            }
        }
        self.send_run(at, run, &mut logprobs);
        if logprobs.is_some() {
            self.send_run(at, vec![Piece::Text(String::new())], &mut logprobs);
        }
    }

    /// Chunks for a run of parts that are not thinking; `logprobs` go with the first.
    fn send_run(&mut self, at: usize, run: Vec<Piece>, logprobs: &mut Option<&[TokenLogprob]>) {
        for (text, tool_calls) in deltas(run) {
            let offset = self.sent_chars[at];
            self.sent_chars[at] += text.chars().count();
            let value = self.chunk(ChunkParts {
                index: at,
                text,
                logprobs: logprobs.take(),
                offset,
                role: false,
                finish: None,
                tool_calls,
                called: false,
                reasoning: None,
            });
            self.push(value);
        }
    }

    fn close(&mut self) {
        if self.options.include_usage && self.open == 0 {
            let value = usage_chunk(&self.meta, &self.choices, self.options.n);
            self.push(value);
        }
        self.ready.push_back(SseEvent::default().data("[DONE]"));
        self.done = true;
    }
}

/// The streamed response over `submitted`.
pub fn sse_response(
    meta: ResponseMeta,
    tokenizer: Arc<ModelTokenizer>,
    options: ResponseOptions,
    submitted: Vec<Submitted>,
    calls: Option<Calls>,
) -> Response {
    let num_choices = submitted.len() * options.n;
    let tools = options.tool_calls && meta.endpoint == Endpoint::Chat;
    let reasoning = options
        .reasoning
        .filter(|_| meta.endpoint == Endpoint::Chat);
    let echoes: Vec<Option<String>> = submitted.iter().map(|s| s.echo.clone()).collect();
    let events: Events = stream::select_all(
        submitted
            .into_iter()
            .enumerate()
            .map(|(i, s)| events_of(i, s.stream)),
    );
    let mut state = StreamState {
        meta,
        tokenizer,
        options,
        events,
        choices: vec![ChoiceState::default(); num_choices],
        sent_chars: vec![0; num_choices],
        readers: (0..num_choices)
            .map(|_| ChoiceReader::new(calls.clone().filter(|_| tools), reasoning))
            .collect(),
        open: num_choices,
        ready: VecDeque::new(),
        done: false,
    };
    state.open_choices(&echoes);
    let body = stream::unfold(state, |mut state| async move {
        loop {
            if let Some(event) = state.ready.pop_front() {
                return Some((Ok::<_, Infallible>(event), state));
            }
            if state.done {
                return None;
            }
            if state.open == 0 {
                state.close();
                continue;
            }
            match state.events.next().await {
                Some((prompt, event)) => {
                    state.handle(prompt, event);
                    if state.done {
                        state.ready.push_back(SseEvent::default().data("[DONE]"));
                    }
                }
                None => {
                    let failure = engine_failure(&Failure::engine("the engine stopped"), "").body();
                    state.push(failure);
                    state.close();
                }
            }
        }
    });
    Sse::new(body).into_response()
}
