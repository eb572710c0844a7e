//! The draft model's growing tree, kept to its most likely paths. Each node carries the draft
//! model's log-probability of the whole path to it, so a child never ranks above its parent;
//! after each depth only the `budget` most likely nodes of the tree stay, and only the new
//! ones among them are expanded further. The tree a budget buys is then the budget's most
//! likely nodes, wherever they lie: a chain where the draft model is sure of itself, siblings
//! where it is not (the dynamic trees of EAGLE-2), and a depth whose nodes all fall out of
//! the budget costs no forward.

use crate::cpu::softmax::exp;
use crate::spec::Candidates;
use crate::tree::TokenTree;

/// One drafted node.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Node {
    /// An earlier node, or `None` under the pending token.
    parent: Option<usize>,
    token: u32,
    /// Log-probability of the path from the pending token to this node.
    logp: f32,
}

/// A sequence's drafted nodes, every parent before its children.
#[derive(Debug, Clone, Default)]
pub struct LikelyTree {
    nodes: Vec<Node>,
}

/// `ln(sum_i e^row[i])`, so that `row[t] - log_norm(row)` is token `t`'s log-probability
/// (never above 0).
fn log_norm(row: &[f32]) -> f32 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        return max;
    }
    // Eight lanes, so that the sum over a large vocabulary vectorises.
    let mut lanes = [0f32; 8];
    let mut chunks = row.chunks_exact(8);
    for chunk in &mut chunks {
        for (lane, &l) in lanes.iter_mut().zip(chunk) {
            *lane += exp(l - max);
        }
    }
    let rest: f32 = chunks.remainder().iter().map(|&l| exp(l - max)).sum();
    max + (lanes.iter().sum::<f32>() + rest).ln()
}

impl LikelyTree {
    /// No nodes.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Log-probability of the path to node `at` (0 for the pending token, `None`).
    pub fn logp(&self, at: Option<usize>) -> f32 {
        at.and_then(|i| self.nodes.get(i)).map_or(0.0, |n| n.logp)
    }

    /// Adds the tokens `top` (the `k` most likely after node `parent`, whose logits are
    /// `row`) as children of `parent`.
    pub fn grow(&mut self, parent: Option<usize>, row: &[f32], top: &[u32]) {
        let base = self.logp(parent);
        let norm = log_norm(row);
        for &token in top {
            let logit = row
                .get(token as usize)
                .copied()
                .unwrap_or(f32::NEG_INFINITY);
            self.nodes.push(Node {
                parent,
                token,
                logp: base + (logit - norm).min(0.0),
            });
        }
    }

    /// Keeps the `budget` most likely nodes (ties to the earlier node, so a parent always
    /// outranks its children) and returns the new indices of the kept nodes that were at
    /// `first_new` or later and are worth expanding: with the tree full, a child (no more
    /// likely than its parent, and later) can only enter by beating the least likely node,
    /// so a new node that is itself the least likely is not. A node whose parent goes goes
    /// too.
    pub fn keep_most_likely(&mut self, budget: usize, first_new: usize) -> Vec<usize> {
        let mut keep = vec![self.nodes.len() <= budget; self.nodes.len()];
        if self.nodes.len() > budget {
            for i in self.ranked().into_iter().take(budget) {
                keep[i] = true;
            }
        }
        let mut index: Vec<Option<usize>> = vec![None; self.nodes.len()];
        let mut kept = Vec::with_capacity(budget.min(self.nodes.len()));
        let mut fresh = Vec::new();
        for (i, node) in self.nodes.iter().enumerate() {
            let parent = match node.parent {
                None => None,
                Some(p) => match index[p] {
                    Some(q) => Some(q),
                    None => continue,
                },
            };
            if !keep[i] {
                continue;
            }
            index[i] = Some(kept.len());
            if i >= first_new {
                fresh.push(kept.len());
            }
            kept.push(Node { parent, ..*node });
        }
        self.nodes = kept;
        if self.nodes.len() >= budget {
            let least = self
                .nodes
                .iter()
                .map(|n| n.logp)
                .fold(f32::INFINITY, f32::min);
            fresh.retain(|&i| self.nodes[i].logp > least);
        }
        fresh
    }

    /// Node indices, most likely first (ties to the earlier node).
    fn ranked(&self) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.nodes.len()).collect();
        order.sort_by(|&a, &b| {
            self.nodes[b]
                .logp
                .total_cmp(&self.nodes[a].logp)
                .then(a.cmp(&b))
        });
        order
    }

    /// The tree of `pending` and every node, node `i` at tree row `i + 1`.
    pub fn tree(&self, pending: u32) -> TokenTree {
        let mut candidates = Candidates::new();
        for node in &self.nodes {
            candidates.push(node.parent, node.token);
        }
        candidates.tree(pending, candidates.len())
    }

    /// The nodes as candidates, most likely first, so that the first `n` of them are the
    /// tree of `n` nodes most likely to be accepted as far as the draft model knows.
    pub fn candidates(&self) -> Candidates {
        let mut at: Vec<Option<usize>> = vec![None; self.nodes.len()];
        let mut candidates = Candidates::new();
        for i in self.ranked() {
            let node = self.nodes[i];
            let parent = match node.parent {
                None => None,
                Some(p) => match at[p] {
                    Some(q) => Some(q),
                    // Never: a child's log-probability is its parent's plus a term that
                    // is not positive. Kept so that no logits can make an invalid tree.
                    None => continue,
                },
            };
            at[i] = Some(candidates.push(parent, node.token));
        }
        candidates
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Logits whose softmax gives token `t` probability `probs[t]` (the rest near 0).
    fn row(probs: &[f32]) -> Vec<f32> {
        probs.iter().map(|&p| p.max(1e-30).ln()).collect()
    }

    #[test]
    fn log_probabilities_add_along_paths() {
        let mut t = LikelyTree::new();
        t.grow(None, &row(&[0.5, 0.25, 0.25]), &[0, 1]);
        t.grow(Some(0), &row(&[0.1, 0.1, 0.8]), &[2]);
        assert!((t.logp(Some(0)) - 0.5f32.ln()).abs() < 1e-5);
        assert!((t.logp(Some(2)) - 0.4f32.ln()).abs() < 1e-5);
        assert_eq!(t.logp(None), 0.0);
    }

    #[test]
    fn a_sure_draft_becomes_a_chain_and_an_unsure_one_siblings() {
        // Depth 0: tokens 1 (0.9) and 2 (0.05). Depth 1 under 1: token 3 (0.9).
        let mut sure = LikelyTree::new();
        sure.grow(None, &row(&[0.0, 0.9, 0.05, 0.05]), &[1, 2]);
        // Full at two nodes: the second (0.05) is the least likely, so only the first is
        // worth expanding.
        assert_eq!(sure.keep_most_likely(2, 0), vec![0]);
        sure.grow(Some(0), &row(&[0.0, 0.05, 0.05, 0.9]), &[3, 1]);
        // 0.81 beats 0.05: the sibling leaves. The new child is now the least likely node,
        // so none of its children could enter: nothing is worth expanding.
        assert!(sure.keep_most_likely(2, 2).is_empty());
        let tree = sure.candidates().tree(7, 2);
        assert_eq!(tree.tokens(), &[7, 1, 3]);
        assert_eq!(tree.parents(), &[None, Some(0), Some(1)]);

        let mut unsure = LikelyTree::new();
        unsure.grow(None, &row(&[0.0, 0.4, 0.35, 0.25]), &[1, 2]);
        unsure.keep_most_likely(2, 0);
        unsure.grow(Some(0), &row(&[0.0, 0.3, 0.3, 0.4]), &[3, 1]);
        // 0.16 and 0.12 lose to 0.35: no new node stays, so nothing is expanded.
        assert!(unsure.keep_most_likely(2, 2).is_empty());
        assert_eq!(unsure.candidates().tree(7, 2).tokens(), &[7, 1, 2]);
    }

    #[test]
    fn every_prefix_of_the_candidates_is_a_tree_of_the_most_likely_nodes() {
        let mut t = LikelyTree::new();
        t.grow(None, &row(&[0.6, 0.3, 0.1]), &[0, 1, 2]);
        t.grow(Some(0), &row(&[0.7, 0.2, 0.1]), &[0, 1]);
        t.grow(Some(1), &row(&[0.1, 0.1, 0.8]), &[2]);
        // Path probabilities: 0.6, 0.3, 0.1, 0.42, 0.12, 0.24.
        let c = t.candidates();
        let tokens: Vec<u32> = (0..c.len()).map(|i| c.token(i)).collect();
        assert_eq!(tokens, vec![0, 0, 1, 2, 1, 2]);
        for n in 0..=c.len() {
            let tree = c.tree(9, n);
            assert_eq!(tree.len(), n + 1, "prefix {n} is not a valid tree");
        }
        assert_eq!(
            c.tree(9, 4).parents(),
            &[None, Some(0), Some(1), Some(0), Some(3)]
        );
    }

    #[test]
    fn pruning_keeps_parents_and_drops_orphans() {
        let mut t = LikelyTree::new();
        t.grow(None, &row(&[0.5, 0.5]), &[0, 1]);
        t.grow(Some(1), &row(&[0.5, 0.5]), &[0, 1]);
        // Equal path probabilities rank the earlier node first. The kept child is the
        // least likely node of a full tree: not worth expanding.
        assert!(t.keep_most_likely(3, 2).is_empty());
        assert_eq!(t.len(), 3);
        let tree = t.tree(4);
        assert_eq!(tree.tokens(), &[4, 0, 1, 0]);
        assert_eq!(tree.parents(), &[None, Some(0), Some(0), Some(2)]);
        // A NaN row gives no panic and a valid tree.
        t.grow(Some(2), &[f32::NAN, f32::NAN], &[0]);
        t.keep_most_likely(2, 3);
        let c = t.candidates();
        assert_eq!(c.tree(4, c.len()).len(), c.len() + 1);
    }
}
