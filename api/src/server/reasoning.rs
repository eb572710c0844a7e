//! Reasoning output (`--reasoning-parser`): a thinking model writes its thinking between a
//! start and an end string (`<think>` and `</think>`) before its answer, and the parser splits
//! the generated text into the two, as it comes ([`Splitter`]), so the chat API can return the
//! thinking as `reasoning_content` beside `content`, and only the answer is read for tool
//! calls. `deepseek_r1` takes everything before the end string as thinking, whether or not
//! the output opens with the start string (the R1 templates put it in the prompt); `qwen3`
//! takes thinking only where the output opens with the start string or the rendered prompt
//! ends inside an opened one, and otherwise reads the whole output as the answer (Qwen3 with
//! thinking turned off); `gemma4` reads Gemma 4's `<|channel>thought ... <channel|>` blocks
//! (`super::gemma4_thinking`). Thinking that never ends is all thinking.

use engine::constraint::ThinkingSpec;

use crate::server::error::{ApiError, ApiResult};
use crate::server::gemma4_thinking::{self as gemma4, Gemma4Splitter};
use crate::server::harmony::{self, HarmonySplitter};

/// A reasoning format, as `--reasoning-parser` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasoningParser {
    /// DeepSeek-R1 and its distills (QwQ alike): thinking until `</think>`.
    DeepSeekR1,
    /// Qwen3: thinking inside `<think>...</think>` when the output (or the prompt) opens it.
    Qwen3,
    /// Thinking between these start and end strings, read as `qwen3` reads its own
    /// (`--reasoning-parser generic --reasoning-start S --reasoning-end E`).
    Generic {
        /// The string that opens thinking.
        start: &'static str,
        /// The string that ends it.
        end: &'static str,
    },
    /// gpt-oss's harmony channels (`openai_gptoss`): `analysis` is thinking, `final` the
    /// answer, calls to functions go into the answer for the `openai` tool-call format
    /// (`super::harmony`).
    Harmony,
    /// Gemma 4: thinking in `<|channel>thought ... <channel|>` blocks.
    Gemma4,
}

/// The names `--reasoning-parser` takes.
pub const REASONING_PARSERS: &[&str] =
    &["deepseek_r1", "qwen3", "openai_gptoss", "gemma4", "generic"];

impl ReasoningParser {
    /// The parser `name` names; an error listing the names otherwise.
    pub fn parse(name: &str) -> Result<Self, String> {
        match name {
            "deepseek_r1" => Ok(Self::DeepSeekR1),
            "qwen3" => Ok(Self::Qwen3),
            "openai_gptoss" => Ok(Self::Harmony),
            "gemma4" => Ok(Self::Gemma4),
            other => Err(format!(
                "unknown reasoning parser {other:?} (known: {})",
                REASONING_PARSERS.join(", ")
            )),
        }
    }

    /// The parser a chat template implies: `openai_gptoss` where it writes harmony
    /// channels, `gemma4` where it writes Gemma 4's, `qwen3` where it takes
    /// `enable_thinking`, `deepseek_r1` where its generation prompt opens `<think>`, none
    /// otherwise.
    pub fn default_for_template(template: Option<&str>) -> Option<Self> {
        let template = template?;
        if template.contains(gemma4::CHANNEL) && template.contains(gemma4::END) {
            Some(Self::Gemma4)
        } else if template.contains("<|channel|>") && template.contains("<|message|>") {
            Some(Self::Harmony)
        } else if template.contains("enable_thinking") && template.contains("<think>") {
            Some(Self::Qwen3)
        } else if template.contains("<think>\\n'") || template.contains("<think>\\n\"") {
            Some(Self::DeepSeekR1)
        } else {
            None
        }
    }

    /// A generic parser for thinking between `start` and `end` (kept for the server's
    /// life); an error when either is empty or they are equal.
    pub fn generic(start: &str, end: &str) -> Result<Self, String> {
        if start.is_empty() || end.is_empty() || start == end {
            return Err(
                "the generic reasoning parser needs two different, non-empty strings \
                        (--reasoning-start and --reasoning-end)"
                    .into(),
            );
        }
        let most = engine::constraint::MAX_THINKING_MARKER_BYTES;
        if start.len() > most || end.len() > most {
            return Err(format!(
                "--reasoning-start and --reasoning-end are at most {most} bytes"
            ));
        }
        Ok(Self::Generic {
            start: Box::leak(start.into()),
            end: Box::leak(end.into()),
        })
    }

    /// Its start and end strings.
    pub fn markers(self) -> (&'static str, &'static str) {
        match self {
            Self::Generic { start, end } => (start, end),
            Self::DeepSeekR1 | Self::Qwen3 => ("<think>", "</think>"),
            Self::Harmony => ("<|channel|>analysis<|message|>", harmony::END),
            Self::Gemma4 => (gemma4::START, gemma4::END),
        }
    }

    /// What one answer is read with, given the rendered prompt it continues.
    pub fn for_prompt(self, prompt: &str) -> Reasoning {
        let (start, end) = self.markers();
        // The prompt ends inside a thinking block it opened itself.
        let opened = prompt
            .rfind(start)
            .is_some_and(|at| !prompt[at..].contains(end));
        Reasoning {
            parser: self,
            opened,
        }
    }
}

/// How one request's answers are split: the parser and whether its prompt opened thinking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reasoning {
    /// The format.
    pub parser: ReasoningParser,
    /// The rendered prompt ends inside a thinking block.
    pub opened: bool,
}

impl Reasoning {
    /// The thinking phase the engine follows for this answer, with at most `budget`
    /// thinking tokens: the output thinks from its first token where the parser reads it
    /// so, else it may open thinking with the start string.
    pub fn thinking(self, budget: Option<usize>) -> ThinkingSpec {
        let (start, end) = self.parser.markers();
        let thinking_first = self.opened || self.parser == ReasoningParser::DeepSeekR1;
        ThinkingSpec {
            start: (!thinking_first).then(|| start.to_string()),
            end: end.to_string(),
            budget,
        }
    }

    /// A splitter for one answer.
    pub fn splitter(self) -> Splitter {
        if self.parser == ReasoningParser::Harmony {
            return Splitter(Splitting::Harmony(HarmonySplitter::new()));
        }
        if self.parser == ReasoningParser::Gemma4 {
            return Splitter(Splitting::Gemma4(Gemma4Splitter::new(self.opened)));
        }
        let (start, end) = self.parser.markers();
        let thinking_first = self.opened || self.parser == ReasoningParser::DeepSeekR1;
        Splitter(Splitting::Marked(MarkedSplitter {
            start,
            end,
            state: State::Opening { thinking_first },
            held: String::new(),
            answer_started: false,
        }))
    }
}

/// `thinking_token_budget` as given: a non-negative integer, or none.
pub fn thinking_budget(value: Option<&serde_json::Value>) -> ApiResult<Option<usize>> {
    match value {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(|b| Some(usize::try_from(b).unwrap_or(usize::MAX)))
            .ok_or_else(|| {
                ApiError::invalid(
                    "thinking_token_budget",
                    "must be a non-negative integer (thinking tokens at most)",
                )
            }),
    }
}

/// A piece of a split answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Split {
    /// Thinking text.
    Thinking(String),
    /// Answer text.
    Answer(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nothing but blanks seen: the output may still open with the start string. Without
    /// it, the text is thinking when `thinking_first`, else the answer.
    Opening {
        thinking_first: bool,
    },
    Thinking,
    Answer,
}

/// One answer's text split into thinking and answer as it comes, as its parser reads it.
#[derive(Debug, Clone)]
pub struct Splitter(Splitting);

#[derive(Debug, Clone)]
enum Splitting {
    Marked(MarkedSplitter),
    Harmony(HarmonySplitter),
    Gemma4(Gemma4Splitter),
}

impl Splitter {
    /// The pieces `text` completes.
    pub fn push(&mut self, text: &str) -> Vec<Split> {
        match &mut self.0 {
            Splitting::Marked(s) => s.push(text),
            Splitting::Harmony(s) => s.push(text),
            Splitting::Gemma4(s) => s.push(text),
        }
    }

    /// What is still held, at the end of the answer.
    pub fn finish(&mut self) -> Vec<Split> {
        match &mut self.0 {
            Splitting::Marked(s) => s.finish(),
            Splitting::Harmony(s) => s.finish(),
            Splitting::Gemma4(s) => s.finish(),
        }
    }
}

/// Thinking between a start and an end string, split as it comes; a marker cut between two
/// pieces of text is held until it is whole. Blanks that open the answer are dropped.
#[derive(Debug, Clone)]
struct MarkedSplitter {
    start: &'static str,
    end: &'static str,
    state: State,
    held: String,
    answer_started: bool,
}

/// The longest tail of `text` that is a proper prefix of `marker`.
fn marker_tail(text: &str, marker: &str) -> usize {
    (1..marker.len())
        .rev()
        .find(|&n| text.ends_with(&marker[..n]))
        .unwrap_or(0)
}

impl MarkedSplitter {
    /// The pieces `text` completes.
    fn push(&mut self, text: &str) -> Vec<Split> {
        self.held.push_str(text);
        let mut out = Vec::new();
        loop {
            match self.state {
                State::Opening { thinking_first } => {
                    let blanks = self.held.len() - self.held.trim_start().len();
                    let rest = &self.held[blanks..];
                    if rest.starts_with(self.start) {
                        self.held.drain(..blanks + self.start.len());
                        self.state = State::Thinking;
                    } else if self.start.starts_with(rest) {
                        // Blank, or a beginning of the start string: wait.
                        break;
                    } else {
                        self.state = if thinking_first {
                            State::Thinking
                        } else {
                            State::Answer
                        };
                    }
                }
                State::Thinking => match self.held.find(self.end) {
                    Some(at) => {
                        let thought: String = self.held.drain(..at).collect();
                        self.held.drain(..self.end.len());
                        if !thought.is_empty() {
                            out.push(Split::Thinking(thought));
                        }
                        self.state = State::Answer;
                    }
                    None => {
                        let cut = self.held.len() - marker_tail(&self.held, self.end);
                        if cut > 0 {
                            out.push(Split::Thinking(self.held.drain(..cut).collect()));
                        }
                        break;
                    }
                },
                State::Answer => {
                    self.answer(&mut out);
                    break;
                }
            }
        }
        out
    }

    /// The answer text held, blanks that open the answer dropped.
    fn answer(&mut self, out: &mut Vec<Split>) {
        if !self.answer_started {
            let blanks = self.held.len() - self.held.trim_start().len();
            self.held.drain(..blanks);
            if self.held.is_empty() {
                return;
            }
            self.answer_started = true;
        }
        if !self.held.is_empty() {
            out.push(Split::Answer(std::mem::take(&mut self.held)));
        }
    }

    /// What is still held, at the end of the answer: an unfinished marker is text.
    fn finish(&mut self) -> Vec<Split> {
        let mut out = Vec::new();
        match self.state {
            State::Opening { thinking_first } if thinking_first => {
                let text = std::mem::take(&mut self.held);
                if !text.trim().is_empty() {
                    out.push(Split::Thinking(text));
                }
            }
            State::Thinking => {
                let text = std::mem::take(&mut self.held);
                if !text.is_empty() {
                    out.push(Split::Thinking(text));
                }
            }
            State::Opening { .. } | State::Answer => self.answer(&mut out),
        }
        out
    }
}

/// `text` split whole: the thinking (`None` when there was none) and the answer.
pub fn split_whole(reasoning: Reasoning, text: &str) -> (Option<String>, String) {
    let mut splitter = reasoning.splitter();
    let mut pieces = splitter.push(text);
    pieces.extend(splitter.finish());
    let (mut thinking, mut answer) = (None::<String>, String::new());
    for piece in pieces {
        match piece {
            Split::Thinking(t) => thinking.get_or_insert_with(String::new).push_str(&t),
            Split::Answer(a) => answer.push_str(&a),
        }
    }
    (thinking, answer)
}

impl Reasoning {
    /// How many of `ids` (one answer's tokens) are thinking: none when the answer did not
    /// think, all when its thinking never ended, else those before the end string (the
    /// shortest prefix whose text holds it, less the end string's own tokens).
    pub fn reasoning_tokens(self, tokenizer: &engine::ModelTokenizer, ids: &[u32]) -> usize {
        let holds_end = |n: usize| {
            tokenizer
                .decode(&ids[..n])
                .is_ok_and(|text| text.contains(self.parser.markers().1))
        };
        let Ok(text) = tokenizer.decode(ids) else {
            return 0;
        };
        if split_whole(self, &text).0.is_none() {
            return 0;
        }
        if !holds_end(ids.len()) {
            return ids.len();
        }
        // The shortest prefix holding the end string.
        let (mut lo, mut hi) = (0, ids.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            if holds_end(mid) {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        let end_tokens = tokenizer
            .encode_plain(self.parser.markers().1)
            .map_or(1, |e| e.len());
        lo.saturating_sub(end_tokens)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn a_generic_parser_splits_at_its_own_strings() {
        let parser = ReasoningParser::generic("<seed:think>", "</seed:think>").unwrap();
        let reasoning = parser.for_prompt("<|user|>hi<|assistant|>");
        let text = "<seed:think>a <think>b</seed:think>\n\nAnswer.";
        assert_eq!(
            split_whole(reasoning, text),
            (Some("a <think>b".to_string()), "Answer.".to_string())
        );
        // Read as qwen3 reads its own: without the start string, all answer.
        assert_eq!(
            split_whole(reasoning, "Answer."),
            (None, "Answer.".to_string())
        );
        let opened = parser.for_prompt("<|assistant|><seed:think>");
        assert_eq!(
            split_whole(opened, "hmm</seed:think>ok"),
            (Some("hmm".to_string()), "ok".to_string())
        );
        let spec = opened.thinking(Some(3));
        assert_eq!((spec.start, spec.end.as_str()), (None, "</seed:think>"));
        assert_eq!(
            reasoning.thinking(None).start.as_deref(),
            Some("<seed:think>")
        );
        let long = "x".repeat(65);
        for (start, end) in [("", "b"), ("a", ""), ("x", "x"), ("a", long.as_str())] {
            assert!(ReasoningParser::generic(start, end).is_err());
        }
    }

    #[test]
    fn templates_imply_their_parser() {
        let qwen3 = "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}";
        assert_eq!(
            ReasoningParser::default_for_template(Some(qwen3)),
            Some(ReasoningParser::Qwen3)
        );
        let r1 = "{% if add_generation_prompt %}{{'<｜Assistant｜><think>\\n'}}{% endif %}";
        assert_eq!(
            ReasoningParser::default_for_template(Some(r1)),
            Some(ReasoningParser::DeepSeekR1)
        );
        let chatml = "{% for m in messages %}<|im_start|>{{ m.content }}{% endfor %}";
        assert_eq!(ReasoningParser::default_for_template(Some(chatml)), None);
        assert_eq!(ReasoningParser::default_for_template(None), None);
    }

    fn r1() -> Reasoning {
        ReasoningParser::DeepSeekR1.for_prompt("<|User|>hi<|Assistant|>")
    }

    fn qwen3(prompt: &str) -> Reasoning {
        ReasoningParser::Qwen3.for_prompt(prompt)
    }

    /// `text` pushed in pieces cut at `cuts` (byte offsets on char boundaries).
    fn pushed(reasoning: Reasoning, text: &str, cuts: &[usize]) -> (Option<String>, String) {
        let mut splitter = reasoning.splitter();
        let mut pieces = Vec::new();
        let mut from = 0;
        for &cut in cuts.iter().chain(std::iter::once(&text.len())) {
            pieces.extend(splitter.push(&text[from..cut]));
            from = cut;
        }
        pieces.extend(splitter.finish());
        let (mut thinking, mut answer) = (None::<String>, String::new());
        for piece in pieces {
            match piece {
                Split::Thinking(t) => {
                    assert!(!t.is_empty());
                    thinking.get_or_insert_with(String::new).push_str(&t)
                }
                Split::Answer(a) => {
                    assert!(!a.is_empty());
                    answer.push_str(&a)
                }
            }
        }
        (thinking, answer)
    }

    /// The split must not depend on where the text is cut: every single cut and every pair.
    pub(crate) fn same_at_every_cut(reasoning: Reasoning, text: &str) -> (Option<String>, String) {
        let whole = split_whole(reasoning, text);
        let bounds: Vec<usize> = (1..text.len())
            .filter(|&i| text.is_char_boundary(i))
            .collect();
        for &a in &bounds {
            assert_eq!(
                pushed(reasoning, text, &[a]),
                whole,
                "cut at {a} of {text:?}"
            );
            for &b in bounds.iter().filter(|&&b| b > a) {
                assert_eq!(pushed(reasoning, text, &[a, b]), whole, "cuts {a}, {b}");
            }
        }
        let every: Vec<usize> = bounds.clone();
        assert_eq!(pushed(reasoning, text, &every), whole, "one char at a time");
        whole
    }

    #[test]
    fn r1_thinking_ends_at_the_end_string_with_or_without_the_start_string() {
        for text in [
            "<think>\nSum 2 and 2.\n</think>\n\nIt is 4.",
            "\nSum 2 and 2.\n</think>\n\nIt is 4.",
        ] {
            let (thinking, answer) = same_at_every_cut(r1(), text);
            assert_eq!(thinking.as_deref(), Some("\nSum 2 and 2.\n"), "{text:?}");
            assert_eq!(answer, "It is 4.");
        }
    }

    #[test]
    fn thinking_that_never_ends_is_all_thinking() {
        let (thinking, answer) = same_at_every_cut(r1(), "<think>Still going, and go");
        assert_eq!(thinking.as_deref(), Some("Still going, and go"));
        assert_eq!(answer, "");
        // A cut-off end string is thinking text too.
        let (thinking, answer) = same_at_every_cut(r1(), "<think>almost</thi");
        assert_eq!(thinking.as_deref(), Some("almost</thi"));
        assert_eq!(answer, "");
    }

    #[test]
    fn an_end_string_inside_the_answer_stays_in_the_answer() {
        let (thinking, answer) = same_at_every_cut(r1(), "a</think>b</think>c");
        assert_eq!(thinking.as_deref(), Some("a"));
        assert_eq!(answer, "b</think>c");
    }

    #[test]
    fn a_tool_call_inside_the_thinking_is_thinking() {
        let text = "<think><tool_call>{\"name\": \"f\"}</tool_call></think>Done.";
        let (thinking, answer) = same_at_every_cut(r1(), text);
        assert_eq!(
            thinking.as_deref(),
            Some("<tool_call>{\"name\": \"f\"}</tool_call>")
        );
        assert_eq!(answer, "Done.");
    }

    #[test]
    fn qwen3_thinks_only_when_the_output_or_the_prompt_opens_it() {
        let plain = qwen3("<|im_start|>assistant\n");
        assert!(!plain.opened);
        let (thinking, answer) = same_at_every_cut(plain, "<think>\nhm\n</think>\n\nYes.");
        assert_eq!(thinking.as_deref(), Some("\nhm\n"));
        assert_eq!(answer, "Yes.");
        // Thinking turned off: no start string, the whole output is the answer, an end
        // string in it too.
        let (thinking, answer) = same_at_every_cut(plain, "Yes. </think> no");
        assert_eq!(thinking, None);
        assert_eq!(answer, "Yes. </think> no");
        // The prompt opened the block (a template that starts the thinking itself).
        let opened = qwen3("<|im_start|>assistant\n<think>\n");
        assert!(opened.opened);
        let (thinking, answer) = same_at_every_cut(opened, "hm</think>Yes.");
        assert_eq!(thinking.as_deref(), Some("hm"));
        assert_eq!(answer, "Yes.");
        // A closed block earlier in the prompt opens nothing.
        assert!(!qwen3("<think>a</think><|im_start|>assistant\n").opened);
    }

    #[test]
    fn an_empty_or_blank_output_has_no_thinking_and_no_answer() {
        for reasoning in [r1(), qwen3("")] {
            assert_eq!(split_whole(reasoning, ""), (None, String::new()));
            assert_eq!(split_whole(reasoning, "  \n"), (None, String::new()));
        }
        // An empty thinking block.
        let (thinking, answer) = same_at_every_cut(qwen3(""), "<think></think>ok");
        assert_eq!(thinking, None);
        assert_eq!(answer, "ok");
    }

    #[test]
    fn multibyte_text_splits_on_its_own_boundaries() {
        let text = "<think>état — 思考</think>réponse ✓";
        let (thinking, answer) = same_at_every_cut(r1(), text);
        assert_eq!(thinking.as_deref(), Some("état — 思考"));
        assert_eq!(answer, "réponse ✓");
    }

    #[test]
    fn unknown_names_are_refused_with_the_known_ones() {
        assert_eq!(
            ReasoningParser::parse("deepseek_r1"),
            Ok(ReasoningParser::DeepSeekR1)
        );
        let e = ReasoningParser::parse("r1").unwrap_err();
        assert!(
            e.contains("\"r1\"") && e.contains("deepseek_r1, qwen3"),
            "{e}"
        );
    }
}
