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
//!
//! Here: the traits and request types (this file, `speculator`), verification (`verify`),
//! acceptance statistics (`stats`), the methods themselves (`methods/`, a file or a folder
//! per draft source) and the engine thread's side that holds every method's speculator and
//! turns drafters into the scheduler's offers and the forward's trees (`coordinator`).

pub(crate) mod coordinator;
pub mod methods;
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
    /// The longest match of the recent tokens among everything the server has seen (within
    /// the request's cache salt) and the request's own tokens.
    Suffix,
    /// Pick per request the method that is accepting best.
    Auto,
    /// A method the embedding program registered with its own speculator
    /// (`SpeculationConfig::speculators`), by its name.
    Named(&'static str),
    /// The request's own prediction of its output (`prediction`): not a method a request
    /// names, but the source that drafts first under every method except `none` wherever
    /// the request gave one, so its acceptance is learnt, counted and reported apart.
    Prediction,
    /// `auto`'s proposals from the sequence's own tokens (a source, counted apart; not a
    /// method a request names).
    Context,
    /// `auto`'s proposals from the global suffix index (a source, counted apart; not a
    /// method a request names).
    SuffixIndex,
}

impl SpecMethod {
    /// Every built-in method, in a stable order.
    pub const ALL: [SpecMethod; 7] = [
        SpecMethod::None,
        SpecMethod::Recycling,
        SpecMethod::NgramTrie,
        SpecMethod::PromptLookup,
        SpecMethod::DraftModel,
        SpecMethod::Suffix,
        SpecMethod::Auto,
    ];

    /// The built-in method named `name` (`none`, `recycling`, `ngram_trie`,
    /// `prompt_lookup`, `draft_model`, `suffix`, `auto`).
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
            SpecMethod::Suffix => "suffix",
            SpecMethod::Auto => "auto",
            SpecMethod::Named(name) => name,
            SpecMethod::Prediction => "prediction",
            SpecMethod::Context => "context",
            SpecMethod::SuffixIndex => "suffix_index",
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

/// What a speculator knows of a sequence when it makes the sequence's drafter: the request's
/// own context, beyond its tokens.
#[derive(Debug, Clone, Copy)]
pub struct NewSequence<'a> {
    /// Its known tokens: the prompt, and for a fork of an `n` > 1 request the output its
    /// parent had when it forked, with the fork's own first token last.
    pub tokens: &'a [u32],
    /// How many of `tokens` are the prompt (the output starts after them).
    pub prompt_len: usize,
    /// The request's prediction of its output (`prediction`), tokenized and indexed once
    /// for every drafter that reads it (`Prediction::tokens` has the tokens); `None` when it
    /// gave none (or an empty one). A drafter that does not draft from it itself
    /// ([`Drafter::drafts_prediction`]) has the prediction drafting first around it
    /// (`methods::prediction::PredictionFirst`), so a speculator need not read it.
    pub prediction: Option<&'a std::sync::Arc<methods::prediction::Prediction>>,
    /// The prefix-cache scope of the request's cache salt (`None` without one): what a
    /// speculator keeps across requests (a draft model's cached KV) it shares only within it.
    pub cache_scope: Option<kvcache::BlockHash>,
}

/// One draft source's part of a verified tree merged from several sources.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceOutcome {
    /// The source.
    pub method: SpecMethod,
    /// Its nodes in the tree.
    pub drafted: usize,
    /// The depths (1: the first draft token) of its nodes on the accepted path, ascending.
    pub accepted_at: Vec<usize>,
}

impl SourceOutcome {
    /// Its accepted nodes.
    pub fn accepted(&self) -> usize {
        self.accepted_at.len()
    }

    /// Its accepted nodes among the path's first `depth` draft tokens.
    pub fn accepted_within(&self, depth: usize) -> usize {
        self.accepted_at.partition_point(|&d| d <= depth)
    }
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
    /// This step's candidates, where the drafter keeps them as a [`Candidates`] list (what
    /// the default [`Drafter::draft`] cuts to the budget); `None`: it keeps none (its trees
    /// come from its speculator, or it drafts its own way).
    fn candidates(&self) -> Option<&Candidates> {
        None
    }
    /// The draft tree for at most `budget` nodes under the pending token (root = node 0). By
    /// default the first `budget` of [`Drafter::candidates`], or, without any, the pending
    /// token alone.
    fn draft(&mut self, ctx: &DraftContext<'_>, budget: usize) -> TokenTree {
        let pending = ctx.tokens.last().copied().unwrap_or(0);
        match self.candidates() {
            Some(candidates) => candidates.tree(pending, budget),
            None => TokenTree::chain(&[pending]),
        }
    }
    /// `tokens` grew by its last `appended` tokens (accepted drafts and the new pending one).
    /// By default nothing (the next `prepare` sees every token).
    fn observe(&mut self, _tokens: &[u32], _appended: usize) {}
    /// Outcome of the last draft: nodes drafted and how many were accepted.
    fn record(&mut self, _drafted: usize, _accepted: usize) {}
    /// The drafter's own estimate, for this step's candidates, of the draft tokens accepted
    /// from a tree of its first n nodes (entry n - 1), where it prices every node (a tree
    /// merged from several calibrated sources); `None`: the engine's statistics per method
    /// and evidence estimate it.
    fn expected_accepted(&self) -> Option<&[f32]> {
        None
    }
    /// The outcome of the last draft node by node: the tree verified (its nodes are a subset
    /// of the drafted ones, closed under parents) and its accepted nodes, root first.
    fn verified(&mut self, _tree: &TokenTree, _accepted: &[usize]) {}
    /// Per draft source, the nodes of the last verified tree it proposed and which of them
    /// were accepted, for a drafter merging several sources into one tree (a node several
    /// sources proposed counts for each); empty: the whole tree is `method()`'s.
    fn source_outcomes(&self) -> &[SourceOutcome] {
        &[]
    }
    /// Whether this step's tree needs its speculator's batched work (a draft model's
    /// forwards) and comes from the speculator's `draft`. A drafter that drafted this step
    /// from what it holds itself (a prediction) says no, and the engine takes its tree
    /// directly.
    fn needs_speculator(&self) -> bool {
        true
    }
    /// Whether it drafts from the request's prediction itself (`NewSequence::prediction`,
    /// merged with its other sources). Where it does not and the request gave one, the
    /// engine puts the prediction before it (`methods::prediction::PredictionFirst`).
    fn drafts_prediction(&self) -> bool {
        false
    }
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

    /// Parent of node `index` (`None`: the root).
    ///
    /// # Panics
    /// If `index` is out of range.
    pub fn parent(&self, index: usize) -> Option<usize> {
        self.nodes[index].0
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
/// small sorted list, and the row is never copied. Once the list is full, each run of
/// [`TOP_K_RUN`] logits is first compared with the smallest kept one all at once (a loop the
/// compiler vectorises): most runs hold nothing larger and are passed over whole, and in one
/// that does, each part of [`TOP_K_PART`] is compared the same way before its logits one by
/// one. The engine calls this for every row a forward computes: on a 49,152-logit
/// vocabulary a logit-by-logit pass cost a few percent of a step, and runs of 64 compared as
/// ordering keys 7.1 us a row against 4.5 us now (Intel Xeon, AVX-512).
pub(crate) fn top_k_into(logits: &[f32], out: &mut [u32]) {
    let k = out.len();
    if k == 0 {
        return;
    }
    let mut best: Vec<(i32, u32)> = Vec::with_capacity(k + 1);
    let mut at = 0;
    for run in logits.chunks(TOP_K_RUN) {
        if !beats_floor(&best, k, run) {
            at += run.len();
            continue;
        }
        for part in run.chunks(TOP_K_PART) {
            if beats_floor(&best, k, part) {
                for (j, &l) in part.iter().enumerate() {
                    let key = order_key(l);
                    if best.len() == k && key <= best[k - 1].0 {
                        continue;
                    }
                    // After every kept logit at least as large: ties keep the earlier
                    // index first.
                    let place = best.partition_point(|&(b, _)| b >= key);
                    best.insert(place, (key, (at + j) as u32));
                    best.truncate(k);
                }
            }
            at += part.len();
        }
    }
    for (slot, &(_, id)) in out.iter_mut().zip(&best) {
        *slot = id;
    }
}

/// Whether any of `logits` may rank above the smallest of the `k` kept (always, while fewer
/// are kept). Compared as floats, which is cheaper than ordering keys: a logit not below the
/// smallest kept one (equal, a NaN, or `0.0` against `-0.0`) counts, so nothing that ranks
/// above it in `total_cmp`'s order is missed, and the exact comparison follows.
// `!(l < floor)` is meant: a NaN must count, and it is one comparison a lane.
#[allow(clippy::neg_cmp_op_on_partial_ord)]
#[inline(always)]
fn beats_floor(best: &[(i32, u32)], k: usize, logits: &[f32]) -> bool {
    if best.len() < k {
        return true;
    }
    let floor = from_order_key(best[k - 1].0);
    logits.iter().fold(false, |any, &l| any | !(l < floor))
}

/// The `f32` whose [`order_key`] is `key`.
#[inline(always)]
fn from_order_key(key: i32) -> f32 {
    f32::from_bits((key ^ (((key >> 31) as u32) >> 1) as i32) as u32)
}

/// Logits `top_k_into` compares with its smallest kept one at once.
const TOP_K_RUN: usize = 256;

/// Within a run that holds a larger logit, the parts compared at once before logit by logit.
const TOP_K_PART: usize = 16;

/// `x` as an integer in `f32::total_cmp`'s order: `a.total_cmp(&b)` is
/// `order_key(a).cmp(&order_key(b))`.
#[inline(always)]
fn order_key(x: f32) -> i32 {
    let bits = x.to_bits() as i32;
    bits ^ (((bits >> 31) as u32) >> 1) as i32
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
        // Few distinct values, so ties are common, with signed zeros, infinities and NaNs of
        // both signs among them.
        let values = [
            -3.0,
            -1.0,
            0.0,
            -0.0,
            2.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -f32::NAN,
        ];
        for case in 0..300 {
            // Rows shorter and longer than a run, and not a whole number of runs.
            let n = 1 + (case * 37) % 700;
            let special = case % 3 == 0;
            let logits: Vec<f32> = (0..n)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 17;
                    state ^= state << 5;
                    let pick = state as usize % if special { values.len() } else { 5 };
                    values[pick]
                })
                .collect();
            let mut sorted: Vec<u32> = (0..n as u32).collect();
            sorted.sort_by(|&a, &b| {
                logits[b as usize]
                    .total_cmp(&logits[a as usize])
                    .then(a.cmp(&b))
            });
            for k in [1, 8, 40] {
                let k = k.min(n);
                let mut got = vec![0u32; k];
                top_k_into(&logits, &mut got);
                assert_eq!(got, sorted[..k], "k {k}: {logits:?}");
            }
        }
    }

    #[test]
    fn the_order_key_orders_as_total_cmp() {
        let values = [
            f32::NEG_INFINITY,
            -f32::NAN,
            -1.5,
            -0.0,
            0.0,
            1e-40,
            2.0,
            f32::MAX,
            f32::INFINITY,
            f32::NAN,
        ];
        for a in values {
            for b in values {
                assert_eq!(order_key(a).cmp(&order_key(b)), a.total_cmp(&b), "{a} {b}");
            }
        }
    }
}
