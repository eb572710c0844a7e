//! A thinking phase before the answer. A reasoning model writes its thinking between a
//! start and an end string (`<think>`, `</think>`) and then answers; [`ThinkingConstraint`]
//! follows the output through those phases, so that a thinking budget ends the thinking (once
//! that many thinking tokens are out, the end string's tokens are the only ones allowed, one
//! after another) and the request's own format ([`super::ConstraintSpec`]) applies to the
//! answer alone: the inner constraint sees the first token after the thinking as its first.
//! While a format waits for the answer, the model may not end its output inside the thinking.
//! The thinking's end is found in the output's bytes, however the model spelled it in
//! tokens; the start is the start string's own tokens (a model's `<think>` is one token).

use std::sync::Arc;

use super::{Constraint, TokenMask};
use crate::Result;

/// A thinking phase the output goes through before its answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThinkingSpec {
    /// The string that opens thinking, when the output may open it itself; `None` when
    /// the output is thinking from its first token (the prompt opened it).
    pub start: Option<String>,
    /// The string that ends thinking.
    pub end: String,
    /// Thinking tokens at most; the end string is forced after them.
    pub budget: Option<usize>,
}

/// Longest start or end string, in bytes.
pub const MAX_THINKING_MARKER_BYTES: usize = 64;

/// What a thinking constraint reads tokens with: their bytes, the vocabulary, the end tokens.
#[derive(Debug)]
pub(crate) struct TokenBytes {
    /// Bytes of each token (special tokens by their text).
    pub bytes: Vec<Box<[u8]>>,
    /// Rows per mask.
    pub vocab: usize,
    /// The engine's end tokens.
    pub ends: Arc<[u32]>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    /// The output may open thinking; this many of the start's tokens are out.
    Opening(usize),
    /// Thinking: this many tokens so far, and the last bytes (to find the end string in).
    Thinking { count: usize, tail: Vec<u8> },
    /// The budget is spent: this many of the end string's tokens are forced out so far.
    Forcing(usize),
    /// The answer.
    Answer,
}

/// The output's phase, with the request's format for the answer.
pub struct ThinkingConstraint {
    tokens: Arc<TokenBytes>,
    start: Arc<[u32]>,
    end_ids: Arc<[u32]>,
    end: Arc<[u8]>,
    budget: Option<usize>,
    inner: Option<Box<dyn Constraint>>,
    phase: Phase,
}

impl ThinkingConstraint {
    /// A constraint for `spec`, whose start and end strings are `start` and `end_ids` in
    /// tokens, with `inner` applying to the answer.
    pub(crate) fn new(
        tokens: Arc<TokenBytes>,
        spec: &ThinkingSpec,
        start: Vec<u32>,
        end_ids: Vec<u32>,
        inner: Option<Box<dyn Constraint>>,
    ) -> Self {
        let mut constraint = Self {
            tokens,
            start: start.into(),
            end_ids: end_ids.into(),
            end: spec.end.as_bytes().into(),
            budget: spec.budget,
            inner,
            phase: Phase::Answer,
        };
        constraint.phase = match spec.start {
            Some(_) if !constraint.start.is_empty() => Phase::Opening(0),
            _ => constraint.thinking(0, Vec::new()),
        };
        constraint
    }

    /// Thinking after `count` tokens, or forcing the end once the budget is spent (from
    /// where the thinking's last tokens already began it, if they did).
    fn thinking(&self, count: usize, tail: Vec<u8>) -> Phase {
        if self.budget.is_some_and(|b| count >= b) {
            let begun = (1..self.end_ids.len()).rev().find(|&k| {
                let bytes: Vec<u8> = self.end_ids[..k]
                    .iter()
                    .flat_map(|&t| self.token_bytes(t).iter().copied())
                    .collect();
                tail.ends_with(&bytes)
            });
            self.forcing(begun.unwrap_or(0))
        } else {
            Phase::Thinking { count, tail }
        }
    }

    fn token_bytes(&self, token: u32) -> &[u8] {
        self.tokens
            .bytes
            .get(token as usize)
            .map_or(&[][..], |b| &b[..])
    }

    fn forcing(&self, done: usize) -> Phase {
        if done >= self.end_ids.len() {
            Phase::Answer
        } else {
            Phase::Forcing(done)
        }
    }

    /// The phase after `token` from `phase`, and whether `token` is the answer's (then the
    /// inner constraint reads it).
    fn step(&self, phase: &Phase, token: u32) -> (Phase, bool) {
        match phase {
            Phase::Opening(done) => {
                if self.start.get(*done) == Some(&token) {
                    if done + 1 == self.start.len() {
                        (self.thinking(0, Vec::new()), false)
                    } else {
                        (Phase::Opening(done + 1), false)
                    }
                } else {
                    (Phase::Answer, true)
                }
            }
            Phase::Thinking { count, tail } => {
                let mut tail = tail.clone();
                tail.extend_from_slice(self.token_bytes(token));
                if contains(&tail, &self.end) {
                    return (Phase::Answer, false);
                }
                let keep = self.end.len().saturating_sub(1);
                if tail.len() > keep {
                    tail.drain(..tail.len() - keep);
                }
                (self.thinking(count + 1, tail), false)
            }
            Phase::Forcing(done) => (self.forcing(done + 1), false),
            Phase::Answer => (Phase::Answer, true),
        }
    }

    /// Whether `phase` lets `token` come next (the answer's tokens are the inner
    /// constraint's to judge).
    fn allows(&self, phase: &Phase, token: u32) -> bool {
        match phase {
            Phase::Opening(0) | Phase::Answer => true,
            Phase::Opening(done) => self.inner.is_none() || self.start.get(*done) == Some(&token),
            Phase::Thinking { .. } => self.inner.is_none() || !self.tokens.ends.contains(&token),
            Phase::Forcing(done) => self.end_ids.get(*done) == Some(&token),
        }
    }

    /// Every token allowed, or every token but the ends.
    fn all(&self, but_ends: bool) -> TokenMask {
        let words = vec![u32::MAX; self.tokens.vocab.div_ceil(32)];
        let mut mask = TokenMask::from_words(self.tokens.vocab, &words);
        if but_ends {
            for &end in self.tokens.ends.iter() {
                mask.forbid(end);
            }
        }
        mask
    }

    /// The mask of `phase`, the answer's tokens so far being `answer` (which the inner
    /// constraint allows).
    fn mask_in(&mut self, phase: &Phase, answer: &[u32]) -> Result<TokenMask> {
        match phase {
            Phase::Answer => match self.inner.as_mut() {
                Some(inner) => inner.mask_after(answer),
                None => Ok(self.all(false)),
            },
            Phase::Opening(done) => match (self.inner.as_mut(), self.start.get(*done)) {
                (Some(inner), Some(&next)) if *done == 0 => {
                    let mut mask = inner.mask()?;
                    mask.allow(next);
                    Ok(mask)
                }
                (Some(_), Some(&next)) => Ok(TokenMask::from_fn(self.tokens.vocab, |t| t == next)),
                _ => Ok(self.all(false)),
            },
            Phase::Thinking { .. } => Ok(self.all(self.inner.is_some())),
            Phase::Forcing(done) => {
                let next = self.end_ids[*done];
                Ok(TokenMask::from_fn(self.tokens.vocab, |t| t == next))
            }
        }
    }

    /// The phase after `tokens` and the answer's part of them (all allowed).
    fn walk(&self, tokens: &[u32]) -> (Phase, usize) {
        let mut phase = self.phase.clone();
        for (at, &token) in tokens.iter().enumerate() {
            let (next, answer) = self.step(&phase, token);
            if answer {
                return (Phase::Answer, at);
            }
            phase = next;
        }
        (phase, tokens.len())
    }
}

/// Whether `bytes` holds `needle`.
fn contains(bytes: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && bytes.windows(needle.len()).any(|w| w == needle)
}

impl Constraint for ThinkingConstraint {
    fn mask(&mut self) -> Result<TokenMask> {
        let phase = self.phase.clone();
        self.mask_in(&phase, &[])
    }

    fn advance(&mut self, token: u32) -> Result<()> {
        let (next, answer) = self.step(&self.phase, token);
        self.phase = next;
        match (answer, self.inner.as_mut()) {
            (true, Some(inner)) => inner.advance(token),
            _ => Ok(()),
        }
    }

    fn allowed_prefix(&mut self, tokens: &[u32]) -> Result<usize> {
        let mut phase = self.phase.clone();
        for (at, &token) in tokens.iter().enumerate() {
            if !self.allows(&phase, token) {
                return Ok(at);
            }
            let (next, answer) = self.step(&phase, token);
            if answer {
                let rest = &tokens[at..];
                let allowed = match self.inner.as_mut() {
                    Some(inner) => inner.allowed_prefix(rest)?,
                    None => rest.len(),
                };
                return Ok(at + allowed);
            }
            phase = next;
        }
        Ok(tokens.len())
    }

    fn mask_after(&mut self, tokens: &[u32]) -> Result<TokenMask> {
        let (phase, from) = self.walk(tokens);
        self.mask_in(&phase, &tokens[from..])
    }

    fn fork(&self) -> Box<dyn Constraint> {
        Box::new(Self {
            tokens: Arc::clone(&self.tokens),
            start: Arc::clone(&self.start),
            end_ids: Arc::clone(&self.end_ids),
            end: Arc::clone(&self.end),
            budget: self.budget,
            inner: self.inner.as_ref().map(|inner| inner.fork()),
            phase: self.phase.clone(),
        })
    }

    fn forced_estimate(&mut self) -> usize {
        match &self.phase {
            Phase::Forcing(done) => self.end_ids.len() - done,
            Phase::Answer => self
                .inner
                .as_mut()
                .map_or(0, |inner| inner.forced_estimate()),
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tokens: 0 `a`, 1 `b`, 2 `</`, 3 `think>`, 4 `<think>`, 5 `{`, 6 `}`, 7 the end,
    /// 8 `x</think>y`.
    fn table() -> Arc<TokenBytes> {
        let words = [
            "a",
            "b",
            "</",
            "think>",
            "<think>",
            "{",
            "}",
            "",
            "x</think>y",
        ];
        Arc::new(TokenBytes {
            bytes: words.iter().map(|w| w.as_bytes().into()).collect(),
            vocab: words.len(),
            ends: Arc::from(vec![7u32]),
        })
    }

    /// `{`, then `}`, then the end: the answer's format.
    #[derive(Clone)]
    struct Braces(usize);

    impl Braces {
        fn next(at: usize) -> u32 {
            [5, 6, 7].get(at).copied().unwrap_or(7)
        }
    }

    impl Constraint for Braces {
        fn mask(&mut self) -> Result<TokenMask> {
            let next = Self::next(self.0);
            Ok(TokenMask::from_fn(9, |t| t == next))
        }
        fn advance(&mut self, token: u32) -> Result<()> {
            assert_eq!(token, Self::next(self.0), "the format allowed it");
            self.0 += 1;
            Ok(())
        }
        fn allowed_prefix(&mut self, tokens: &[u32]) -> Result<usize> {
            Ok(tokens
                .iter()
                .enumerate()
                .take_while(|&(i, &t)| t == Self::next(self.0 + i))
                .count())
        }
        fn mask_after(&mut self, tokens: &[u32]) -> Result<TokenMask> {
            let next = Self::next(self.0 + tokens.len());
            Ok(TokenMask::from_fn(9, |t| t == next))
        }
        fn fork(&self) -> Box<dyn Constraint> {
            Box::new(self.clone())
        }
    }

    fn spec(start: Option<&str>, budget: Option<usize>) -> ThinkingSpec {
        ThinkingSpec {
            start: start.map(str::to_string),
            end: "</think>".into(),
            budget,
        }
    }

    fn constraint(start: Option<&str>, budget: Option<usize>, braces: bool) -> ThinkingConstraint {
        let inner: Option<Box<dyn Constraint>> = braces.then(|| Box::new(Braces(0)) as _);
        let start_ids = if start.is_some() { vec![4] } else { vec![] };
        ThinkingConstraint::new(table(), &spec(start, budget), start_ids, vec![2, 3], inner)
    }

    fn allowed(mask: &TokenMask) -> Vec<u32> {
        (0..9).filter(|&t| mask.allows(t)).collect()
    }

    #[test]
    fn the_format_waits_for_the_end_of_the_thinking_however_it_is_spelled() {
        let mut c = constraint(None, None, true);
        // Thinking: anything but the end of the output.
        assert_eq!(allowed(&c.mask().unwrap()), vec![0, 1, 2, 3, 4, 5, 6, 8]);
        for t in [0, 5, 2] {
            c.advance(t).unwrap();
        }
        assert_eq!(c.mask().unwrap().count(), 8, "`</` alone does not end it");
        c.advance(3).unwrap();
        assert_eq!(allowed(&c.mask().unwrap()), vec![5], "the answer's format");
        c.advance(5).unwrap();
        c.advance(6).unwrap();
        assert_eq!(allowed(&c.mask().unwrap()), vec![7]);
        // The end string inside one token ends it too.
        let mut c = constraint(None, None, true);
        c.advance(8).unwrap();
        assert_eq!(allowed(&c.mask().unwrap()), vec![5]);
    }

    #[test]
    fn a_spent_budget_forces_the_end_string_then_the_format() {
        let mut c = constraint(None, Some(2), true);
        c.advance(0).unwrap();
        assert_eq!(c.forced_estimate(), 0);
        c.advance(1).unwrap();
        assert_eq!(allowed(&c.mask().unwrap()), vec![2]);
        assert_eq!(c.forced_estimate(), 2);
        c.advance(2).unwrap();
        assert_eq!(allowed(&c.mask().unwrap()), vec![3]);
        c.advance(3).unwrap();
        assert_eq!(allowed(&c.mask().unwrap()), vec![5]);
        // A budget of 0 forces the end at once; without a format the answer is free.
        let mut c = constraint(None, Some(0), false);
        assert_eq!(allowed(&c.mask().unwrap()), vec![2]);
        c.advance(2).unwrap();
        c.advance(3).unwrap();
        assert_eq!(c.mask().unwrap().count(), 9);
        // Without a format, the output may end inside the thinking.
        assert_eq!(constraint(None, Some(4), false).mask().unwrap().count(), 9);
    }

    #[test]
    fn an_output_may_open_thinking_or_answer_at_once() {
        let mut c = constraint(Some("<think>"), Some(1), true);
        assert_eq!(allowed(&c.mask().unwrap()), vec![4, 5]);
        // Answering at once: the first token is the format's.
        let mut answering = c.fork();
        answering.advance(5).unwrap();
        assert_eq!(allowed(&answering.mask().unwrap()), vec![6]);
        // Opening: the budget counts from the start string on.
        c.advance(4).unwrap();
        assert_eq!(c.mask().unwrap().count(), 8);
        c.advance(0).unwrap();
        assert_eq!(allowed(&c.mask().unwrap()), vec![2]);
    }

    #[test]
    fn drafts_are_judged_across_the_phases_without_moving_the_state() {
        let mut c = constraint(None, Some(3), true);
        // Two thinking tokens, the end, the format's two.
        assert_eq!(c.allowed_prefix(&[0, 1, 2, 3, 5, 6, 7]).unwrap(), 7);
        assert_eq!(c.allowed_prefix(&[0, 1, 2, 3, 6]).unwrap(), 4);
        // Past the budget only the end is allowed.
        assert_eq!(c.allowed_prefix(&[0, 1, 0, 0]).unwrap(), 3);
        // A budget spent on the end string's first token forces only the rest.
        assert_eq!(allowed(&c.mask_after(&[0, 1, 2]).unwrap()), vec![3]);
        assert_eq!(c.allowed_prefix(&[7]).unwrap(), 0, "no end inside thinking");
        assert_eq!(allowed(&c.mask_after(&[0, 1, 2, 3, 5]).unwrap()), vec![6]);
        assert_eq!(allowed(&c.mask_after(&[0, 1, 0]).unwrap()), vec![2]);
        assert_eq!(c.mask().unwrap().count(), 8, "the state did not move");
        let mut opening = constraint(Some("<think>"), None, true);
        assert_eq!(opening.allowed_prefix(&[5, 6, 7]).unwrap(), 3);
        assert_eq!(opening.allowed_prefix(&[4, 0, 8, 5]).unwrap(), 4);
        assert_eq!(opening.allowed_prefix(&[0]).unwrap(), 0);
    }
}
