//! `auto`: per request, the method whose proposal is most likely to be accepted. The
//! request's context-based drafters (n-gram trie, prompt lookup) and Token Recycling all
//! keep up with the sequence. Each step the context drafters come first: they propose only
//! where the context repeats, and then more precisely than Token Recycling's guess from the
//! shared matrix. Each proposal comes with its drafter's evidence (the length of the match,
//! and for the trie whether one continuation dominates), and the tokens such proposals had
//! accepted are learnt engine-wide per drafter and evidence level ([`Choices`]): the
//! proposal with the best record (plus an exploration bonus that fades with tries) drafts.
//! (Counting accepted tokens rather than first nodes favours a long match's deep chain.)
//! Token Recycling drafts when no context drafter has anything to propose.

use std::sync::{Arc, Mutex};

use super::ngram_trie::NgramTrie;
use super::prompt_lookup::PromptLookup;
use super::recycling::{RecyclingMatrix, StaticTree, TokenRecycling};
use super::recycling_matrices::RecyclingMatrices;
use crate::spec::speculator::Speculator;
use crate::spec::{DraftContext, Drafter, NewSequence, SpecMethod};
use crate::tree::TokenTree;

/// Evidence levels told apart (higher ones count as the highest).
const LEVELS: usize = 16;
/// Accepted tokens expected of a proposal without a record.
const PRIOR: f32 = 0.5;
/// Weight of a new outcome once a record has many.
const ALPHA: f32 = 0.05;
/// Exploration bonus of a record without outcomes, shrinking as one over the square root of
/// its outcomes.
const EXPLORATION: f32 = 0.2;

/// Accepted tokens per verified proposal (a moving average), per drafter and evidence
/// level, over every sequence drafting with `auto` of one engine (the engine thread alone
/// reads and writes it; the lock is never contended).
#[derive(Debug)]
pub struct Choices {
    /// `(accepted tokens, outcomes)` per drafter and level.
    records: Mutex<Vec<(f32, u32)>>,
}

impl Choices {
    fn new(drafters: usize) -> Self {
        Self {
            records: Mutex::new(vec![(PRIOR, 0); drafters * LEVELS]),
        }
    }

    fn index(drafter: usize, evidence: u8) -> usize {
        drafter * LEVELS + usize::from(evidence).min(LEVELS - 1)
    }

    /// The value of a proposal by `drafter` with `evidence`: its record plus the bonus.
    fn value(&self, drafter: usize, evidence: u8) -> f32 {
        let records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        records
            .get(Self::index(drafter, evidence))
            .map_or(PRIOR, |&(p, n)| p + EXPLORATION / (1.0 + n as f32).sqrt())
    }

    /// A proposal by `drafter` with `evidence` had `accepted` nodes accepted.
    fn record(&self, drafter: usize, evidence: u8, accepted: usize) {
        let mut records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((p, n)) = records.get_mut(Self::index(drafter, evidence)) {
            let alpha = ALPHA.max(1.0 / (*n as f32 + 2.0));
            *p += alpha * (accepted as f32 - *p);
            *n = n.saturating_add(1);
        }
    }
}

/// The `auto` drafter.
pub struct AutoDrafter {
    drafters: Vec<Box<dyn Drafter>>,
    choices: Arc<Choices>,
    current: usize,
}

impl AutoDrafter {
    /// Drafters for a sequence (the n-gram trie takes its tokens in when it first
    /// prepares); Token Recycling walks `tree` over the shared `matrix`; `choices` is the
    /// engine-wide record.
    fn with_choices(
        matrix: Arc<RecyclingMatrix>,
        tree: Arc<StaticTree>,
        choices: Arc<Choices>,
    ) -> Self {
        let drafters: Vec<Box<dyn Drafter>> = vec![
            Box::new(NgramTrie::new()),
            Box::new(PromptLookup::new()),
            Box::new(TokenRecycling::new(matrix, tree)),
        ];
        Self {
            drafters,
            choices,
            current: 0,
        }
    }

    /// Drafters for a sequence, with a record of its own.
    pub fn new(matrix: Arc<RecyclingMatrix>, tree: Arc<StaticTree>) -> Self {
        Self::with_choices(matrix, tree, Arc::new(Choices::new(DRAFTERS)))
    }
}

/// Drafters `auto` chooses among: the context drafters, then Token Recycling.
const DRAFTERS: usize = 3;
/// Index of Token Recycling, the fallback, among them.
const RECYCLING: usize = 2;

impl Drafter for AutoDrafter {
    fn method(&self) -> SpecMethod {
        self.drafters[self.current].method()
    }

    fn prepare(&mut self, ctx: &DraftContext<'_>) -> usize {
        // Every context drafter prepares; the proposal with the best record drafts. Token
        // Recycling only when none proposes.
        let mut best: Option<(f32, usize, usize)> = None;
        for (i, drafter) in self.drafters[..RECYCLING].iter_mut().enumerate() {
            let available = drafter.prepare(ctx);
            if available == 0 {
                continue;
            }
            let value = self.choices.value(i, drafter.evidence());
            if best.is_none_or(|(v, _, _)| value > v) {
                best = Some((value, i, available));
            }
        }
        match best {
            Some((_, i, available)) => {
                self.current = i;
                available
            }
            None => {
                self.current = RECYCLING;
                self.drafters[RECYCLING].prepare(ctx)
            }
        }
    }

    fn evidence(&self) -> u8 {
        self.drafters[self.current].evidence()
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
        self.choices
            .record(i, self.drafters[i].evidence(), accepted);
        self.drafters[i].record(drafted, accepted);
    }
}

/// `auto`'s speculator: Token Recycling's matrices (learned by its own speculator; a
/// sequence walks its cache salt's) and the context drafters, per sequence.
pub struct AutoSpeculator {
    matrices: Arc<RecyclingMatrices>,
    tree: Arc<StaticTree>,
    choices: Arc<Choices>,
}

impl AutoSpeculator {
    /// Drafters that walk `tree` over the shared `matrices` among the others.
    pub fn new(matrices: Arc<RecyclingMatrices>, tree: Arc<StaticTree>) -> Self {
        Self {
            matrices,
            tree,
            choices: Arc::new(Choices::new(DRAFTERS)),
        }
    }
}

impl Speculator for AutoSpeculator {
    fn method(&self) -> SpecMethod {
        SpecMethod::Auto
    }

    fn drafter(&self, seq: &NewSequence<'_>) -> Option<Box<dyn Drafter>> {
        Some(Box::new(AutoDrafter::with_choices(
            self.matrices.get(seq.cache_scope),
            Arc::clone(&self.tree),
            Arc::clone(&self.choices),
        )))
    }

    fn wants_logits(&self, token: u32, cache_scope: Option<kvcache::BlockHash>) -> bool {
        self.matrices.lacks_row(token, cache_scope)
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
        let mut auto = AutoDrafter::new(matrix, Arc::new(StaticTree::paper()));
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
        let mut auto = AutoDrafter::new(Arc::clone(&matrix), Arc::new(StaticTree::paper()));
        for _ in 0..10 {
            assert!(auto.prepare(&ctx) > 0);
            assert_ne!(auto.method(), SpecMethod::Recycling);
            auto.record(4, 0);
        }
        // A context that never repeats: only recycling has something to propose.
        let fresh: Vec<u32> = (0..12).collect();
        let ctx = DraftContext { tokens: &fresh };
        let mut auto = AutoDrafter::new(matrix, Arc::new(StaticTree::paper()));
        assert!(auto.prepare(&ctx) > 0);
        assert_eq!(auto.method(), SpecMethod::Recycling);
    }

    #[test]
    fn what_one_sequence_learns_the_next_one_uses() {
        let tokens: Vec<u32> = (0..40).map(|i| i % 10).collect();
        let ctx = DraftContext { tokens: &tokens };
        let speculator = || {
            AutoSpeculator::new(
                Arc::new(RecyclingMatrices::new(RecyclingMatrix::new(16, 8))),
                Arc::new(StaticTree::paper()),
            )
        };
        let new = NewSequence {
            tokens: &tokens,
            prompt_len: tokens.len(),
            prediction: None,
            cache_scope: None,
        };
        let shared = speculator();
        let mut first = shared.drafter(&new).expect("auto drafts");
        for _ in 0..20 {
            assert!(first.prepare(&ctx) > 0);
            let accepted = if first.method() == SpecMethod::PromptLookup {
                4
            } else {
                0
            };
            first.record(4, accepted);
        }
        // Both context drafters propose with their strongest evidence here; a new
        // sequence of the same engine starts with the one that was accepted.
        let mut next = shared.drafter(&new).expect("auto drafts");
        assert!(next.prepare(&ctx) > 0);
        assert_eq!(next.method(), SpecMethod::PromptLookup);
        // Another engine has no record: it starts with the first drafter, the trie.
        let mut other = speculator().drafter(&new).expect("auto drafts");
        assert!(other.prepare(&ctx) > 0);
        assert_eq!(other.method(), SpecMethod::NgramTrie);
    }
}
