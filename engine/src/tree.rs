//! `TokenTree` (a draft tree, parents before children) and `TreeMask` (each node's ancestor
//! set as a bitset). A chain is the degenerate tree whose mask is the causal mask, so prefill
//! chunks, plain decoding and speculative trees all go through the same attention.

use crate::{Error, Result};

/// Tokens in a tree; node 0 is the root and every parent index precedes its child.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenTree {
    tokens: Vec<u32>,
    /// `parents[i]` for `i > 0`; `None` only for the root.
    parents: Vec<Option<usize>>,
    depths: Vec<usize>,
}

impl TokenTree {
    /// A chain: node i's parent is node i - 1.
    pub fn chain(tokens: &[u32]) -> Self {
        Self {
            tokens: tokens.to_vec(),
            parents: (0..tokens.len()).map(|i| i.checked_sub(1)).collect(),
            depths: (0..tokens.len()).collect(),
        }
    }

    /// A tree from tokens and parent indices. Errors unless exactly node 0 is the root and
    /// every parent precedes its child.
    pub fn new(tokens: Vec<u32>, parents: Vec<Option<usize>>) -> Result<Self> {
        if tokens.len() != parents.len() {
            return Err(Error::InvalidBatch(
                "tree tokens and parents differ in length".into(),
            ));
        }
        let mut depths = Vec::with_capacity(tokens.len());
        for (i, parent) in parents.iter().enumerate() {
            match (i, parent) {
                (0, None) => depths.push(0),
                (i, Some(p)) if *p < i => depths.push(depths[*p] + 1),
                _ => {
                    return Err(Error::InvalidBatch(format!(
                        "tree node {i} has parent {parent:?}: only node 0 is a root and parents precede children"
                    )))
                }
            }
        }
        Ok(Self {
            tokens,
            parents,
            depths,
        })
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// True for a tree with no node.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Token of each node.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Parent of each node.
    pub fn parents(&self) -> &[Option<usize>] {
        &self.parents
    }

    /// Depth of each node (root = 0): its RoPE offset from the tree's start.
    pub fn depths(&self) -> &[usize] {
        &self.depths
    }

    /// Node indices from the root to `node`, inclusive.
    pub fn path_to(&self, node: usize) -> Vec<usize> {
        let mut path = vec![node];
        let mut cur = node;
        while let Some(p) = self.parents[cur] {
            path.push(p);
            cur = p;
        }
        path.reverse();
        path
    }

    /// The tree of the root and the nodes `keep` accepts whose parent is kept too, in the
    /// same order (`keep` is asked about every node but the root, parents first).
    pub fn retain(&self, mut keep: impl FnMut(usize) -> bool) -> TokenTree {
        let mut new_index: Vec<Option<usize>> = vec![None; self.len()];
        let (mut tokens, mut parents) = (Vec::new(), Vec::new());
        for i in 0..self.len() {
            let parent = match self.parents[i] {
                None if i == 0 => None,
                None => continue,
                Some(p) => match new_index[p] {
                    Some(q) => Some(q),
                    None => continue,
                },
            };
            if i > 0 && !keep(i) {
                continue;
            }
            new_index[i] = Some(tokens.len());
            tokens.push(self.tokens[i]);
            parents.push(parent);
        }
        TokenTree::new(tokens, parents).unwrap_or_else(|_| TokenTree::chain(&self.tokens[..1]))
    }

    /// The ancestor mask of this tree.
    pub fn mask(&self) -> TreeMask {
        TreeMask::from_parents(&self.parents)
    }
}

/// Row i holds the set {j : node j is node i or one of its ancestors}, as bits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeMask {
    len: usize,
    words_per_row: usize,
    bits: Vec<u64>,
}

impl TreeMask {
    /// The causal mask of an n-token chain.
    pub fn causal(len: usize) -> Self {
        let parents: Vec<Option<usize>> = (0..len).map(|i| i.checked_sub(1)).collect();
        Self::from_parents(&parents)
    }

    /// Ancestor sets from parent indices (parents precede children).
    pub fn from_parents(parents: &[Option<usize>]) -> Self {
        let len = parents.len();
        let words_per_row = len.div_ceil(64).max(1);
        let mut bits = vec![0u64; len * words_per_row];
        for (i, parent) in parents.iter().enumerate() {
            if let Some(p) = *parent {
                let (dst, src) = (i * words_per_row, p * words_per_row);
                for w in 0..words_per_row {
                    bits[dst + w] = bits[src + w];
                }
            }
            bits[i * words_per_row + i / 64] |= 1 << (i % 64);
        }
        Self {
            len,
            words_per_row,
            bits,
        }
    }

    /// Nodes in the tree.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty mask.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether node `i` sees node `j`.
    pub fn sees(&self, i: usize, j: usize) -> bool {
        self.bits[i * self.words_per_row + j / 64] & (1 << (j % 64)) != 0
    }

    /// The nodes row `i` sees, ascending (ancestors first, then `i` itself).
    pub fn visible(&self, i: usize) -> impl Iterator<Item = usize> + '_ {
        let row = &self.bits[i * self.words_per_row..(i + 1) * self.words_per_row];
        row.iter().enumerate().flat_map(|(w, &word)| {
            let mut word = word;
            std::iter::from_fn(move || {
                (word != 0).then(|| {
                    let bit = word.trailing_zeros() as usize;
                    word &= word - 1;
                    w * 64 + bit
                })
            })
        })
    }

    /// The ancestors of row `i`, nearest first (its parent, then the parent's parent...).
    pub fn ancestors_nearest_first(&self, i: usize) -> impl Iterator<Item = usize> + '_ {
        let row = &self.bits[i * self.words_per_row..(i + 1) * self.words_per_row];
        // Bits below `i` only: ancestors precede their descendants.
        let (last, below) = (i / 64, i % 64);
        (0..=last.min(row.len().saturating_sub(1)))
            .rev()
            .flat_map(move |w| {
                let mut word = if w == last {
                    row[w] & ((1u64 << below) - 1)
                } else {
                    row[w]
                };
                std::iter::from_fn(move || {
                    (word != 0).then(|| {
                        let bit = 63 - word.leading_zeros() as usize;
                        word &= !(1u64 << bit);
                        w * 64 + bit
                    })
                })
            })
    }

    /// Row `i`'s parent, where it has one.
    pub fn parent(&self, i: usize) -> Option<usize> {
        self.ancestors_nearest_first(i).next()
    }

    /// Whether every row's parent is the row before it (a chain).
    pub fn is_chain(&self) -> bool {
        (0..self.len).all(|i| self.count_visible(i) == i + 1)
    }

    /// How many nodes row `i` sees.
    pub fn count_visible(&self, i: usize) -> usize {
        self.bits[i * self.words_per_row..(i + 1) * self.words_per_row]
            .iter()
            .map(|w| w.count_ones() as usize)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ancestors_come_nearest_first_across_words() {
        let mask = TreeMask::from_parents(&[None, Some(0), Some(0), Some(2), Some(1), Some(3)]);
        let of = |i| mask.ancestors_nearest_first(i).collect::<Vec<_>>();
        assert_eq!(of(0), Vec::<usize>::new());
        assert_eq!(of(4), vec![1, 0]);
        assert_eq!(of(5), vec![3, 2, 0]);
        let chain = TreeMask::causal(130);
        let of = |i| chain.ancestors_nearest_first(i).collect::<Vec<_>>();
        assert_eq!(of(129), (0..129).rev().collect::<Vec<_>>());
        assert_eq!(of(64), (0..64).rev().collect::<Vec<_>>());
        assert_eq!(of(63), (0..63).rev().collect::<Vec<_>>());
    }

    #[test]
    fn retain_drops_nodes_and_their_descendants() {
        // 0 -> 1 -> 3, 0 -> 2 -> 4
        let tree = TokenTree::new(
            vec![10, 11, 12, 13, 14],
            vec![None, Some(0), Some(0), Some(1), Some(2)],
        )
        .unwrap();
        let kept = tree.retain(|i| i != 1);
        assert_eq!(kept.tokens(), &[10, 12, 14]);
        assert_eq!(kept.parents(), &[None, Some(0), Some(1)]);
        assert_eq!(tree.retain(|_| false).tokens(), &[10]);
        assert_eq!(tree.retain(|_| true), tree);
    }

    #[test]
    fn causal_mask_is_lower_triangular() {
        let m = TreeMask::causal(70);
        for i in 0..70 {
            for j in 0..70 {
                assert_eq!(m.sees(i, j), j <= i, "{i} {j}");
            }
            assert_eq!(
                m.visible(i).collect::<Vec<_>>(),
                (0..=i).collect::<Vec<_>>()
            );
        }
    }

    #[test]
    fn tree_mask_is_the_ancestor_set() {
        //      0
        //    1   2
        //   3     4
        let tree = TokenTree::new(
            vec![10, 11, 12, 13, 14],
            vec![None, Some(0), Some(0), Some(1), Some(2)],
        )
        .unwrap();
        let m = tree.mask();
        assert_eq!(m.visible(3).collect::<Vec<_>>(), vec![0, 1, 3]);
        assert_eq!(m.visible(4).collect::<Vec<_>>(), vec![0, 2, 4]);
        assert_eq!(tree.depths(), &[0, 1, 1, 2, 2]);
        assert_eq!(tree.path_to(4), vec![0, 2, 4]);
        assert_eq!(m.count_visible(4), 3);
    }

    #[test]
    fn malformed_trees_are_rejected() {
        assert!(TokenTree::new(vec![1, 2], vec![None, None]).is_err());
        assert!(TokenTree::new(vec![1, 2], vec![None, Some(1)]).is_err());
        assert!(TokenTree::new(vec![1], vec![Some(0)]).is_err());
    }
}
