//! One generated answer read as parts — thinking, text, tool calls (whole, or started with
//! their arguments following in fragments), and its end — for the front ends that answer one
//! conversation with one message: the Responses API and Anthropic's Messages API. Both submit
//! through the chat-completions path (`pipeline::start_chat`: template, tool grammar,
//! validation); this reads that request's engine events the way the chat stream does (with a
//! reasoning parser the thinking split off first by its [`Splitter`], so only the answer is
//! read for calls; calls read by [`CallReader`], blank text after a call dropped) and hands
//! each front end the same parts, streamed ([`super::events`]) or collected.

use std::collections::VecDeque;
use std::sync::Arc;

use engine::handle::RequestStream;
use engine::{Event, Failure, FinishReason, ModelTokenizer, Usage};

use crate::server::error::engine_failure;
use crate::server::error::ApiResult;
use crate::server::reasoning::{Reasoning, Split, Splitter};
use crate::server::tools::ToolCallOut;
use crate::server::tools::{CallReader, Calls, Piece};

/// A piece of an answer.
#[derive(Debug, Clone)]
pub enum Part {
    /// Thinking text, as it comes (with a reasoning parser; all of it before any text).
    Thinking(String),
    /// Text, as it comes.
    Text(String),
    /// A whole tool call.
    Call(ToolCallOut),
    /// A tool call being written: its id and name, once the name is whole.
    CallStart {
        /// The call's index among the answer's calls.
        index: usize,
        /// Its id.
        id: String,
        /// The function's name.
        name: String,
    },
    /// The next fragment of a started call's arguments.
    Arguments {
        /// The call's index.
        index: usize,
        /// The fragment.
        text: String,
    },
    /// A started call is whole: its arguments are its fragments joined.
    CallEnd {
        /// The call's index.
        index: usize,
        /// The call.
        call: ToolCallOut,
    },
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
    /// Its thinking tokens (with a reasoning parser; 0 otherwise).
    pub reasoning_tokens: usize,
}

/// An answer being generated.
pub struct Answer {
    stream: RequestStream,
    /// With a reasoning parser: its splitter, the tokenizer (to count thinking tokens) and
    /// the tokens so far.
    thinking: Option<(Reasoning, Splitter, Arc<ModelTokenizer>, Vec<u32>)>,
    reader: Option<CallReader>,
    /// The field an output format came from, named if the format fails the answer.
    format_field: &'static str,
    ready: VecDeque<Part>,
    ended: bool,
}

/// An answer collected whole.
#[derive(Debug, Clone)]
pub struct Collected {
    /// Its thinking (with a reasoning parser).
    pub thinking: String,
    /// Its text (without its calls).
    pub text: String,
    /// Its tool calls, in order.
    pub calls: Vec<ToolCallOut>,
    /// How it ended.
    pub ending: Ending,
}

impl Answer {
    /// The answer of `stream`'s first choice; with `calls`, read for calls as it says;
    /// with `reasoning`, its thinking split off first.
    pub fn new(
        stream: RequestStream,
        calls: Option<Calls>,
        format_field: &'static str,
        reasoning: Option<(Reasoning, Arc<ModelTokenizer>)>,
    ) -> Self {
        Self {
            stream,
            thinking: reasoning.map(|(r, tokenizer)| (r, r.splitter(), tokenizer, Vec::new())),
            reader: calls.map(CallReader::new),
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
                Piece::CallStart { index, id, name } => {
                    self.ready.push_back(Part::CallStart { index, id, name })
                }
                Piece::Arguments { index, text } => {
                    self.ready.push_back(Part::Arguments { index, text })
                }
                Piece::CallEnd { index, call } => {
                    self.ready.push_back(Part::CallEnd { index, call })
                }
            }
        }
    }

    /// Answer text: read for calls where the answer is, else as it is.
    fn answer(&mut self, text: String) {
        match self.reader.as_mut() {
            Some(reader) => {
                let pieces = reader.push(&text);
                self.take(pieces);
            }
            None => self.take(vec![Piece::Text(text)]),
        }
    }

    /// What the splitter gave: thinking as it is, the answer read as [`Self::answer`] does.
    fn splits(&mut self, splits: Vec<Split>) {
        for split in splits {
            match split {
                Split::Thinking(text) => self.ready.push_back(Part::Thinking(text)),
                Split::Answer(text) => self.answer(text),
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
                Some(Event::Output {
                    index: 0,
                    text,
                    token_ids,
                    ..
                }) => match self.thinking.as_mut() {
                    Some((_, splitter, _, ids)) => {
                        ids.extend(token_ids);
                        let splits = splitter.push(&text);
                        self.splits(splits);
                    }
                    None => self.answer(text),
                },
                Some(Event::Output { .. }) => {}
                Some(Event::Finished {
                    index: 0,
                    reason,
                    usage,
                }) => {
                    let mut reasoning_tokens = 0;
                    if let Some((reasoning, mut splitter, tokenizer, ids)) = self.thinking.take() {
                        let splits = splitter.finish();
                        self.splits(splits);
                        reasoning_tokens = reasoning.reasoning_tokens(&tokenizer, &ids);
                    }
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
                        reasoning_tokens,
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
        let (mut thinking, mut text) = (String::new(), String::new());
        let mut calls = Vec::new();
        while let Some(part) = self.next().await {
            match part? {
                Part::Thinking(t) => thinking.push_str(&t),
                Part::Text(t) => text.push_str(&t),
                Part::Call(call) | Part::CallEnd { call, .. } => calls.push(call),
                Part::CallStart { .. } | Part::Arguments { .. } => {}
                Part::End(ending) => {
                    return Ok(Collected {
                        thinking,
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
