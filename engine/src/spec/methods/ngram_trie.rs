//! The N-Gram Trie drafter: a trie over the request's own tokens, built with an n-gram
//! sliding window (n = 13, maximum prefix length Lp = 3). Window i splits into a prefix
//! `t[i .. i+Lp]` and a suffix `t[i+Lp .. i+n]`; for every sub-prefix (the prefix without
//! its first 0, 1, 2 tokens) the key `sub-prefix + suffix` is inserted from the root, and
//! every node on a key's path counts one more use (its frequency).
//!
//! ```text
//!  tokens  a b c d e f ...        window 0: prefix [a b c], suffix [d e f ...]
//!  keys    a b c d e f ...   b c d e f ...   c d e f ...
//!  draft   the last Lp generated tokens are looked up (then Lp-1, ...); the subtree under
//!          the match is cut to the budget by frequency, best first
//! ```
//! A proposal's evidence (`Drafter::evidence`) is the matched prefix length and whether one
//! continuation dominates, so the engine learns how well each kind is accepted.
//! The trie grows incrementally: each new token extends the keys of every window still
//! open (a cursor per sub-prefix), so extending with accepted output costs O(n * Lp) and
//! gives exactly the trie a full rebuild would. It grows when it prepares, with the tokens
//! the sequence gained since: a sequence that never drafts (at a load where no tree pays)
//! never builds it, and one that drafts again catches up once.

use std::collections::{BinaryHeap, HashMap, VecDeque};

use crate::spec::{Candidates, DraftContext, Drafter, SpecMethod};

/// Window length.
pub const WINDOW: usize = 13;
/// Maximum prefix length.
pub const MAX_PREFIX: usize = 3;
/// Most nodes prepared for one draft.
pub const MAX_NODES: usize = 64;

#[derive(Debug, Clone)]
struct Node {
    frequency: u32,
    children: Vec<u32>,
    token: u32,
}

/// A window whose suffix is still growing: one trie cursor per sub-prefix.
#[derive(Debug, Clone)]
struct OpenWindow {
    start: usize,
    cursors: Vec<u32>,
}

/// The per-request n-gram trie drafter.
#[derive(Debug, Clone)]
pub struct NgramTrie {
    nodes: Vec<Node>,
    edges: HashMap<(u32, u32), u32>,
    open: VecDeque<OpenWindow>,
    tokens: Vec<u32>,
    candidates: Candidates,
    /// This step's evidence (0: no candidates; see `prepare`).
    evidence: u8,
}

impl Default for NgramTrie {
    fn default() -> Self {
        Self {
            nodes: vec![Node {
                frequency: 0,
                children: Vec::new(),
                token: u32::MAX,
            }],
            edges: HashMap::new(),
            open: VecDeque::new(),
            tokens: Vec::new(),
            candidates: Candidates::new(),
            evidence: 0,
        }
    }
}

impl NgramTrie {
    /// An empty trie, for a sequence whose tokens it takes in when it first prepares.
    pub fn new() -> Self {
        Self::default()
    }

    /// A trie over `tokens`.
    pub fn from_tokens(tokens: &[u32]) -> Self {
        let mut trie = Self::default();
        trie.catch_up(tokens);
        trie
    }

    /// Appends the tokens of `tokens` (the sequence's known tokens, of which those taken in
    /// so far are a prefix) it has not taken in yet.
    pub fn catch_up(&mut self, tokens: &[u32]) {
        debug_assert!(
            tokens.starts_with(&self.tokens),
            "a sequence's tokens only grow"
        );
        for &t in tokens.get(self.tokens.len()..).unwrap_or_default() {
            self.append(t);
        }
    }

    /// Nodes in the trie (the root included).
    pub fn num_nodes(&self) -> usize {
        self.nodes.len()
    }

    /// The child of `node` for `token`, created if needed; its frequency grows by one.
    fn step(&mut self, node: u32, token: u32) -> u32 {
        let child = match self.edges.get(&(node, token)) {
            Some(&child) => child,
            None => {
                let child = self.nodes.len() as u32;
                self.nodes.push(Node {
                    frequency: 0,
                    children: Vec::new(),
                    token,
                });
                self.nodes[node as usize].children.push(child);
                self.edges.insert((node, token), child);
                child
            }
        };
        self.nodes[child as usize].frequency += 1;
        child
    }

    /// Appends one token of the sequence.
    pub fn append(&mut self, token: u32) {
        self.tokens.push(token);
        let p = self.tokens.len() - 1;
        // Extend the suffix of every open window, then close the full ones.
        let mut open = std::mem::take(&mut self.open);
        for window in open.iter_mut() {
            for cursor in window.cursors.iter_mut() {
                *cursor = self.step(*cursor, token);
            }
        }
        open.retain(|w| w.start + WINDOW - 1 > p);
        self.open = open;
        // The window whose prefix ends here starts; insert its sub-prefixes.
        if p + 1 >= MAX_PREFIX {
            let start = p + 1 - MAX_PREFIX;
            let mut cursors = Vec::with_capacity(MAX_PREFIX);
            for cut in 0..MAX_PREFIX {
                let mut node = 0;
                for i in start + cut..=p {
                    node = self.step(node, self.tokens[i]);
                }
                cursors.push(node);
            }
            if WINDOW > MAX_PREFIX {
                self.open.push_back(OpenWindow { start, cursors });
            }
        }
    }

    /// The node reached from the root through `key`, if the trie holds it.
    fn find(&self, key: &[u32]) -> Option<u32> {
        key.iter()
            .try_fold(0u32, |node, &t| self.edges.get(&(node, t)).copied())
    }
}

impl Drafter for NgramTrie {
    fn method(&self) -> SpecMethod {
        SpecMethod::NgramTrie
    }

    fn prepare(&mut self, ctx: &DraftContext<'_>) -> usize {
        self.candidates.clear();
        let tokens = ctx.tokens;
        self.catch_up(tokens);
        self.evidence = 0;
        let matched = (1..=MAX_PREFIX.min(tokens.len()))
            .rev()
            .filter_map(|k| Some((k, self.find(&tokens[tokens.len() - k..])?)))
            .find(|&(_, node)| !self.nodes[node as usize].children.is_empty());
        let Some((len, matched)) = matched else {
            return 0;
        };
        // Evidence: the matched length, and whether one continuation dominates (more than
        // half of the uses of the match); with 3 tokens matched, a dominant continuation's
        // first node was accepted 0.80 of the time on Spec-Bench and a contested one's 0.25.
        let children = &self.nodes[matched as usize].children;
        let frequency = |c: &u32| self.nodes[*c as usize].frequency;
        let top = children.iter().map(frequency).max().unwrap_or(0);
        let uses: u32 = children.iter().map(frequency).sum();
        self.evidence = (2 * len - 1) as u8 + u8::from(2 * top > uses);
        // Best first by frequency (then by creation order); parents always precede children.
        let mut heap = BinaryHeap::new();
        for &child in &self.nodes[matched as usize].children {
            heap.push((
                self.nodes[child as usize].frequency,
                std::cmp::Reverse(child),
                None,
            ));
        }
        while let Some((_, std::cmp::Reverse(node), parent)) = heap.pop() {
            if self.candidates.len() >= MAX_NODES {
                break;
            }
            let index = self
                .candidates
                .push(parent, self.nodes[node as usize].token);
            for &child in &self.nodes[node as usize].children {
                let frequency = self.nodes[child as usize].frequency;
                heap.push((frequency, std::cmp::Reverse(child), Some(index)));
            }
        }
        self.candidates.len()
    }

    fn evidence(&self) -> u8 {
        self.evidence
    }

    fn candidates(&self) -> Option<&Candidates> {
        Some(&self.candidates)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn incremental_growth_equals_a_rebuild() {
        let tokens: Vec<u32> = (0..200).map(|i| (i * 7 + i / 13) % 23).collect();
        let mut grown = NgramTrie::from_tokens(&tokens[..50]);
        grown.catch_up(&tokens[..120]);
        // Preparing takes in what the sequence gained since.
        grown.prepare(&DraftContext { tokens: &tokens });
        let rebuilt = NgramTrie::from_tokens(&tokens);
        assert_eq!(grown.num_nodes(), rebuilt.num_nodes());
        let freq = |t: &NgramTrie, key: &[u32]| t.find(key).map(|n| t.nodes[n as usize].frequency);
        for start in 0..190 {
            let key = &tokens[start..start + 5];
            assert_eq!(freq(&grown, key), freq(&rebuilt, key));
        }
    }

    #[test]
    fn drafts_the_most_frequent_continuations_of_the_last_tokens() {
        // "5 6 7 1 2" appears twice, "5 6 7 3" once: after "5 6 7" the draft starts with 1.
        let tokens = [5, 6, 7, 1, 2, 9, 5, 6, 7, 3, 8, 5, 6, 7, 1, 2, 0, 5, 6, 7];
        let mut trie = NgramTrie::from_tokens(&tokens);
        let ctx = DraftContext { tokens: &tokens };
        assert!(trie.prepare(&ctx) >= 3);
        let tree = trie.draft(&ctx, 3);
        assert_eq!(tree.tokens()[0], 7);
        assert_eq!(tree.tokens()[1], 1, "{:?}", tree.tokens());
        assert_eq!(tree.parents()[1], Some(0));
        // With no match there is nothing to draft.
        let mut empty = NgramTrie::from_tokens(&[1, 2, 3]);
        let lonely = [1, 2, 3, 42];
        let ctx = DraftContext { tokens: &lonely };
        assert_eq!(empty.prepare(&ctx), 0);
        assert_eq!(empty.evidence(), 0);
    }

    /// The evidence of the trie over `tokens` drafting after them.
    fn evidence_after(tokens: &[u32]) -> u8 {
        let mut trie = NgramTrie::from_tokens(tokens);
        let ctx = DraftContext { tokens };
        assert!(trie.prepare(&ctx) > 0);
        trie.evidence()
    }

    #[test]
    fn evidence_grows_with_the_match_and_a_dominant_continuation() {
        // After "5 6 7": 1 three times, 3 once -> three tokens matched, one continuation
        // dominant. (Each occurrence counts once per sub-prefix that reaches it, so none
        // sits at the very start.)
        let dominant = [
            2, 2, 5, 6, 7, 1, 9, 5, 6, 7, 1, 8, 5, 6, 7, 3, 4, 5, 6, 7, 1, 0, 5, 6, 7,
        ];
        assert_eq!(evidence_after(&dominant), 6);
        // After "5 6 7": 1 twice, 3 twice -> contested.
        let contested = [
            2, 2, 5, 6, 7, 1, 9, 5, 6, 7, 3, 8, 5, 6, 7, 3, 4, 5, 6, 7, 1, 0, 5, 6, 7,
        ];
        assert_eq!(evidence_after(&contested), 5);
        // Only the last token was seen before: one token matched.
        assert_eq!(evidence_after(&[5, 6, 7, 1, 9, 2, 7]), 2);
    }

    #[test]
    fn a_trie_that_never_prepares_takes_nothing_in() {
        let tokens: Vec<u32> = (0..100).map(|i| i % 17).collect();
        let mut lazy = NgramTrie::new();
        lazy.observe(&tokens, 100);
        assert_eq!(lazy.num_nodes(), 1);
        let ctx = DraftContext { tokens: &tokens };
        let eager = NgramTrie::from_tokens(&tokens).prepare(&ctx);
        assert_eq!(lazy.prepare(&ctx), eager);
        assert_eq!(
            lazy.num_nodes(),
            NgramTrie::from_tokens(&tokens).num_nodes()
        );
    }
}
