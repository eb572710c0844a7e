//! Reading answers for tool calls in any [`ToolFormat`]: a whole answer ([`parse_calls`]), or
//! a streamed one as it comes ([`CallReader`]). Text before the first call passes through as
//! it comes, except a tail that may still become the format's opener. A call in a block of
//! one JSON call object streams: it starts once its name (of an offered function) is whole
//! and its arguments have begun, its arguments follow in fragments as they are written
//! (compact: [`super::call_json`]), and it ends as its block closes, its arguments the
//! fragments joined. Other calls that come in blocks are given whole as each block closes (at
//! a close marker after a whole call, not at one inside a string), the rest at the end of the
//! answer; what does not parse goes out as text. An answer that opens with `{`, in a format
//! that allows calls without an opener, is held to the end, where it may turn out to be calls.

use std::sync::Arc;

use super::format::ToolFormat;
use super::{call_id, call_out, ParsedCall, Tool};
use crate::server::openai::chat::response::ToolCallOut;

/// How one request's answers are read for calls: the format and the offered functions.
#[derive(Debug, Clone)]
pub struct Calls {
    /// The format calls are written in.
    pub format: Arc<dyn ToolFormat>,
    /// The offered functions.
    pub tools: Arc<[Tool]>,
    /// Whether a grammar forced the answer to be calls (`tool_choice` `required` or a
    /// function): then what is not a call is the calls' markup cut off by the token limit,
    /// not content.
    pub forced: bool,
}

impl Calls {
    /// Calls of `tools` in `format`.
    pub fn new(format: Arc<dyn ToolFormat>, tools: Vec<Tool>) -> Self {
        Self {
            format,
            tools: tools.into(),
            forced: false,
        }
    }

    /// The same, for answers a grammar forces to be calls.
    pub fn forced(self, forced: bool) -> Self {
        Self { forced, ..self }
    }

    /// Where the first opener in `text` starts, if any.
    fn first_opener(&self, text: &str) -> Option<usize> {
        self.format
            .openers()
            .iter()
            .filter_map(|o| text.find(o))
            .min()
    }

    fn parse(&self, text: &str, finished: bool) -> Option<Vec<ParsedCall>> {
        self.format.parse(text, &self.tools, finished)
    }
}

/// `text` read for tool calls: the text before the calls (if any is left) and the calls, or
/// `None` when it holds no well-formed call (then it is all content, unless the answer was
/// forced to be calls: then it is neither, and no content is left).
pub fn parse_calls(text: &str, calls: &Calls) -> Option<(Option<String>, Vec<ToolCallOut>)> {
    let parsed = parse_some(text, calls);
    match parsed {
        None if calls.forced => Some((None, Vec::new())),
        other => other,
    }
}

fn parse_some(text: &str, calls: &Calls) -> Option<(Option<String>, Vec<ToolCallOut>)> {
    let start = match calls.first_opener(text) {
        Some(at) => at,
        None if calls.format.bare_json() && text.trim_start().starts_with('{') => 0,
        None => return None,
    };
    let parsed = calls.parse(&text[start..], true)?;
    let content = text[..start].trim();
    Some((
        (!content.is_empty()).then(|| content.to_string()),
        parsed.into_iter().map(call_out).collect(),
    ))
}

/// What a streamed choice sends next while its text is read for calls.
#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    /// Plain text.
    Text(String),
    /// A whole call, read at once (sent as a delta naming it, then one with its arguments).
    Call(ToolCallOut),
    /// A call being written: its id and name, as soon as the name is whole.
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
        /// The fragment (the fragments joined are the call's arguments).
        text: String,
    },
    /// A started call is whole: the call, its arguments the fragments joined.
    CallEnd {
        /// The call's index.
        index: usize,
        /// The call.
        call: ToolCallOut,
    },
}

/// The call a reader is streaming.
#[derive(Debug)]
struct Streaming {
    index: usize,
    id: String,
    name: String,
    /// The arguments sent so far.
    sent: String,
}

/// Reads a streamed answer for tool calls.
#[derive(Debug)]
pub struct CallReader {
    calls_of: Calls,
    held: String,
    in_calls: bool,
    /// The answer so far is blank or opened with `{` (in a format with bare calls).
    maybe_bare: bool,
    /// Calls given (or started) so far.
    pub calls: usize,
    /// The call of the open block, once it streams.
    streaming: Option<Streaming>,
}

impl CallReader {
    /// A reader for `calls`.
    pub fn new(calls: Calls) -> Self {
        let maybe_bare = calls.format.bare_json();
        Self {
            calls_of: calls,
            held: String::new(),
            in_calls: false,
            maybe_bare,
            calls: 0,
            streaming: None,
        }
    }

    /// The pieces `text` completes.
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.held.push_str(text);
        if self.maybe_bare {
            match self.held.trim_start().chars().next() {
                None | Some('{') => return Vec::new(),
                Some(_) => self.maybe_bare = false,
            }
        }
        let mut out = Vec::new();
        loop {
            if self.in_calls {
                let Some(close) = self.calls_of.format.block_close() else {
                    break;
                };
                // The block closes at the first close marker before which it holds whole
                // calls (one inside a JSON string is text); until then it is held.
                let held = &self.held;
                let closed = held.match_indices(close).find_map(|(end, _)| {
                    let block = &held[..end + close.len()];
                    self.calls_of.parse(block, false).map(|calls| (end, calls))
                });
                let Some((end, calls)) = closed else {
                    self.stream(&mut out);
                    break;
                };
                self.held.drain(..end + close.len());
                self.settle(calls, &mut out);
                self.in_calls = false;
                continue;
            }
            match self.calls_of.first_opener(&self.held) {
                Some(open) => {
                    let before: String = self.held.drain(..open).collect();
                    if !before.is_empty() {
                        out.push(Piece::Text(before));
                    }
                    self.in_calls = true;
                }
                None => {
                    // Keep a tail that could be the start of an opener.
                    let keep = self
                        .calls_of
                        .format
                        .openers()
                        .iter()
                        .filter_map(|o| {
                            (1..o.len())
                                .rev()
                                .find(|&n| o.is_char_boundary(n) && self.held.ends_with(&o[..n]))
                        })
                        .max()
                        .unwrap_or(0);
                    let cut = self.held.len() - keep;
                    if cut > 0 {
                        out.push(Piece::Text(self.held.drain(..cut).collect()));
                    }
                    break;
                }
            }
        }
        out
    }

    /// What is left once the answer ended: calls (a last block cut off counts as far as
    /// the format reads it), or text.
    pub fn finish(&mut self) -> Vec<Piece> {
        let held = std::mem::take(&mut self.held);
        let mut out = Vec::new();
        if held.is_empty() {
            return out;
        }
        if self.maybe_bare || self.in_calls {
            self.maybe_bare = false;
            self.in_calls = false;
            self.block(held, true, &mut out);
        } else if !self.calls_of.forced {
            out.push(Piece::Text(held));
        }
        out
    }

    /// The calls of `block` (from an opener on, or a bare answer), or the block as text
    /// when it holds none (a call that started streaming then ends as far as it was sent).
    fn block(&mut self, block: String, finished: bool, out: &mut Vec<Piece>) {
        match self.calls_of.parse(&block, finished) {
            Some(calls) => self.settle(calls, out),
            None => {
                if let Some(started) = self.streaming.take() {
                    out.push(end_as_sent(started));
                } else if !self.calls_of.forced {
                    out.push(Piece::Text(block));
                }
            }
        }
    }

    /// The calls a block gave: its first ends the call being streamed, if one is (as far as
    /// it was sent, should the block read whole disagree with what was streamed).
    fn settle(&mut self, calls: Vec<ParsedCall>, out: &mut Vec<Piece>) {
        let mut calls = calls.into_iter();
        if let Some(started) = self.streaming.take() {
            match calls.next() {
                Some(call) => match call.arguments.strip_prefix(started.sent.as_str()) {
                    Some(rest) => {
                        if !rest.is_empty() {
                            out.push(Piece::Arguments {
                                index: started.index,
                                text: rest.to_string(),
                            });
                        }
                        out.push(end_of(started, call));
                    }
                    None => {
                        tracing::warn!(
                            sent = started.sent,
                            whole = call.arguments,
                            "a streamed call's arguments differ from the call read whole"
                        );
                        out.push(end_as_sent(started));
                    }
                },
                None => out.push(end_as_sent(started)),
            }
        }
        for call in calls {
            self.calls += 1;
            out.push(Piece::Call(call_out(call)));
        }
    }

    /// Streams the open block's call as far as it is written: its start once its name is
    /// whole, then each new stretch of its arguments.
    fn stream(&mut self, out: &mut Vec<Piece>) {
        let Some(so_far) = self.calls_of.format.call_so_far(&self.held) else {
            return;
        };
        // A call is taken as one (and can no longer turn out to be text) once its name is
        // whole and its arguments have begun.
        if so_far.quoted || so_far.arguments.is_empty() && self.streaming.is_none() {
            return;
        }
        let Some(name) = so_far.name else {
            return;
        };
        if !self.calls_of.tools.iter().any(|t| t.name == name) {
            return;
        }
        if self.streaming.is_none() {
            let index = self.calls;
            self.calls += 1;
            let id = call_id();
            out.push(Piece::CallStart {
                index,
                id: id.clone(),
                name: name.clone(),
            });
            self.streaming = Some(Streaming {
                index,
                id,
                name,
                sent: String::new(),
            });
        }
        let Some(started) = self.streaming.as_mut() else {
            return;
        };
        if so_far.arguments.len() > started.sent.len()
            && so_far.arguments.starts_with(started.sent.as_str())
        {
            out.push(Piece::Arguments {
                index: started.index,
                text: so_far.arguments[started.sent.len()..].to_string(),
            });
            started.sent = so_far.arguments;
        }
    }
}

/// The end of a streamed call with the arguments it sent.
fn end_as_sent(started: Streaming) -> Piece {
    let call = ParsedCall {
        name: started.name.clone(),
        arguments: started.sent.clone(),
    };
    end_of(started, call)
}

/// The end of a streamed call, as `call` (read whole) has it, under the id it started with.
fn end_of(started: Streaming, call: ParsedCall) -> Piece {
    let mut out = call_out(call);
    out.id = started.id;
    Piece::CallEnd {
        index: started.index,
        call: out,
    }
}
