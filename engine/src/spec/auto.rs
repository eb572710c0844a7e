//! `auto`: per request, the method that has been accepting best lately. The request's
//! context-based drafters (n-gram trie, prompt lookup) and Token Recycling all keep up with
//! the sequence. Each step the context drafters come first: they propose only where the
//! context repeats, and then more precisely than Token Recycling's guess from the shared
//! matrix (on fresh Spec-Bench traffic each of them alone gained 1.11-1.16x at one client
//! where recycling gained 1.04x). Between the two, the one with the best recent accepted
//! tokens per verification (plus an exploration bonus that fades with tries) drafts;
//! Token Recycling drafts when neither has anything to propose.

use std::sync::Arc;

use super::ngram_trie::NgramTrie;
use super::prompt_lookup::PromptLookup;
use super::recycling::{RecyclingMatrix, StaticTree, TokenRecycling};
use super::speculator::Speculator;
use super::{DraftContext, Drafter, SpecMethod};
use crate::tree::TokenTree;

/// Weight of a new outcome in a method's score.
const ALPHA: f32 = 0.2;

/// The `auto` drafter.
pub struct AutoDrafter {
    drafters: Vec<Box<dyn Drafter>>,
    scores: Vec<f32>,
    tries: Vec<u32>,
    current: usize,
}

impl AutoDrafter {
    /// Drafters for a sequence whose known tokens are `tokens`; Token Recycling walks
    /// `tree` over the shared `matrix`.
    pub fn new(tokens: &[u32], matrix: Arc<RecyclingMatrix>, tree: Arc<StaticTree>) -> Self {
        let drafters: Vec<Box<dyn Drafter>> = vec![
            Box::new(NgramTrie::from_tokens(tokens)),
            Box::new(PromptLookup::new()),
            Box::new(TokenRecycling::new(matrix, tree)),
        ];
        let n = drafters.len();
        Self {
            drafters,
            scores: vec![0.0; n],
            tries: vec![0; n],
            current: 0,
        }
    }

    /// The drafters in the order they are asked: the context drafters by score, then Token
    /// Recycling.
    fn ranked(&self) -> Vec<usize> {
        let value = |i: usize| self.scores[i] + 1.0 / (1.0 + self.tries[i] as f32);
        let tier = |i: usize| usize::from(self.drafters[i].method() == SpecMethod::Recycling);
        let mut order: Vec<usize> = (0..self.drafters.len()).collect();
        order.sort_by(|&a, &b| tier(a).cmp(&tier(b)).then(value(b).total_cmp(&value(a))));
        order
    }
}

impl Drafter for AutoDrafter {
    fn method(&self) -> SpecMethod {
        self.drafters[self.current].method()
    }

    fn prepare(&mut self, ctx: &DraftContext<'_>) -> usize {
        for i in self.ranked() {
            let available = self.drafters[i].prepare(ctx);
            if available > 0 {
                self.current = i;
                return available;
            }
        }
        0
    }

    fn draft(&mut self, ctx: &DraftContext<'_>, budget: usize) -> TokenTree {
        self.drafters[self.current].draft(ctx, budget)
    }

    fn observe(&mut self, tokens: &[u32], appended: usize) {
        for d in &mut self.drafters {
            d.observe(tokens, appended);
        }
    }

    fn record(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        let i = self.current;
        self.tries[i] = self.tries[i].saturating_add(1);
        self.scores[i] += ALPHA * (accepted as f32 - self.scores[i]);
        self.drafters[i].record(drafted, accepted);
    }
}

/// `auto`'s speculator: Token Recycling's matrix (learned by its own speculator) and the
/// context drafters, per sequence.
pub struct AutoSpeculator {
    matrix: Arc<RecyclingMatrix>,
    tree: Arc<StaticTree>,
}

impl AutoSpeculator {
    /// Drafters that walk `tree` over the shared `matrix` among the others.
    pub fn new(matrix: Arc<RecyclingMatrix>, tree: Arc<StaticTree>) -> Self {
        Self { matrix, tree }
    }
}

impl Speculator for AutoSpeculator {
    fn method(&self) -> SpecMethod {
        SpecMethod::Auto
    }

    fn drafter(&self, tokens: &[u32]) -> Option<Box<dyn Drafter>> {
        Some(Box::new(AutoDrafter::new(
            tokens,
            Arc::clone(&self.matrix),
            Arc::clone(&self.tree),
        )))
    }

    fn wants_logits(&self, token: u32) -> bool {
        (token as usize) < self.matrix.vocab() && !self.matrix.has_row(token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settles_on_the_method_that_accepts() {
        let tokens: Vec<u32> = (0..40).map(|i| i % 10).collect();
        let matrix = Arc::new(RecyclingMatrix::new(16, 8));
        let ctx = DraftContext { tokens: &tokens };
        let mut auto = AutoDrafter::new(&tokens, matrix, Arc::new(StaticTree::paper()));
        // Recycling has no rows, so only the context drafters can propose.
        for _ in 0..20 {
            assert!(auto.prepare(&ctx) > 0);
            let accepted = if auto.method() == SpecMethod::PromptLookup {
                5
            } else {
                0
            };
            auto.record(8, accepted);
        }
        auto.prepare(&ctx);
        assert_eq!(auto.method(), SpecMethod::PromptLookup);
    }

    #[test]
    fn context_drafters_go_first_and_recycling_fills_in() {
        let matrix = Arc::new(RecyclingMatrix::new(16, 8));
        let mut logits = vec![0.0f32; 16];
        logits[3] = 1.0;
        for token in 0..16 {
            matrix.update(token, &logits);
        }
        // A context that repeats: the context drafters propose, and recycling's
        // successes do not move them aside.
        let tokens: Vec<u32> = (0..40).map(|i| i % 10).collect();
        let ctx = DraftContext { tokens: &tokens };
        let mut auto =
            AutoDrafter::new(&tokens, Arc::clone(&matrix), Arc::new(StaticTree::paper()));
        for _ in 0..10 {
            assert!(auto.prepare(&ctx) > 0);
            assert_ne!(auto.method(), SpecMethod::Recycling);
            auto.record(4, 0);
        }
        // A context that never repeats: only recycling has something to propose.
        let fresh: Vec<u32> = (0..12).collect();
        let ctx = DraftContext { tokens: &fresh };
        let mut auto = AutoDrafter::new(&fresh, matrix, Arc::new(StaticTree::paper()));
        assert!(auto.prepare(&ctx) > 0);
        assert_eq!(auto.method(), SpecMethod::Recycling);
    }
}
