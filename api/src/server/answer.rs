//! One generated answer read as parts (`super::parts`: thinking, text, tool calls whole or
//! streamed) and its end, for the front ends that answer one conversation with one message:
//! the Responses API and Anthropic's Messages API. Both submit through the shared path
//! (`pipeline::start_chat`: template, tool grammar, validation); this reads that request's
//! engine events with the same [`ChoiceReader`] the chat stream reads each choice with, and
//! hands each front end the same parts, streamed (`adapter::events`) or collected.

use std::collections::VecDeque;
use std::sync::Arc;

use engine::handle::RequestStream;
use engine::{Event, Failure, ModelTokenizer};

use super::parts::ChoiceReader;
pub use super::parts::{Ending, Part};
use crate::server::error::{engine_failure, not_generated, ApiResult};
use crate::server::reasoning::Reasoning;
use crate::server::tools::{Calls, Piece, ToolCallOut};

/// An answer being generated.
pub struct Answer {
    stream: RequestStream,
    reader: ChoiceReader,
    /// With a reasoning parser: how it counts thinking tokens, the tokenizer, and the tokens
    /// so far.
    thinking: Option<(Reasoning, Arc<ModelTokenizer>, Vec<u32>)>,
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
            reader: ChoiceReader::new(calls, reasoning.as_ref().map(|(r, _)| *r)),
            thinking: reasoning.map(|(r, tokenizer)| (r, tokenizer, Vec::new())),
            format_field,
            ready: VecDeque::new(),
            ended: false,
        }
    }

    /// Queues `parts` (empty text left out).
    fn take(&mut self, parts: Vec<Part>) {
        let parts = parts
            .into_iter()
            .filter(|p| !matches!(p, Part::Answer(Piece::Text(text)) if text.is_empty()));
        self.ready.extend(parts);
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
                }) => {
                    if let Some((_, _, ids)) = self.thinking.as_mut() {
                        ids.extend(token_ids);
                    }
                    let parts = self.reader.push(&text);
                    self.take(parts);
                }
                Some(Event::Output { .. }) => {}
                Some(Event::Finished {
                    index: 0,
                    reason,
                    usage,
                }) => {
                    let parts = self.reader.finish();
                    self.take(parts);
                    let calls = self.reader.calls();
                    let reasoning_tokens = self.thinking.take().map_or(0, |(r, tokenizer, ids)| {
                        r.reasoning_tokens(&tokenizer, &ids)
                    });
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
                Some(Event::Pooled { .. }) => {
                    self.ended = true;
                    return Some(Err(engine_failure(&not_generated(), "")));
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
                Part::Answer(Piece::Text(t)) => text.push_str(&t),
                Part::Answer(Piece::Call { call, .. } | Piece::CallEnd { call, .. }) => {
                    calls.push(call)
                }
                Part::Answer(_) => {}
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
