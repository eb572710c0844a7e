//! One generated answer read as parts — text, whole tool calls, and its end — for the front
//! ends that answer one conversation with one message: the Responses API and Anthropic's
//! Messages API. Both submit through the chat-completions path (`pipeline::start_chat`:
//! template, tool grammar, validation); this reads that request's engine events the way the
//! chat stream does (calls held until whole by [`CallReader`], blank text after a call
//! dropped) and hands each front end the same parts, streamed ([`super::events`]) or
//! collected.

use std::collections::VecDeque;

use engine::handle::RequestStream;
use engine::{Event, Failure, FinishReason, Usage};

use crate::server::error::ApiResult;
use crate::server::openai::body::{totals, ChoiceState};
use crate::server::openai::chat::response::ToolCallOut;
use crate::server::openai::protocol::{ThicketBody, UsageBody};
use crate::server::pipeline::engine_failure;
use crate::server::tools::{CallReader, Piece};

/// A piece of an answer.
#[derive(Debug, Clone)]
pub enum Part {
    /// Text, as it comes.
    Text(String),
    /// A whole tool call.
    Call(ToolCallOut),
    /// The answer ended.
    End(Ending),
}

/// How an answer ended.
#[derive(Debug, Clone)]
pub struct Ending {
    /// Why.
    pub reason: FinishReason,
    /// Its token counts.
    pub usage: Usage,
    /// Tool calls it made.
    pub calls: usize,
}

impl Ending {
    /// Usage and speculation totals in the chat-completions shape (the front ends rename
    /// its fields).
    pub fn totals(&self) -> (UsageBody, ThicketBody) {
        let choice = ChoiceState {
            usage: self.usage.clone(),
            ..ChoiceState::default()
        };
        totals(&[choice], 1)
    }
}

/// An answer being generated.
pub struct Answer {
    stream: RequestStream,
    reader: Option<CallReader>,
    /// The field an output format came from, named if the format fails the answer.
    format_field: &'static str,
    ready: VecDeque<Part>,
    ended: bool,
}

/// An answer collected whole.
#[derive(Debug, Clone)]
pub struct Collected {
    /// Its text (without its calls).
    pub text: String,
    /// Its tool calls, in order.
    pub calls: Vec<ToolCallOut>,
    /// How it ended.
    pub ending: Ending,
}

impl Answer {
    /// The answer of `stream`'s first choice; with `tool_names`, read for calls of them.
    pub fn new(
        stream: RequestStream,
        tool_names: Option<Vec<String>>,
        format_field: &'static str,
    ) -> Self {
        Self {
            stream,
            reader: tool_names.map(CallReader::new),
            format_field,
            ready: VecDeque::new(),
            ended: false,
        }
    }

    fn take(&mut self, pieces: Vec<Piece>) {
        for piece in pieces {
            match piece {
                Piece::Text(text) => {
                    let called = self.reader.as_ref().is_some_and(|r| r.calls > 0);
                    if !(text.is_empty() || called && text.trim().is_empty()) {
                        self.ready.push_back(Part::Text(text));
                    }
                }
                Piece::Call(call) => self.ready.push_back(Part::Call(call)),
            }
        }
    }

    /// The next part; `None` after the end. An engine failure is the last item.
    pub async fn next(&mut self) -> Option<ApiResult<Part>> {
        loop {
            if let Some(part) = self.ready.pop_front() {
                return Some(Ok(part));
            }
            if self.ended {
                return None;
            }
            match self.stream.recv_async().await {
                Some(Event::Output { index: 0, text, .. }) => match self.reader.as_mut() {
                    Some(reader) => {
                        let pieces = reader.push(&text);
                        self.take(pieces);
                    }
                    None => self.take(vec![Piece::Text(text)]),
                },
                Some(Event::Output { .. }) => {}
                Some(Event::Finished {
                    index: 0,
                    reason,
                    usage,
                }) => {
                    let mut calls = 0;
                    if let Some(mut reader) = self.reader.take() {
                        let pieces = reader.finish();
                        calls = reader.calls;
                        self.reader = Some(reader);
                        self.take(pieces);
                    }
                    self.ready.push_back(Part::End(Ending {
                        reason,
                        usage,
                        calls,
                    }));
                    self.ended = true;
                }
                Some(Event::Finished { .. }) => {}
                Some(Event::Error(failure)) => {
                    self.ended = true;
                    return Some(Err(engine_failure(&failure, self.format_field)));
                }
                None => {
                    self.ended = true;
                    return Some(Err(engine_failure(
                        &Failure::engine("the engine stopped"),
                        "",
                    )));
                }
            }
        }
    }

    /// Waits for the whole answer.
    pub async fn collect(mut self) -> ApiResult<Collected> {
        let mut text = String::new();
        let mut calls = Vec::new();
        while let Some(part) = self.next().await {
            match part? {
                Part::Text(t) => text.push_str(&t),
                Part::Call(call) => calls.push(call),
                Part::End(ending) => {
                    return Ok(Collected {
                        text,
                        calls,
                        ending,
                    })
                }
            }
        }
        Err(engine_failure(
            &Failure::engine("the answer ended without finishing"),
            "",
        ))
    }
}
