//! Reading answers for tool calls in any [`ToolFormat`]: a whole answer ([`parse_calls`]), or
//! a streamed one as it comes ([`CallReader`]). Text before the first call passes through as
//! it comes, except a tail that may still become the format's opener; calls that come in
//! blocks are given as each block closes (at a close marker after a whole call, not at one
//! inside a string), others at the end of the answer; what does not parse goes out as text.
//! An answer that opens with `{`, in a format that allows calls without an opener, is held
//! to the end, where it may turn out to be calls.

use std::sync::Arc;

use super::format::ToolFormat;
use super::{call_out, ParsedCall, Tool};
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
    /// A whole call (sent as a delta naming it, then one with its arguments).
    Call(ToolCallOut),
}

/// Reads a streamed answer for tool calls.
#[derive(Debug)]
pub struct CallReader {
    calls_of: Calls,
    held: String,
    in_calls: bool,
    /// The answer so far is blank or opened with `{` (in a format with bare calls).
    maybe_bare: bool,
    /// Calls given so far.
    pub calls: usize,
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
                    break;
                };
                self.held.drain(..end + close.len());
                self.calls += calls.len();
                out.extend(calls.into_iter().map(|c| Piece::Call(call_out(c))));
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
    /// when it holds none.
    fn block(&mut self, block: String, finished: bool, out: &mut Vec<Piece>) {
        match self.calls_of.parse(&block, finished) {
            Some(calls) => {
                self.calls += calls.len();
                out.extend(calls.into_iter().map(|c| Piece::Call(call_out(c))));
            }
            None if self.calls_of.forced => {}
            None => out.push(Piece::Text(block)),
        }
    }
}
