//! Turning a growing list of output tokens into text that is safe to show as it arrives.
//! [`IncrementalDetokenizer`] decodes a small window of recent tokens and releases text only
//! when it does not end in an incomplete UTF-8 character (U+FFFD), so a character split
//! across tokens is never emitted broken. [`StopStringFilter`] holds back just enough text
//! to recognise a stop string spanning tokens, and cuts the text where one starts (the stop
//! string itself is never emitted).

use crate::model::tokenizer::ModelTokenizer;
use crate::Result;

/// Decodes output tokens incrementally (special tokens skipped, unless asked to keep them).
#[derive(Debug, Clone, Default)]
pub struct IncrementalDetokenizer {
    tokens: Vec<u32>,
    keep_special: bool,
    /// Start of the window whose text was already released up to `read_offset`.
    prefix_offset: usize,
    read_offset: usize,
}

impl IncrementalDetokenizer {
    /// An empty detokenizer.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty detokenizer that writes special tokens as their text.
    pub fn keeping_special_tokens() -> Self {
        Self {
            keep_special: true,
            ..Self::default()
        }
    }

    fn decode(&self, tokenizer: &ModelTokenizer, ids: &[u32]) -> Result<String> {
        if self.keep_special {
            tokenizer.decode(ids)
        } else {
            tokenizer.decode_skip_special(ids)
        }
    }

    /// Adds one token and returns the text it completes (possibly empty).
    pub fn push(&mut self, tokenizer: &ModelTokenizer, token: u32) -> Result<String> {
        self.tokens.push(token);
        let prefix = self.decode(
            tokenizer,
            &self.tokens[self.prefix_offset..self.read_offset],
        )?;
        let full = self.decode(tokenizer, &self.tokens[self.prefix_offset..])?;
        if full.len() > prefix.len() && !full.ends_with('\u{FFFD}') {
            if let Some(delta) = full.get(prefix.len()..) {
                let delta = delta.to_string();
                self.prefix_offset = self.read_offset;
                self.read_offset = self.tokens.len();
                return Ok(delta);
            }
        }
        Ok(String::new())
    }

    /// Whether every token pushed so far has had its text released (none waits for the
    /// rest of a character).
    pub fn settled(&self) -> bool {
        self.read_offset == self.tokens.len()
    }

    /// Text of the tokens not yet released (at the end of the sample; may hold U+FFFD when
    /// the sample ended inside a character).
    pub fn flush(&mut self, tokenizer: &ModelTokenizer) -> Result<String> {
        let prefix = self.decode(
            tokenizer,
            &self.tokens[self.prefix_offset..self.read_offset],
        )?;
        let full = self.decode(tokenizer, &self.tokens[self.prefix_offset..])?;
        self.prefix_offset = self.tokens.len();
        self.read_offset = self.tokens.len();
        Ok(full.get(prefix.len()..).unwrap_or_default().to_string())
    }
}

/// Holds back the tail of the text that could be the start of a stop string. Under an
/// output format, a stop string counts only where the text before it is a complete output
/// of the format (a place marked with [`StopStringFilter::mark_complete`]); elsewhere (inside
/// a JSON string, say) it is text like any other.
#[derive(Debug, Clone, Default)]
pub struct StopStringFilter {
    stops: Vec<String>,
    held: String,
    hold_bytes: usize,
    /// Bytes of text returned so far.
    released: usize,
    /// Under a format: the text offsets (from the start of the output) at which it was
    /// complete, those still within the held text.
    complete: Option<Vec<usize>>,
}

impl StopStringFilter {
    /// A filter for `stops` (none: text passes straight through).
    pub fn new(stops: &[String]) -> Self {
        let longest = stops.iter().map(String::len).max().unwrap_or(0);
        Self {
            stops: stops.to_vec(),
            held: String::new(),
            hold_bytes: longest.saturating_sub(1),
            released: 0,
            complete: None,
        }
    }

    /// A filter for `stops` in an output under a format: a stop string counts only where
    /// the output was marked complete right before it.
    pub fn under_format(stops: &[String]) -> Self {
        Self {
            complete: Some(Vec::new()),
            ..Self::new(stops)
        }
    }

    /// The output is complete after the text pushed so far.
    pub fn mark_complete(&mut self) {
        let at = self.released + self.held.len();
        if let Some(complete) = self.complete.as_mut() {
            if complete.last() != Some(&at) {
                complete.push(at);
            }
        }
    }

    /// Whether a stop string starting at `at` (an offset into the held text) counts.
    fn counts_at(&self, at: usize) -> bool {
        self.complete
            .as_ref()
            .is_none_or(|c| c.contains(&(self.released + at)))
    }

    /// Adds text; returns what may be shown now and, when a stop string appeared, which one
    /// (the returned text then ends right before it, and the filter is done).
    pub fn push(&mut self, text: &str) -> (String, Option<String>) {
        if self.stops.is_empty() {
            return (text.to_string(), None);
        }
        self.held.push_str(text);
        let first = self
            .stops
            .iter()
            .flat_map(|s| {
                self.held
                    .match_indices(s.as_str())
                    .map(move |(at, _)| (at, s))
            })
            .filter(|&(at, _)| self.counts_at(at))
            .min_by_key(|&(at, _)| at);
        if let Some((at, stop)) = first {
            let stop = stop.clone();
            let shown = self.held[..at].to_string();
            self.held.clear();
            return (shown, Some(stop));
        }
        let mut cut = self.held.len().saturating_sub(self.hold_bytes);
        while !self.held.is_char_boundary(cut) {
            cut -= 1;
        }
        let rest = self.held.split_off(cut);
        let shown = std::mem::replace(&mut self.held, rest);
        self.released += shown.len();
        let released = self.released;
        if let Some(complete) = self.complete.as_mut() {
            complete.retain(|&at| at >= released);
        }
        (shown, None)
    }

    /// Everything still held (the sample ended without a stop string).
    pub fn flush(&mut self) -> String {
        let rest = std::mem::take(&mut self.held);
        self.released += rest.len();
        rest
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_string_spanning_pushes_is_cut_and_never_shown() {
        let mut f = StopStringFilter::new(&["END".to_string(), "\n\n".to_string()]);
        let mut shown = String::new();
        let mut stopped = None;
        for piece in ["Hello", " wor", "ld E", "N", "D and more"] {
            let (text, stop) = f.push(piece);
            shown.push_str(&text);
            assert!(
                !shown.contains('E') || shown.ends_with("world "),
                "{shown:?}"
            );
            if stop.is_some() {
                stopped = stop;
                break;
            }
        }
        assert_eq!(shown, "Hello world ");
        assert_eq!(stopped.as_deref(), Some("END"));
    }

    #[test]
    fn held_text_is_released_on_flush_and_respects_char_boundaries() {
        let mut f = StopStringFilter::new(&["xyz".to_string()]);
        let (text, stop) = f.push("héé");
        assert_eq!(stop, None);
        // Two bytes are held back, which here is the whole last 'é'.
        assert_eq!(text, "hé");
        assert_eq!(f.flush(), "é");
        let mut none = StopStringFilter::new(&[]);
        assert_eq!(none.push("abc"), ("abc".to_string(), None));
    }

    #[test]
    fn under_a_format_a_stop_string_counts_only_after_a_complete_output() {
        let mut f = StopStringFilter::under_format(&["}".to_string(), "END".to_string()]);
        let mut shown = String::new();
        // `{"a": "}` is not complete: its `}` is text. `{"a": "}"}` is, and `END` after it
        // stops the output; so would a `}` written there.
        for (piece, complete) in [("{\"a\": \"", false), ("}", false), ("\"}", true)] {
            let (text, stop) = f.push(piece);
            assert_eq!(stop, None, "{piece}");
            shown.push_str(&text);
            if complete {
                f.mark_complete();
            }
        }
        let (text, stop) = f.push(" EN");
        assert_eq!(stop, None);
        shown.push_str(&text);
        let (text, stop) = f.push("D more");
        assert_eq!(
            stop, None,
            "a stop after text that was never complete does not count"
        );
        shown.push_str(&text);
        shown.push_str(&f.flush());
        assert_eq!(shown, "{\"a\": \"}\"} END more");

        let mut f = StopStringFilter::under_format(&["END".to_string()]);
        let (mut shown, _) = f.push("{}");
        f.mark_complete();
        let (text, stop) = f.push("END");
        shown.push_str(&text);
        assert_eq!((shown.as_str(), stop.as_deref()), ("{}", Some("END")));
    }
}
