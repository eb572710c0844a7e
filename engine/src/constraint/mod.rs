//! Constrained decoding. A request may ask that its output follow a format
//! ([`ConstraintSpec`]: any JSON object, a JSON schema, a regular expression, a Lark
//! grammar); each of its sequences then carries a [`Constraint`] that says which tokens may
//! come next and follows the tokens chosen. The engine masks every sampled row with it, so
//! the sampled distribution is the model's, restricted to what the format allows.
//!
//! [`Grammars`] compiles specs with llguidance (the grammar engine behind llama.cpp's and
//! vLLM's guidance backends) over the model's own token bytes. A new kind of constraint is a
//! new type behind [`Constraint`].

mod guidance;
mod thinking;

pub use guidance::{compact, Grammars};
pub use thinking::{ThinkingConstraint, ThinkingSpec, MAX_THINKING_MARKER_BYTES};

use crate::Result;

/// A format the output must follow.
#[derive(Debug, Clone, PartialEq)]
pub enum ConstraintSpec {
    /// Any JSON object (`response_format: {"type": "json_object"}`).
    JsonObject,
    /// A value valid against this JSON schema (`response_format: {"type": "json_schema"}`).
    JsonSchema(serde_json::Value),
    /// Text matching this regular expression.
    Regex(String),
    /// Text in the language of this Lark grammar.
    Lark(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// Text in the language of the Lark grammar `frame`, where its `@inner` stands for text
    /// in the language of `inner` (itself not framed): the header a format such as gpt-oss's
    /// harmony writes around an answer that `inner` constrains.
    Framed {
        /// The Lark grammar around the inner format, referring to it as `@inner`.
        frame: String,
        /// The format inside.
        inner: Box<ConstraintSpec>,
    },
}

/// The tokens allowed next, one bit per token of the model's vocabulary (bit `t % 32` of
/// word `t / 32`, the layout llguidance's masks have).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenMask {
    words: Vec<u32>,
    len: usize,
}

impl TokenMask {
    /// A mask of `len` tokens allowing those for which `allowed` is true.
    pub fn from_fn(len: usize, allowed: impl Fn(u32) -> bool) -> Self {
        let mut words = vec![0u32; len.div_ceil(32)];
        for token in 0..len {
            if allowed(token as u32) {
                words[token / 32] |= 1 << (token % 32);
            }
        }
        Self { words, len }
    }

    /// A mask of `len` tokens from bit words (missing words allow nothing; bits past `len`
    /// are ignored).
    pub fn from_words(len: usize, bits: &[u32]) -> Self {
        let mut words = vec![0u32; len.div_ceil(32)];
        for (word, &b) in words.iter_mut().zip(bits) {
            *word = b;
        }
        if !len.is_multiple_of(32) {
            if let Some(last) = words.last_mut() {
                *last &= (1u32 << (len % 32)) - 1;
            }
        }
        Self { words, len }
    }

    /// Whether `token` is allowed.
    pub fn allows(&self, token: u32) -> bool {
        let t = token as usize;
        t < self.len && self.words[t / 32] & (1 << (t % 32)) != 0
    }

    /// Allows `token` too (a token past the mask's length stays disallowed).
    pub fn allow(&mut self, token: u32) {
        let t = token as usize;
        if t < self.len {
            self.words[t / 32] |= 1 << (t % 32);
        }
    }

    /// Disallows `token`.
    pub fn forbid(&mut self, token: u32) {
        let t = token as usize;
        if t < self.len {
            self.words[t / 32] &= !(1 << (t % 32));
        }
    }

    /// Tokens allowed.
    pub fn count(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// The one token allowed, when exactly one is.
    pub fn single(&self) -> Option<u32> {
        if self.count() != 1 {
            return None;
        }
        let (index, word) = self.words.iter().enumerate().find(|(_, w)| **w != 0)?;
        Some((index * 32) as u32 + word.trailing_zeros())
    }

    /// Sets every disallowed logit of `row` to minus infinity.
    pub fn apply(&self, row: &mut [f32]) {
        for (chunk, &word) in row.chunks_mut(32).zip(&self.words) {
            if word == u32::MAX {
                continue;
            }
            for (bit, logit) in chunk.iter_mut().enumerate() {
                if word & (1 << bit) == 0 {
                    *logit = f32::NEG_INFINITY;
                }
            }
        }
        let covered = self.words.len() * 32;
        for logit in row.iter_mut().skip(covered) {
            *logit = f32::NEG_INFINITY;
        }
    }
}

/// One sequence's constraint: what may come next, given the output so far.
pub trait Constraint: Send {
    /// The tokens allowed next; an end token is among them once the output may end, and
    /// is the only one once it must.
    fn mask(&mut self) -> Result<TokenMask>;
    /// The output grew by `token` (one the last mask allowed).
    fn advance(&mut self, token: u32) -> Result<()>;
    /// How many of `tokens`, in order, the format allows next; the state does not change.
    fn allowed_prefix(&mut self, tokens: &[u32]) -> Result<usize>;
    /// The tokens allowed after `tokens` (which it allows); the state does not change.
    fn mask_after(&mut self, tokens: &[u32]) -> Result<TokenMask>;
    /// The same constraint in the same state, for a sample forked from this one.
    fn fork(&self) -> Box<dyn Constraint>;
    /// About how many tokens the format forces next, 0 when the next one is free (for the
    /// draft planner, which grants room for them; the constraint stage then feeds exactly
    /// the forced tokens).
    fn forced_estimate(&mut self) -> usize {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mask_allows_what_it_was_built_with_and_masks_the_rest() {
        let mask = TokenMask::from_fn(130, |t| t % 3 == 0 || t == 128);
        assert!(mask.allows(0) && mask.allows(128) && mask.allows(63));
        assert!(!mask.allows(1) && !mask.allows(127) && !mask.allows(130));
        assert_eq!(mask.count(), 44 + 1);
        let mut row = vec![1.0f32; 140];
        mask.apply(&mut row);
        assert_eq!(row[3], 1.0);
        assert_eq!(row[4], f32::NEG_INFINITY);
        assert_eq!(
            row[135],
            f32::NEG_INFINITY,
            "past the mask nothing is allowed"
        );
        let words: Vec<u32> = (0..5).map(|w| mask.words[w]).collect();
        assert_eq!(TokenMask::from_words(130, &words), mask);
        // Bits past the length are dropped; missing words allow nothing.
        assert_eq!(TokenMask::from_words(3, &[u32::MAX]).count(), 3);
        assert_eq!(TokenMask::from_words(64, &[1]).count(), 1);
        assert_eq!(TokenMask::from_words(64, &[0, 1 << 5]).single(), Some(37));
        assert_eq!(mask.single(), None);
        assert_eq!(TokenMask::from_words(64, &[]).single(), None);
    }
}
