//! Gemma 4's thinking (`--reasoning-parser gemma4`): the model thinks in a channel block,
//! `<|channel>thought`, a line break, its thinking, `<channel|>`, and then answers (with
//! thinking off, the template ends the prompt with an empty block). [`Gemma4Splitter`] splits
//! a reply as it comes: a block's text, the blanks after `thought` dropped, is thinking,
//! wherever in the reply the block comes; an empty block, a `<|channel>` that opens no
//! thought (`<|channel><|channel>thought`) and a `<channel|>` with no block open are dropped;
//! the rest is the answer, its opening blanks dropped. A marker cut between two pieces is
//! held until it is whole; cut off at the end of the reply, an end marker is text of the
//! block it was to end, and a block cut off at its name is dropped.

use crate::server::reasoning::Split;

/// Opens a channel block.
pub const CHANNEL: &str = "<|channel>";
/// Opens a thinking block.
pub const START: &str = "<|channel>thought";
/// Ends a channel block.
pub const END: &str = "<channel|>";
/// The thinking channel's name.
const THOUGHT: &str = "thought";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Just inside a block: blanks are dropped.
    Opening,
    /// Thinking, until `<channel|>`.
    Thinking,
    /// The answer.
    Answer,
}

/// One Gemma 4 reply split into thinking and answer as it comes.
#[derive(Debug, Clone)]
pub struct Gemma4Splitter {
    phase: Phase,
    held: String,
    answer_started: bool,
}

/// The longest tail of `text` that is a proper prefix of one of `markers`.
fn marker_tail(text: &str, markers: &[&str]) -> usize {
    markers
        .iter()
        .filter_map(|m| (1..m.len()).rev().find(|&n| text.ends_with(&m[..n])))
        .max()
        .unwrap_or(0)
}

impl Gemma4Splitter {
    /// A splitter for a reply whose prompt left a thinking block open (`opened`) or not.
    pub fn new(opened: bool) -> Self {
        Self {
            phase: if opened {
                Phase::Opening
            } else {
                Phase::Answer
            },
            held: String::new(),
            answer_started: false,
        }
    }

    /// The pieces `text` completes.
    pub fn push(&mut self, text: &str) -> Vec<Split> {
        self.held.push_str(text);
        let mut out = Vec::new();
        loop {
            match self.phase {
                Phase::Opening => {
                    let blanks = self.held.len() - self.held.trim_start().len();
                    self.held.drain(..blanks);
                    if self.held.is_empty() {
                        break;
                    }
                    self.phase = Phase::Thinking;
                }
                Phase::Thinking => match self.held.find(END) {
                    Some(at) => {
                        let thought: String = self.held.drain(..at).collect();
                        self.held.drain(..END.len());
                        if !thought.is_empty() {
                            out.push(Split::Thinking(thought));
                        }
                        self.phase = Phase::Answer;
                    }
                    None => {
                        let cut = self.held.len() - marker_tail(&self.held, &[END]);
                        if cut > 0 {
                            out.push(Split::Thinking(self.held.drain(..cut).collect()));
                        }
                        break;
                    }
                },
                Phase::Answer => {
                    let channel = self.held.find(CHANNEL);
                    let end = self.held.find(END);
                    let at = match (channel, end) {
                        (Some(c), Some(e)) => c.min(e),
                        (Some(at), None) | (None, Some(at)) => at,
                        (None, None) => {
                            let keep = marker_tail(&self.held, &[CHANNEL, END]);
                            let text = self.held.drain(..self.held.len() - keep).collect();
                            self.answer(text, &mut out);
                            break;
                        }
                    };
                    let before = self.held.drain(..at).collect();
                    self.answer(before, &mut out);
                    if self.held.starts_with(END) {
                        // A stray end marker.
                        self.held.drain(..END.len());
                    } else if self.held.starts_with(START) {
                        self.held.drain(..START.len());
                        self.phase = Phase::Opening;
                    } else if THOUGHT.starts_with(&self.held[CHANNEL.len()..]) {
                        // The channel's name is still to come.
                        break;
                    } else {
                        // A `<|channel>` that opens no thought.
                        self.held.drain(..CHANNEL.len());
                    }
                }
            }
        }
        out
    }

    /// Answer text, its opening blanks dropped.
    fn answer(&mut self, mut text: String, out: &mut Vec<Split>) {
        if !self.answer_started {
            text = text.trim_start().to_string();
            self.answer_started = !text.is_empty();
        }
        if !text.is_empty() {
            out.push(Split::Answer(text));
        }
    }

    /// What is still held, at the end of the reply.
    pub fn finish(&mut self) -> Vec<Split> {
        let held = std::mem::take(&mut self.held);
        let mut out = Vec::new();
        match self.phase {
            Phase::Opening => {}
            Phase::Thinking if !held.is_empty() => out.push(Split::Thinking(held)),
            Phase::Thinking => {}
            // A block cut off at its name.
            Phase::Answer if held.starts_with(CHANNEL) => {}
            Phase::Answer => self.answer(held, &mut out),
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use crate::server::reasoning::tests::same_at_every_cut;
    use crate::server::reasoning::{split_whole, ReasoningParser};

    /// A reply read as Gemma 4's, after a prompt that ends with `prompt`, at every cut:
    /// its thinking and its answer.
    fn read(prompt: &str, text: &str) -> (Option<String>, String) {
        same_at_every_cut(ReasoningParser::Gemma4.for_prompt(prompt), text)
    }

    const THINKING_ON: &str = "<|turn>user\nHi<turn|>\n<|turn>model\n";
    const THINKING_OFF: &str =
        "<|turn>user\nHi<turn|>\n<|turn>model\n<|channel>thought\n<channel|>";

    fn split(thinking: Option<&str>, answer: &str) -> (Option<String>, String) {
        (thinking.map(str::to_string), answer.to_string())
    }

    #[test]
    fn a_thought_block_is_thinking_and_what_follows_the_answer() {
        assert_eq!(
            read(
                THINKING_ON,
                "<|channel>thought\nI'm\nthinking<channel|>Hello, world!\nWhat's up?"
            ),
            split(Some("I'm\nthinking"), "Hello, world!\nWhat's up?")
        );
        // Without a line break after the name, and multibyte text.
        assert_eq!(
            read(
                THINKING_ON,
                "<|channel>thought état 思考<channel|>réponse ✓"
            ),
            split(Some("état 思考"), "réponse ✓")
        );
        // With thinking off, the prompt's block is closed: the reply is the answer.
        let off = ReasoningParser::Gemma4.for_prompt(THINKING_OFF);
        assert!(!off.opened);
        assert_eq!(read(THINKING_OFF, "Hello."), split(None, "Hello."));
        // A prompt that leaves the block open: the reply thinks from its first token.
        let opened = "<|turn>model\n<|channel>thought\n";
        assert!(ReasoningParser::Gemma4.for_prompt(opened).opened);
        assert_eq!(read(opened, "hm<channel|>Yes."), split(Some("hm"), "Yes."));
    }

    #[test]
    fn empty_blocks_and_stray_markers_are_dropped() {
        let answer = "Hello, world!\nWhat's up?";
        for text in [
            "<|channel>thought<channel|>Hello, world!\nWhat's up?",
            "<|channel>thought\n<channel|>Hello, world!\nWhat's up?",
            "<|channel>thought\n<channel|>Hello, world!\nWhat's up?<channel|>",
            "<|channel>thought\n<channel|>Hello, world!\nWhat's up?<|channel>thought\n<channel|>",
            "<|channel>thought\n<channel|>Hello, world!\nWhat's up?<|channel>thought\n<channel|><channel|>",
            "<|channel><|channel>thought\n<channel|>Hello, world!\nWhat's up?",
            "<channel|>Hello, world!\nWhat's up?",
        ] {
            assert_eq!(read(THINKING_OFF, text), split(None, answer), "{text:?}");
        }
        // A stray end marker inside the answer goes; the text around it stays.
        assert_eq!(
            read(THINKING_OFF, "a<channel|>b<|channel>c"),
            split(None, "abc")
        );
    }

    #[test]
    fn a_later_block_is_thinking_too_and_a_cut_off_one_is_not_answer() {
        assert_eq!(
            read(THINKING_ON, "One.<|channel>thought\nmore<channel|> Two."),
            split(Some("more"), "One. Two.")
        );
        // Thinking that never ends, its end marker cut off: all thinking.
        assert_eq!(
            read(THINKING_ON, "<|channel>thought\nstill going<chan"),
            split(Some("still going<chan"), "")
        );
        // Cut off at the block's name: neither.
        assert_eq!(read(THINKING_ON, "Hi.<|channel>thou"), split(None, "Hi."));
        // A partial marker at the end of the answer is text.
        assert_eq!(read(THINKING_ON, "Hi <|chan"), split(None, "Hi <|chan"));
        assert_eq!(
            split_whole(ReasoningParser::Gemma4.for_prompt(THINKING_ON), "  \n"),
            split(None, "")
        );
    }

    #[test]
    fn gemma4_is_named_and_picked_from_its_template() {
        assert_eq!(
            ReasoningParser::parse("gemma4"),
            Ok(ReasoningParser::Gemma4)
        );
        let template = "{%- if not enable_thinking | default(false) -%}\
                        {{- '<|channel>thought\\n<channel|>' -}}{%- endif -%}";
        assert_eq!(
            ReasoningParser::default_for_template(Some(template)),
            Some(ReasoningParser::Gemma4)
        );
        // gpt-oss's harmony channels are not Gemma 4's.
        let harmony = "<|start|>assistant<|channel|>final<|message|>";
        assert_eq!(
            ReasoningParser::default_for_template(Some(harmony)),
            Some(ReasoningParser::Harmony)
        );
        let (start, end) = ReasoningParser::Gemma4.markers();
        let spec = ReasoningParser::Gemma4
            .for_prompt(THINKING_OFF)
            .thinking(Some(8));
        assert_eq!(
            (spec.start.as_deref(), spec.end.as_str()),
            (Some(start), end)
        );
    }
}
