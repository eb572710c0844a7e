//! `suffix`: drafts from the longest match of a sequence's recent tokens among everything its
//! cache-salt scope has seen (the global suffix indexes, `global`: every request's
//! prompt from admission, its output once it left) and among its own tokens (a local suffix
//! index that grows with the sequence). The most recent occurrences of the longest match, from
//! either source (both where they match about as long), each add the tokens that followed
//! them to one weighted trie; the draft is that trie best first by the share of occurrences
//! behind each node, as deep as twice the match (a long match predicts a long way). A
//! proposal's evidence is the match length's bucket and whether the global index
//! contributed, so the engine learns how each kind is accepted.

use std::ops::Range;
use std::sync::{Arc, Mutex};

use kvcache::BlockHash;

pub mod global;
pub mod index;

use global::SuffixIndexes;
use index::{Occurrences, SuffixIndex, MAX_MATCH};

use crate::spec::methods::continuations::ContinuationTree;
use crate::spec::speculator::{SeenRequest, Speculator};
use crate::spec::{Candidates, DraftContext, Drafter, NewSequence, SpecMethod};

/// Most nodes prepared for one draft.
pub const MAX_NODES: usize = 64;
/// Deepest draft, and the shallowest a match allows.
const MAX_DEPTH: usize = 32;
const MIN_DEPTH: usize = 4;
/// A node needs at least this share of the occurrences behind the draft.
const MIN_SHARE: f32 = 0.1;
/// The shortest match of the global index that drafts: shorter ones, common phrases of
/// other requests, were accepted too rarely to pay for their rows (benches/README.md).
const GLOBAL_MIN_MATCH: usize = 4;

/// The global indexes an engine's `suffix` sequences share.
pub type SharedIndexes = Arc<Mutex<SuffixIndexes>>;

/// One sequence's `suffix` drafter.
pub struct SuffixDrafter {
    own_tokens: OwnTokens,
    global: SharedIndexes,
    scope: Option<BlockHash>,
    /// Where its own prompt lies in the global index (its local index has it).
    own: Range<u64>,
    found_global: Occurrences,
    tree: ContinuationTree,
    candidates: Candidates,
    evidence: u8,
}

impl SuffixDrafter {
    /// A drafter for a sequence of `scope`, drafting from `global` (passing over `own`, its
    /// prompt there) and its own tokens.
    pub fn new(global: SharedIndexes, scope: Option<BlockHash>, own: Range<u64>) -> Self {
        Self {
            own_tokens: OwnTokens::default(),
            global,
            scope,
            own,
            found_global: Occurrences::default(),
            tree: ContinuationTree::new(),
            candidates: Candidates::new(),
            evidence: 0,
        }
    }

    /// The continuations of `found`'s occurrences in `index`, one weight each, into the trie.
    fn add(tree: &mut ContinuationTree, index: &SuffixIndex, found: &Occurrences, depth: usize) {
        for &(at, _) in &found.at {
            tree.add(index.continuation(at, depth), 1.0);
        }
    }
}

/// A sequence's own tokens, indexed as they grow, and the last match of its recent tokens
/// among them.
#[derive(Debug, Default)]
pub struct OwnTokens {
    index: SuffixIndex,
    indexed: usize,
    /// The occurrences of the last lookup.
    pub found: Occurrences,
}

impl OwnTokens {
    /// Takes in the tokens of `tokens` (the sequence's known tokens) not indexed yet and
    /// finds the longest match of its last ones; returns them (the lookup's context).
    pub fn find<'a>(&mut self, tokens: &'a [u32]) -> &'a [u32] {
        if self.indexed > tokens.len() {
            self.index = SuffixIndex::new();
            self.indexed = 0;
        }
        self.index.extend(&tokens[self.indexed..]);
        self.indexed = tokens.len();
        let context = &tokens[tokens.len().saturating_sub(MAX_MATCH)..];
        self.index.find(context, &(0..0), &mut self.found);
        context
    }

    /// The index of the tokens.
    pub fn index(&self) -> &SuffixIndex {
        &self.index
    }
}

/// Looks `context` up in `scope`'s global index, passing over `own` (the sequence's prompt
/// there), into `found` (cleared when the match is shorter than `min_match`), and counts the
/// lookup; returns the index looked in, if the engine keeps one for the scope.
pub fn find_global<'a>(
    indexes: &'a SuffixIndexes,
    scope: Option<BlockHash>,
    context: &[u32],
    own: &Range<u64>,
    min_match: usize,
    found: &mut Occurrences,
) -> Option<&'a SuffixIndex> {
    found.clear();
    let index = indexes.get(scope).filter(|_| indexes.enabled())?;
    index.find(context, own, found);
    if found.len < min_match {
        found.clear();
    }
    metrics::counter!(crate::metrics::spec::SUFFIX_LOOKUPS).increment(1);
    if found.len > 0 {
        metrics::counter!(crate::metrics::spec::SUFFIX_HITS).increment(1);
    }
    Some(index)
}

/// The evidence bucket of a match of `len` tokens (1-6).
pub fn match_bucket(len: usize) -> u8 {
    match len {
        0..=2 => 1,
        3 => 2,
        4..=5 => 3,
        6..=9 => 4,
        10..=17 => 5,
        _ => 6,
    }
}

impl Drafter for SuffixDrafter {
    fn method(&self) -> SpecMethod {
        SpecMethod::Suffix
    }

    fn prepare(&mut self, ctx: &DraftContext<'_>) -> usize {
        let context = self.own_tokens.find(ctx.tokens);
        self.tree.clear();
        self.candidates.clear();
        self.evidence = 0;
        let global = self.global.lock().unwrap_or_else(|e| e.into_inner());
        let index = find_global(
            &global,
            self.scope,
            context,
            &self.own,
            GLOBAL_MIN_MATCH,
            &mut self.found_global,
        );
        let found_local = &self.own_tokens.found;
        let best = found_local.len.max(self.found_global.len);
        if best == 0 {
            return 0;
        }
        let depth = (2 * best).clamp(MIN_DEPTH, MAX_DEPTH);
        let enough = (best * 3).div_ceil(4);
        if found_local.len >= enough {
            Self::add(&mut self.tree, self.own_tokens.index(), found_local, depth);
        }
        let mut global_contributed = false;
        if let Some(index) = index {
            if self.found_global.len >= enough {
                Self::add(&mut self.tree, index, &self.found_global, depth);
                global_contributed = true;
            }
        }
        drop(global);
        self.tree
            .best_first(MIN_SHARE, MAX_NODES, &mut self.candidates);
        self.evidence = match_bucket(best) + if global_contributed { 8 } else { 0 };
        self.candidates.len()
    }

    fn evidence(&self) -> u8 {
        self.evidence
    }

    fn candidates(&self) -> Option<&Candidates> {
        Some(&self.candidates)
    }
}

/// Where `seq`'s prompt lies in its scope's global index.
pub fn own_prompt(indexes: &SharedIndexes, seq: &NewSequence<'_>) -> Range<u64> {
    let prompt = &seq.tokens[..seq.prompt_len.min(seq.tokens.len())];
    indexes
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .own_prompt(prompt, seq.cache_scope)
}

/// The `suffix` method's engine-wide side: the global indexes, taught by every request.
pub struct SuffixSpeculator {
    indexes: SharedIndexes,
}

impl SuffixSpeculator {
    /// Around `indexes`.
    pub fn new(indexes: SuffixIndexes) -> Self {
        Self {
            indexes: Arc::new(Mutex::new(indexes)),
        }
    }

    /// The indexes, for the drafters of other methods that read them.
    pub fn shared(&self) -> SharedIndexes {
        Arc::clone(&self.indexes)
    }

    fn publish(indexes: &SuffixIndexes) {
        use crate::metrics::spec::*;
        let counts = indexes.counts();
        metrics::gauge!(SUFFIX_TOKENS).set(counts.tokens as f64);
        metrics::gauge!(SUFFIX_REQUESTS).set(counts.requests as f64);
        metrics::gauge!(SUFFIX_BYTES).set(counts.bytes as f64);
        metrics::counter!(SUFFIX_EVICTIONS).absolute(counts.evictions);
    }
}

impl Speculator for SuffixSpeculator {
    fn method(&self) -> SpecMethod {
        SpecMethod::Suffix
    }

    fn drafter(&self, seq: &NewSequence<'_>) -> Option<Box<dyn Drafter>> {
        let own = own_prompt(&self.indexes, seq);
        Some(Box::new(SuffixDrafter::new(
            Arc::clone(&self.indexes),
            seq.cache_scope,
            own,
        )))
    }

    fn admitted(&mut self, request: &SeenRequest<'_>) {
        let mut indexes = self.indexes.lock().unwrap_or_else(|e| e.into_inner());
        if indexes.enabled() {
            indexes.learn_prompt(&request.tokens[..request.prompt_len], request.cache_scope);
            Self::publish(&indexes);
        }
    }

    fn finished(&mut self, request: &SeenRequest<'_>) {
        let mut indexes = self.indexes.lock().unwrap_or_else(|e| e.into_inner());
        if indexes.enabled() {
            indexes.learn_output(request.tokens, request.prompt_len, request.cache_scope);
            Self::publish(&indexes);
        }
    }

    fn save(&self) {
        self.indexes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .save();
    }
}

#[cfg(test)]
mod tests;
