//! Lossless verification of a draft tree. From the root, the model's own choice at each
//! node (greedy argmax, or a sample from the request's distribution) is computed from that
//! node's logits; if a child of the node carries that token the walk moves there, otherwise
//! the choice is the bonus token and the walk ends.
//!
//! The choice at output position i uses exactly the randomness plain decoding would use at
//! position i (seeded by request, sample index and position; see `sampler`), and a drafted
//! token is kept only if it *is* that choice. So the output is token for token what plain
//! decoding produces, greedy or sampled: the drafts only decide how many of those tokens one
//! forward yields. For deterministic drafts (point masses) this acceptance rule accepts a
//! child with the same probability as multi-candidate rejection sampling.

use crate::sampler::Sampled;
use crate::tree::TokenTree;

/// The outcome of verifying one tree.
#[derive(Debug, Clone, PartialEq)]
pub struct Verified {
    /// Accepted node indices, the root first.
    pub accepted: Vec<usize>,
    /// New tokens: the accepted drafted tokens, then the bonus token.
    pub tokens: Vec<Sampled>,
}

/// Walks `tree` with `choose(node, tokens chosen so far)` giving the model's choice at a
/// node (from that node's logits).
pub fn verify(tree: &TokenTree, mut choose: impl FnMut(usize, &[u32]) -> Sampled) -> Verified {
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); tree.len()];
    for (i, parent) in tree.parents().iter().enumerate() {
        if let Some(p) = parent {
            children[*p].push(i);
        }
    }
    let mut accepted = vec![0];
    let mut tokens: Vec<Sampled> = Vec::new();
    let mut chosen: Vec<u32> = Vec::new();
    let mut node = 0;
    loop {
        let sampled = choose(node, &chosen);
        let next = children[node]
            .iter()
            .copied()
            .find(|&c| tree.tokens()[c] == sampled.token_id);
        chosen.push(sampled.token_id);
        tokens.push(sampled);
        match next {
            Some(child) => {
                accepted.push(child);
                node = child;
            }
            None => break,
        }
    }
    Verified { accepted, tokens }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pick(token: u32) -> Sampled {
        Sampled {
            token_id: token,
            logprob: None,
        }
    }

    #[test]
    fn follows_the_matching_child_then_adds_a_bonus() {
        // root 0 -> {1: 10, 2: 11}; 2 -> {3: 12}; the model says 11, 12, 13.
        let tree =
            TokenTree::new(vec![5, 10, 11, 12], vec![None, Some(0), Some(0), Some(2)]).unwrap();
        let model = [11, 99, 12, 13];
        let v = verify(&tree, |node, _| pick(model[node]));
        assert_eq!(v.accepted, vec![0, 2, 3]);
        let ids: Vec<u32> = v.tokens.iter().map(|s| s.token_id).collect();
        assert_eq!(ids, vec![11, 12, 13]);
        // Nothing matches: just the bonus token.
        let v = verify(&tree, |_, _| pick(42));
        assert_eq!(v.accepted, vec![0]);
        assert_eq!(v.tokens.len(), 1);
    }

    #[test]
    fn choices_see_the_tokens_chosen_before_them() {
        let tree = TokenTree::chain(&[1, 2, 3]);
        let mut seen = Vec::new();
        verify(&tree, |_, before| {
            seen.push(before.to_vec());
            pick(before.len() as u32 + 2)
        });
        assert_eq!(seen, vec![vec![], vec![2], vec![2, 3]]);
    }
}
