//! Prompt lookup: find the most recent earlier occurrence of the longest suffix of the
//! sequence (up to 6 tokens) in its own tokens and propose what followed it, as a chain.
//! The length of the match is the proposal's evidence: the engine learns how well each
//! length is accepted.

use crate::spec::{Candidates, DraftContext, Drafter, SpecMethod};

/// Longest suffix matched.
pub const MAX_NGRAM: usize = 6;
/// Longest continuation proposed.
pub const MAX_CHAIN: usize = 16;

/// The prompt-lookup drafter (stateless between steps).
#[derive(Debug, Clone, Default)]
pub struct PromptLookup {
    candidates: Candidates,
    /// Length of this step's matched n-gram (0: none).
    matched: u8,
}

impl PromptLookup {
    /// A drafter.
    pub fn new() -> Self {
        Self::default()
    }
}

/// Start of the continuation after the most recent earlier occurrence of the longest
/// suffix (up to [`MAX_NGRAM`] tokens) that occurred before, if any.
pub fn find_continuation(tokens: &[u32]) -> Option<usize> {
    find_match(tokens).map(|(start, _)| start)
}

/// [`find_continuation`] and the length of the matched suffix. One pass from the most
/// recent candidate back: an occurrence ending at `end` (before the last token) matches as
/// many tokens as agree going backwards from it and from the last token.
fn find_match(tokens: &[u32]) -> Option<(usize, usize)> {
    let last = tokens.len().checked_sub(1)?;
    let mut best: Option<(usize, usize)> = None;
    for end in (0..last).rev() {
        let matched = (0..MAX_NGRAM.min(end + 1))
            .take_while(|&k| tokens[end - k] == tokens[last - k])
            .count();
        if matched > best.map_or(0, |b| b.1) {
            best = Some((end + 1, matched));
            if matched == MAX_NGRAM {
                break;
            }
        }
    }
    best
}

impl Drafter for PromptLookup {
    fn method(&self) -> SpecMethod {
        SpecMethod::PromptLookup
    }

    fn prepare(&mut self, ctx: &DraftContext<'_>) -> usize {
        self.candidates.clear();
        self.matched = 0;
        if let Some((start, n)) = find_match(ctx.tokens) {
            self.matched = n as u8;
            let end = (start + MAX_CHAIN).min(ctx.tokens.len());
            let mut parent = None;
            for &token in &ctx.tokens[start..end] {
                parent = Some(self.candidates.push(parent, token));
            }
        }
        self.candidates.len()
    }

    fn evidence(&self) -> u8 {
        self.matched
    }

    fn candidates(&self) -> Option<&Candidates> {
        Some(&self.candidates)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continues_the_longest_most_recent_match() {
        // "1 2 3 9 9 | 1 2 3 7 | 1 2 3" -> last "1 2 3" followed by 7 most recently.
        let tokens = [1, 2, 3, 9, 9, 1, 2, 3, 7, 1, 2, 3];
        assert_eq!(find_continuation(&tokens), Some(8));
        let ctx = DraftContext { tokens: &tokens };
        let mut d = PromptLookup::new();
        assert_eq!(d.prepare(&ctx), 4);
        assert_eq!(d.draft(&ctx, 2).tokens(), &[3, 7, 1]);
        assert_eq!(find_continuation(&[4, 5, 6]), None);
        assert_eq!(find_continuation(&[5, 4, 5]), Some(1));
    }

    #[test]
    fn a_longer_match_wins_over_a_more_recent_one_and_is_the_evidence() {
        // "3 4" last followed 8, but "1 2 3 4" (longer) followed 7.
        let tokens = [1, 2, 3, 4, 7, 9, 3, 4, 8, 5, 1, 2, 3, 4];
        assert_eq!(find_continuation(&tokens), Some(4));
        let ctx = DraftContext { tokens: &tokens };
        let mut d = PromptLookup::new();
        assert!(d.prepare(&ctx) > 0);
        assert_eq!(d.evidence(), 4);
        assert_eq!(d.draft(&ctx, 1).tokens(), &[4, 7]);
        // Matches stop at MAX_NGRAM tokens: the most recent full-length match wins.
        let repeated: Vec<u32> = (0..3).flat_map(|_| 10..20).collect();
        let ctx = DraftContext { tokens: &repeated };
        assert!(d.prepare(&ctx) > 0);
        assert_eq!(usize::from(d.evidence()), MAX_NGRAM);
        assert_eq!(find_continuation(&repeated), Some(20));
        // Nothing to continue: no evidence.
        let ctx = DraftContext { tokens: &[4, 5, 6] };
        assert_eq!(d.prepare(&ctx), 0);
        assert_eq!(d.evidence(), 0);
    }
}
