//! Prompt lookup: find the most recent earlier occurrence of the sequence's last 3 tokens
//! (then 2, then 1) in its own tokens and propose what followed it, as a chain.

use super::{Candidates, DraftContext, Drafter, SpecMethod};
use crate::tree::TokenTree;

/// Longest suffix matched.
pub const MAX_NGRAM: usize = 3;
/// Longest continuation proposed.
pub const MAX_CHAIN: usize = 16;

/// The prompt-lookup drafter (stateless between steps).
#[derive(Debug, Clone, Default)]
pub struct PromptLookup {
    candidates: Candidates,
}

impl PromptLookup {
    /// A drafter.
    pub fn new() -> Self {
        Self::default()
    }
}

/// Start of the continuation after the most recent earlier occurrence of the last n tokens
/// (n = 3, 2, 1), if any.
pub fn find_continuation(tokens: &[u32]) -> Option<usize> {
    let len = tokens.len();
    for n in (1..=MAX_NGRAM).rev() {
        if len <= n {
            continue;
        }
        let suffix = &tokens[len - n..];
        // An occurrence starting at s must end before the suffix and leave a continuation.
        if let Some(s) = (0..len - n).rev().find(|&s| &tokens[s..s + n] == suffix) {
            return Some(s + n);
        }
    }
    None
}

impl Drafter for PromptLookup {
    fn method(&self) -> SpecMethod {
        SpecMethod::PromptLookup
    }

    fn prepare(&mut self, ctx: &DraftContext<'_>) -> usize {
        self.candidates.clear();
        if let Some(start) = find_continuation(ctx.tokens) {
            let end = (start + MAX_CHAIN).min(ctx.tokens.len());
            let mut parent = None;
            for &token in &ctx.tokens[start..end] {
                parent = Some(self.candidates.push(parent, token));
            }
        }
        self.candidates.len()
    }

    fn draft(&mut self, ctx: &DraftContext<'_>, budget: usize) -> TokenTree {
        let pending = ctx.tokens.last().copied().unwrap_or(0);
        self.candidates.tree(pending, budget)
    }

    fn observe(&mut self, _tokens: &[u32], _appended: usize) {}
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
}
