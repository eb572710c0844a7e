//! One choice's text read as parts, the event stream every API renders: thinking (with a
//! reasoning parser, split off first so only the answer is read for calls), text, and tool
//! calls (whole, or started with their arguments following in fragments, then ended), read
//! by the model's tool-call format ([`CallReader`]). [`ChoiceReader`] turns the text of a
//! choice, as the engine gives it, into these parts; chat completions' stream renders them
//! as chunks, the Responses and Messages APIs as their events (`super::answer`).

use engine::{FinishReason, Usage};

use crate::server::reasoning::{Reasoning, Split, Splitter};
use crate::server::tools::{CallReader, Calls, Piece};

/// A piece of an answer.
#[derive(Debug, Clone)]
pub enum Part {
    /// Thinking text, as it comes (with a reasoning parser; all of it before any answer).
    Thinking(String),
    /// A piece of the answer: text, or a tool call (whole, or started, its arguments in
    /// fragments, and ended) as the call reader gives it.
    Answer(Piece),
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

/// Reads one choice's text as parts.
#[derive(Debug)]
pub struct ChoiceReader {
    /// With a reasoning parser: the thinking split off first.
    thinking: Option<Splitter>,
    /// With tools to read: the answer read for calls.
    calls: Option<CallReader>,
}

impl ChoiceReader {
    /// A reader of answers read for `calls` (if any), their thinking split off first by
    /// `reasoning` (if any); with neither, text passes as it is.
    pub fn new(calls: Option<Calls>, reasoning: Option<Reasoning>) -> Self {
        Self {
            thinking: reasoning.map(|r| r.splitter()),
            calls: calls.map(CallReader::new),
        }
    }

    /// The parts `text` completes.
    pub fn push(&mut self, text: &str) -> Vec<Part> {
        let mut out = Vec::new();
        match self.thinking.as_mut() {
            Some(splitter) => {
                let splits = splitter.push(text);
                self.splits(splits, &mut out);
            }
            None => self.answer(text, &mut out),
        }
        out
    }

    /// The parts left once the choice ended.
    pub fn finish(&mut self) -> Vec<Part> {
        let mut out = Vec::new();
        if let Some(mut splitter) = self.thinking.take() {
            let splits = splitter.finish();
            self.splits(splits, &mut out);
        }
        if let Some(reader) = self.calls.as_mut() {
            out.extend(reader.finish().into_iter().map(Part::Answer));
        }
        out
    }

    /// Calls given or started so far.
    pub fn calls(&self) -> usize {
        self.calls.as_ref().map_or(0, |r| r.calls)
    }

    /// What the splitter gave: thinking as it is, the answer read as [`Self::answer`] does.
    fn splits(&mut self, splits: Vec<Split>, out: &mut Vec<Part>) {
        for split in splits {
            match split {
                Split::Thinking(text) => out.push(Part::Thinking(text)),
                Split::Answer(text) => self.answer(&text, out),
            }
        }
    }

    /// Answer text: read for calls where the answer is, else as it is.
    fn answer(&mut self, text: &str, out: &mut Vec<Part>) {
        match self.calls.as_mut() {
            Some(reader) => out.extend(reader.push(text).into_iter().map(Part::Answer)),
            None => out.push(Part::Answer(Piece::Text(text.to_string()))),
        }
    }
}
