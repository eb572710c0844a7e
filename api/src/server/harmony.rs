//! The harmony format gpt-oss answers in (`--reasoning-parser openai_gptoss`): a reply is a
//! run of messages, each a header (`<|start|>assistant`, `<|channel|>NAME`, ` to=RECIPIENT`,
//! ` <|constrain|>json`, in the orders the model writes them) and `<|message|>`, then a body
//! that ends at `<|end|>`, `<|call|>` or `<|return|>` (the prompt already holds the first
//! message's `<|start|>assistant`). [`HarmonySplitter`] reads a reply as it comes into
//! thinking (the `analysis` channel, and messages to built-in tools such as `browser.search`),
//! answer (`final`, and `commentary` addressed to no one: a preamble meant for the user) and
//! tool calls (a message to `functions.NAME`), which go into the answer in one canonical form,
//! `<|channel|>commentary to=NAME<|message|>ARGUMENTS<|call|>`, for the `openai` tool-call
//! format to read (`super::tools::openai`). Markers cut between two pieces are held until
//! they are whole; a reply that does not open with a header is all answer (a model that
//! left the format), and a header cut off at the end is markup, not text.

use crate::server::reasoning::Split;

/// Opens a message.
pub const START: &str = "<|start|>";
/// Names a message's channel.
pub const CHANNEL: &str = "<|channel|>";
/// Ends a header: the body follows.
pub const MESSAGE: &str = "<|message|>";
/// Ends a message the reply goes on after.
pub const END: &str = "<|end|>";
/// Ends a message that calls a tool (and the reply).
pub const CALL: &str = "<|call|>";
/// Ends the reply.
pub const RETURN: &str = "<|return|>";
/// Names the format of a call's arguments (`<|constrain|>json`).
pub const CONSTRAIN: &str = "<|constrain|>";
/// What opens a call in the canonical form the splitter writes calls in.
pub const CALL_OPEN: &str = "<|channel|>commentary to=";
/// The namespace of the functions a request offers.
pub const FUNCTIONS: &str = "functions.";

/// What a body ends at: a marker that ends the message, or one that opens the next header
/// (a model that skips `<|end|>`).
const BODY_ENDS: [&str; 5] = [END, CALL, RETURN, START, CHANNEL];
/// A header that has not ended after this many bytes is not one.
const MAX_HEADER: usize = 512;

/// Where a message's body goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Body {
    Thinking,
    Answer,
    Call,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Reading a header (or the blanks before one).
    Header,
    /// Reading a body.
    Body(Body),
    /// The reply left the format: the rest is answer text.
    Plain,
}

/// One harmony reply split into thinking and answer (calls in canonical form) as it comes.
#[derive(Debug, Clone)]
pub struct HarmonySplitter {
    state: State,
    held: String,
    answer_started: bool,
}

impl Default for HarmonySplitter {
    fn default() -> Self {
        Self::new()
    }
}

/// The longest tail of `text` that is a proper prefix of one of `markers`.
fn held_tail(text: &str, markers: &[&str]) -> usize {
    markers
        .iter()
        .filter_map(|m| {
            (1..m.len())
                .rev()
                .find(|&n| m.is_char_boundary(n) && text.ends_with(&m[..n]))
        })
        .max()
        .unwrap_or(0)
}

/// Whether `text` (blanks dropped) is a header, or the start of one.
fn may_be_header(text: &str) -> bool {
    let text = text.trim_start();
    [START, CHANNEL, CONSTRAIN, "to="]
        .iter()
        .any(|m| text.starts_with(m) || m.starts_with(text))
}

/// The word after `key` in `header`: up to a blank or a marker.
fn word_after<'a>(header: &'a str, key: &str) -> Option<&'a str> {
    let at = header.find(key)? + key.len();
    let rest = &header[at..];
    let end = rest
        .find(|c: char| c.is_whitespace() || c == '<')
        .unwrap_or(rest.len());
    Some(&rest[..end])
}

/// Where the body after `header` goes, and the function it calls (if it calls one).
fn classify(header: &str) -> (Body, Option<&str>) {
    let recipient = word_after(header, "to=").filter(|r| !r.is_empty());
    match recipient {
        Some(r) => match r.strip_prefix(FUNCTIONS) {
            Some(name) if !name.is_empty() => (Body::Call, Some(name)),
            // Built-in tools (browser, python) run inside the reasoning.
            _ => (Body::Thinking, None),
        },
        None if word_after(header, CHANNEL) == Some("analysis") => (Body::Thinking, None),
        // final, commentary for the user, or no channel named.
        None => (Body::Answer, None),
    }
}

impl HarmonySplitter {
    /// A splitter at the start of a reply.
    pub fn new() -> Self {
        Self {
            state: State::Header,
            held: String::new(),
            answer_started: false,
        }
    }

    /// The pieces `text` completes.
    pub fn push(&mut self, text: &str) -> Vec<Split> {
        self.held.push_str(text);
        let mut out = Vec::new();
        loop {
            match self.state {
                State::Header => {
                    if let Some(at) = self.held.find(MESSAGE) {
                        let header: String = self.held.drain(..at + MESSAGE.len()).collect();
                        let (body, name) = classify(&header[..at]);
                        if let Some(name) = name {
                            self.answer_started = true;
                            out.push(Split::Answer(format!("{CALL_OPEN}{name}{MESSAGE}")));
                        }
                        self.state = State::Body(body);
                    } else if self.held.len() > MAX_HEADER || !may_be_header(&self.held) {
                        self.state = State::Plain;
                    } else {
                        break;
                    }
                }
                State::Body(body) => {
                    let first_end = BODY_ENDS
                        .iter()
                        .filter_map(|m| self.held.find(m).map(|at| (at, *m)))
                        .min_by_key(|(at, _)| *at);
                    let Some((at, marker)) = first_end else {
                        let cut = self.held.len() - held_tail(&self.held, &BODY_ENDS);
                        let text: String = self.held.drain(..cut).collect();
                        self.emit(body, text, &mut out);
                        break;
                    };
                    let text: String = self.held.drain(..at).collect();
                    self.emit(body, text, &mut out);
                    // A marker that opens the next header stays to be read as one.
                    if marker != START && marker != CHANNEL {
                        self.held.drain(..marker.len());
                    }
                    if body == Body::Call {
                        out.push(Split::Answer(CALL.to_string()));
                    }
                    self.state = State::Header;
                }
                State::Plain => {
                    let text = std::mem::take(&mut self.held);
                    self.emit(Body::Answer, text, &mut out);
                    break;
                }
            }
        }
        out
    }

    /// What is still held at the end of the reply: a body's text (an unfinished marker is
    /// text, and a call cut off stays open), or nothing for a header cut off.
    pub fn finish(&mut self) -> Vec<Split> {
        let mut out = Vec::new();
        let text = std::mem::take(&mut self.held);
        match self.state {
            State::Header => {}
            State::Body(body) => self.emit(body, text, &mut out),
            State::Plain => self.emit(Body::Answer, text, &mut out),
        }
        out
    }

    /// `text` of a body that goes to `body`; blanks that open the answer dropped.
    fn emit(&mut self, body: Body, mut text: String, out: &mut Vec<Split>) {
        match body {
            Body::Thinking if !text.is_empty() => out.push(Split::Thinking(text)),
            Body::Answer if !self.answer_started => {
                let blanks = text.len() - text.trim_start().len();
                text.drain(..blanks);
                if !text.is_empty() {
                    self.answer_started = true;
                    out.push(Split::Answer(text));
                }
            }
            Body::Answer | Body::Call if !text.is_empty() => out.push(Split::Answer(text)),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::server::reasoning::tests::same_at_every_cut;
    use crate::server::reasoning::{split_whole, ReasoningParser};

    fn split(text: &str) -> (Option<String>, String) {
        let reasoning = ReasoningParser::Harmony.for_prompt("<|start|>user<|message|>hi<|end|>");
        assert!(!reasoning.opened);
        same_at_every_cut(reasoning, text)
    }

    #[test]
    fn analysis_is_thinking_and_final_is_the_answer() {
        let text = "<|channel|>analysis<|message|>User says hi.<|end|>\
                    <|start|>assistant<|channel|>final<|message|>Hello!<|return|>";
        assert_eq!(split(text), (Some("User says hi.".into()), "Hello!".into()));
        // Without the end marker (the engine drops the end token), and with a constrained
        // final message.
        let text = "<|channel|>analysis<|message|>a<|end|><|start|>assistant\
                    <|channel|>final <|constrain|>json<|message|>{\"x\": 1}";
        assert_eq!(split(text), (Some("a".into()), "{\"x\": 1}".into()));
    }

    #[test]
    fn a_call_goes_into_the_answer_in_canonical_form() {
        // The recipient after the channel, as gpt-oss writes it in a reply ...
        let text = "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant\
                    <|channel|>commentary to=functions.get_weather <|constrain|>json\
                    <|message|>{\"city\":\"Paris\"}<|call|>";
        let canonical =
            "<|channel|>commentary to=get_weather<|message|>{\"city\":\"Paris\"}<|call|>";
        assert_eq!(
            split(text),
            (Some("Need weather.".into()), canonical.into())
        );
        // ... or in the role's part of the header, as the template renders it; cut off
        // by the token limit, the call stays open.
        let text = " to=functions.get_weather<|channel|>commentary json<|message|>{\"city\":";
        assert_eq!(
            split(text),
            (
                None,
                "<|channel|>commentary to=get_weather<|message|>{\"city\":".into()
            )
        );
    }

    #[test]
    fn a_preamble_is_answer_and_builtin_tools_are_thinking() {
        let text = "<|channel|>commentary<|message|>Let me look.<|end|>\
                    <|start|>assistant to=browser.search<|channel|>analysis<|message|>\
                    {\"query\":\"x\"}<|call|>";
        assert_eq!(
            split(text),
            (Some("{\"query\":\"x\"}".into()), "Let me look.".into())
        );
    }

    #[test]
    fn text_outside_the_format_is_the_answer() {
        assert_eq!(
            split("  Just text, <|end|> and all."),
            (None, "Just text, <|end|> and all.".into())
        );
        // A channel opened without an end before the next one.
        let text = "<|channel|>analysis<|message|>hm<|channel|>final<|message|>ok";
        assert_eq!(split(text), (Some("hm".into()), "ok".into()));
        // Cut-off headers are markup, not text.
        assert_eq!(
            split("<|channel|>analysis<|message|>hm<|end|><|start|>assist"),
            (Some("hm".into()), String::new())
        );
        assert_eq!(split("<|chan"), (None, String::new()));
        // A marker half-written at the end of a body is text.
        assert_eq!(
            split("<|channel|>final<|message|>a <|en"),
            (None, "a <|en".into())
        );
    }

    #[test]
    fn thinking_that_never_ends_is_thinking_and_reasoning_counts_it() {
        let reasoning = ReasoningParser::Harmony.for_prompt("<|start|>assistant");
        let (thinking, answer) =
            split_whole(reasoning, "<|channel|>analysis<|message|>still thinking");
        assert_eq!(thinking.as_deref(), Some("still thinking"));
        assert_eq!(answer, "");
        let spec = reasoning.thinking(Some(8));
        assert_eq!(
            (spec.start.as_deref(), spec.end.as_str()),
            (Some("<|channel|>analysis<|message|>"), "<|end|>")
        );
    }
}
