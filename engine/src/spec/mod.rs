//! Speculative drafting. Every running sequence owns a [`Drafter`]; each step the scheduler
//! grants it a draft budget, the drafter grows a tree of candidate tokens under the
//! sequence's pending token, every sequence's tree goes through the same forward, and
//! [`verify`] keeps the longest root path that the model itself would have produced.
//!
//! A drafter first `prepare`s its candidates (best first, parents before children, so any
//! prefix of the list is a valid tree), which tells the scheduler how many nodes it could
//! use; then `draft` cuts the list to the granted budget. Each method's engine-wide side
//! (shared state, batched work, what it learns from the forward's rows) is a
//! [`speculator::Speculator`]. Adding a method means adding a drafter and a speculator type,
//! built in or registered by name ([`SpecMethod::Named`]); the engine loop never changes.

pub mod auto;
pub mod draft_model;
pub mod likely_tree;
pub mod ngram_trie;
pub mod prompt_lookup;
pub mod recycling;
pub mod speculator;
pub mod stats;
pub mod verify;

use crate::tree::TokenTree;

/// A speculation method a request can ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SpecMethod {
    /// Plain decoding.
    None,
    /// Token Recycling: the shared adjacency matrix of the model's top candidates.
    Recycling,
    /// N-gram trie built from the request's own context.
    NgramTrie,
    /// Prompt lookup: continue an earlier occurrence of the last tokens.
    PromptLookup,
    /// A small draft model sharing the tokenizer.
    DraftModel,
    /// Pick per request the method that is accepting best.
    Auto,
    /// A method the embedding program registered with its own speculator
    /// (`SpeculationConfig::speculators`), by its name.
    Named(&'static str),
}

impl SpecMethod {
    /// Every built-in method, in a stable order.
    pub const ALL: [SpecMethod; 6] = [
        SpecMethod::None,
        SpecMethod::Recycling,
        SpecMethod::NgramTrie,
        SpecMethod::PromptLookup,
        SpecMethod::DraftModel,
        SpecMethod::Auto,
    ];

    /// The built-in method named `name` (`none`, `recycling`, `ngram_trie`,
    /// `prompt_lookup`, `draft_model`, `auto`).
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.as_str() == name)
    }

    /// Its name in requests, flags and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            SpecMethod::None => "none",
            SpecMethod::Recycling => "recycling",
            SpecMethod::NgramTrie => "ngram_trie",
            SpecMethod::PromptLookup => "prompt_lookup",
            SpecMethod::DraftModel => "draft_model",
            SpecMethod::Auto => "auto",
            SpecMethod::Named(name) => name,
        }
    }
}

/// A request's choice of speculation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpecRequest {
    /// The method.
    pub method: SpecMethod,
    /// Most draft nodes per step (the engine's limit when absent).
    pub max_draft_tokens: Option<usize>,
}

/// What a drafter may read when drafting (what is engine-wide, its speculator gave it).
#[derive(Debug, Clone, Copy)]
pub struct DraftContext<'a> {
    /// Every known token of the sequence; the last one is the pending token (the root).
    pub tokens: &'a [u32],
}

/// One sequence's drafter.
pub trait Drafter: Send {
    /// The method drafting right now (for `auto`, the one it picked).
    fn method(&self) -> SpecMethod;
    /// Computes this step's candidates; returns how many nodes it could draft.
    fn prepare(&mut self, ctx: &DraftContext<'_>) -> usize;
    /// How strong the evidence behind this step's candidates is, on the drafter's own
    /// scale (prompt lookup: the length of the matched n-gram). The engine learns
    /// acceptance per method and evidence level, so a proposal backed by a long match is
    /// trusted with more nodes than one backed by a single token.
    fn evidence(&self) -> u8 {
        0
    }
    /// The draft tree for at most `budget` nodes under the pending token (root = node 0).
    fn draft(&mut self, ctx: &DraftContext<'_>, budget: usize) -> TokenTree;
    /// `tokens` grew by its last `appended` tokens (accepted drafts and the new pending one).
    fn observe(&mut self, tokens: &[u32], appended: usize);
    /// Outcome of the last draft: nodes drafted and how many were accepted.
    fn record(&mut self, _drafted: usize, _accepted: usize) {}
}

/// Draft nodes under the pending token, best first; each node's parent is the root
/// (`None`) or an earlier node, so every prefix of the list is a tree.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Candidates {
    nodes: Vec<(Option<usize>, u32)>,
}

impl Candidates {
    /// No candidates.
    pub fn new() -> Self {
        Self::default()
    }

    /// Forgets every candidate.
    pub fn clear(&mut self) {
        self.nodes.clear();
    }

    /// Appends a node under `parent` (an earlier node, or the root); returns its index.
    pub fn push(&mut self, parent: Option<usize>, token: u32) -> usize {
        debug_assert!(parent.is_none_or(|p| p < self.nodes.len()));
        self.nodes.push((parent, token));
        self.nodes.len() - 1
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Token of node `index`.
    ///
    /// # Panics
    /// If `index` is out of range.
    pub fn token(&self, index: usize) -> u32 {
        self.nodes[index].1
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The tree of the root `pending` and the first `budget` candidates.
    pub fn tree(&self, pending: u32, budget: usize) -> TokenTree {
        let kept = &self.nodes[..budget.min(self.nodes.len())];
        let mut tokens = Vec::with_capacity(kept.len() + 1);
        let mut parents = Vec::with_capacity(kept.len() + 1);
        tokens.push(pending);
        parents.push(None);
        for &(parent, token) in kept {
            tokens.push(token);
            parents.push(Some(parent.map_or(0, |p| p + 1)));
        }
        TokenTree::new(tokens, parents).unwrap_or_else(|_| TokenTree::chain(&[pending]))
    }
}

/// Writes into `out` the indices of the `out.len()` largest `logits`, largest first, ties
/// to the lower index (the order of `f32::total_cmp`; a NaN ranks above every number), as
/// Token Recycling's matrix and the draft model's trees both take them. One pass with a
/// small sorted list: most logits fail the first comparison, and the row is never copied.
pub(crate) fn top_k_into(logits: &[f32], out: &mut [u32]) {
    let k = out.len();
    if k == 0 {
        return;
    }
    let mut best: Vec<(f32, u32)> = Vec::with_capacity(k + 1);
    for (i, &l) in logits.iter().enumerate() {
        if best.len() == k && l.total_cmp(&best[k - 1].0).is_le() {
            continue;
        }
        // After every kept logit at least as large: ties keep the earlier index first.
        let at = best.partition_point(|&(b, _)| b.total_cmp(&l).is_ge());
        best.insert(at, (l, i as u32));
        best.truncate(k);
    }
    for (slot, &(_, id)) in out.iter_mut().zip(&best) {
        *slot = id;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for m in SpecMethod::ALL {
            assert_eq!(SpecMethod::parse(m.as_str()), Some(m));
        }
        assert_eq!(SpecMethod::parse("medusa"), None);
        assert_eq!(SpecMethod::Named("medusa").as_str(), "medusa");
    }

    #[test]
    fn any_prefix_of_candidates_is_a_tree() {
        let mut c = Candidates::new();
        let a = c.push(None, 10);
        c.push(None, 11);
        let b = c.push(Some(a), 12);
        c.push(Some(b), 13);
        let tree = c.tree(5, 3);
        assert_eq!(tree.tokens(), &[5, 10, 11, 12]);
        assert_eq!(tree.parents(), &[None, Some(0), Some(0), Some(1)]);
        assert_eq!(c.tree(5, 0).len(), 1);
        assert_eq!(c.tree(5, 99).len(), 5);
    }

    #[test]
    fn one_pass_top_k_matches_a_full_sort() {
        let mut state = 0x2545_f491_u32;
        for case in 0..200 {
            let n = 1 + case % 97;
            let logits: Vec<f32> = (0..n)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 17;
                    state ^= state << 5;
                    // Few distinct values, so ties are common.
                    (state % 7) as f32 - 3.0
                })
                .collect();
            let mut sorted: Vec<u32> = (0..n as u32).collect();
            sorted.sort_by(|&a, &b| {
                logits[b as usize]
                    .total_cmp(&logits[a as usize])
                    .then(a.cmp(&b))
            });
            let k = 8.min(n);
            let mut got = vec![0u32; k];
            top_k_into(&logits, &mut got);
            assert_eq!(got, sorted[..k], "{logits:?}");
        }
    }
}
