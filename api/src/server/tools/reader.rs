//! Reading answers for tool calls in any [`ToolFormat`]: a whole answer ([`parse_calls`]), or
//! a streamed one as it comes ([`CallReader`]). Text before the first call passes through as
//! it comes, except a tail that may still become the format's opener; after the first call
//! none does (the whole answer's content is what came before its calls). Calls stream as the
//! format writes them ([`ToolFormat::calls_so_far`]): each starts once its name (of an
//! offered function) is whole and its arguments have begun, its arguments follow in
//! fragments as they are written, and it ends once its object (or element) closes, its
//! arguments the fragments joined; a block read whole settles what did not stream (a call
//! whose arguments are a JSON string comes whole). Blocks close at a close marker after a
//! whole call, not at one inside a string; what does not parse goes out as text. An answer
//! that opens with `{`, in a format that allows calls without an opener, is held until it
//! streams as calls, or to the end, where it may turn out to be calls.

use std::sync::Arc;

use super::call::ToolCallOut;
use super::format::ToolFormat;
use super::{call_id, call_out, ParsedCall, Tool};

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
    Call {
        /// The call's index among the answer's calls.
        index: usize,
        /// The call.
        call: ToolCallOut,
    },
    /// A call being written: its id and name, once the name is whole and the arguments
    /// have begun.
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

/// A call of the open block that streams.
#[derive(Debug)]
struct Streaming {
    index: usize,
    id: String,
    name: String,
    /// The arguments sent so far.
    sent: String,
    /// Whether its end went out (once its object closed).
    ended: bool,
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
    /// The calls of the open block that stream, in order.
    streaming: Vec<Streaming>,
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
            streaming: Vec::new(),
        }
    }

    /// The pieces `text` completes.
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.held.push_str(text);
        let mut out = Vec::new();
        if self.maybe_bare {
            match self.held.trim_start().chars().next() {
                None => return out,
                Some('{') => {
                    self.stream(&mut out);
                    return out;
                }
                Some(_) => self.maybe_bare = false,
            }
        }
        loop {
            if self.in_calls {
                let Some(close) = self.calls_of.format.block_close() else {
                    // The block runs to the end of the answer.
                    self.stream(&mut out);
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
                    self.text(before, &mut out);
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
                    let text = self.held.drain(..cut).collect();
                    self.text(text, &mut out);
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
            self.text(held, &mut out);
        }
        out
    }

    /// Text of the answer, as it goes out: none after its first call (as an answer read
    /// whole has its content from before its calls).
    fn text(&self, text: String, out: &mut Vec<Piece>) {
        if self.calls == 0 && !text.is_empty() {
            out.push(Piece::Text(text));
        }
    }

    /// The calls of `block` (from an opener on, or a bare answer), or the block as text
    /// when it holds none (a call that started streaming then ends as far as it was sent).
    fn block(&mut self, block: String, finished: bool, out: &mut Vec<Piece>) {
        match self.calls_of.parse(&block, finished) {
            Some(calls) => self.settle(calls, out),
            None if !self.streaming.is_empty() => self.settle(Vec::new(), out),
            None => {
                if !self.calls_of.forced {
                    self.text(block, out);
                }
            }
        }
    }

    /// The calls a block gave: the first end the calls that streamed (an ended one is passed
    /// over; an open one ends with the rest of its arguments, or as far as it was sent should
    /// the block read whole disagree with what was streamed), the rest go out whole.
    fn settle(&mut self, calls: Vec<ParsedCall>, out: &mut Vec<Piece>) {
        let mut calls = calls.into_iter();
        for started in std::mem::take(&mut self.streaming) {
            let call = calls.next();
            if started.ended {
                if call.as_ref().is_some_and(|c| c.arguments != started.sent) {
                    tracing::warn!(sent = started.sent, "a streamed call read whole differs");
                }
                continue;
            }
            let rest = call
                .as_ref()
                .and_then(|c| c.arguments.strip_prefix(started.sent.as_str()))
                .map(str::to_string);
            match (rest, call) {
                (Some(rest), Some(call)) => {
                    if !rest.is_empty() {
                        out.push(Piece::Arguments {
                            index: started.index,
                            text: rest,
                        });
                    }
                    out.push(end_of(started, call));
                }
                (_, call) => {
                    if let Some(call) = call {
                        tracing::warn!(
                            sent = started.sent,
                            whole = call.arguments,
                            "a streamed call's arguments differ from the call read whole"
                        );
                    }
                    out.push(end_as_sent(started));
                }
            }
        }
        for call in calls {
            out.push(Piece::Call {
                index: self.calls,
                call: call_out(call),
            });
            self.calls += 1;
        }
    }

    /// Streams the open block's calls as far as they are written: each starts once its name
    /// (of an offered function) is whole and its arguments have begun, then each new stretch
    /// of its arguments follows, and it ends once its object closes. A call whose arguments
    /// cannot stream (written as a string) holds itself and the calls after it until the
    /// block closes.
    fn stream(&mut self, out: &mut Vec<Piece>) {
        let so_far = self
            .calls_of
            .format
            .calls_so_far(&self.held, &self.calls_of.tools);
        for (i, call) in so_far.into_iter().enumerate() {
            if i == self.streaming.len() {
                // A call is taken as one (and can no longer turn out to be text) once its
                // name is whole and its arguments have begun.
                let named = call
                    .name
                    .as_ref()
                    .filter(|name| self.calls_of.tools.iter().any(|t| &t.name == *name));
                let Some(name) = named.filter(|_| !call.quoted && !call.arguments.is_empty())
                else {
                    return;
                };
                let index = self.calls;
                self.calls += 1;
                let id = call_id();
                out.push(Piece::CallStart {
                    index,
                    id: id.clone(),
                    name: name.clone(),
                });
                self.streaming.push(Streaming {
                    index,
                    id,
                    name: name.clone(),
                    sent: String::new(),
                    ended: false,
                });
            }
            let Some(started) = self.streaming.get_mut(i).filter(|s| !s.ended) else {
                continue;
            };
            if call.arguments.len() > started.sent.len()
                && call.arguments.starts_with(started.sent.as_str())
            {
                out.push(Piece::Arguments {
                    index: started.index,
                    text: call.arguments[started.sent.len()..].to_string(),
                });
                started.sent = call.arguments;
            }
            if call.closed {
                started.ended = true;
                let call = ParsedCall {
                    name: started.name.clone(),
                    arguments: started.sent.clone(),
                };
                out.push(Piece::CallEnd {
                    index: started.index,
                    call: ended(started, call),
                });
            }
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
    Piece::CallEnd {
        index: started.index,
        call: ended(&started, call),
    }
}

/// `call` under the id `started` announced.
fn ended(started: &Streaming, call: ParsedCall) -> ToolCallOut {
    let mut out = call_out(call);
    out.id.clone_from(&started.id);
    out
}
