//! A weighted trie of proposed continuations: each source adds paths (the tokens that
//! followed an occurrence of the sequence's recent tokens) with a weight, shared prefixes
//! merge and add up, and the draft is the trie's nodes best first by their share of the
//! total weight (an estimate of the probability that the model's output takes that path),
//! cut where the share falls below a floor. A child never outweighs its parent, so best
//! first is parents first and any prefix of the draft is a tree.

use crate::spec::Candidates;

const NONE: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
struct Node {
    token: u32,
    parent: u32,
    weight: f32,
    depth: u16,
    first_child: u32,
    next_sibling: u32,
}

/// The trie; node 0 is the root (the pending token).
#[derive(Debug, Clone)]
pub struct ContinuationTree {
    nodes: Vec<Node>,
    order: Vec<u32>,
    slot: Vec<u32>,
}

impl Default for ContinuationTree {
    fn default() -> Self {
        Self::new()
    }
}

impl ContinuationTree {
    /// An empty trie.
    pub fn new() -> Self {
        let mut tree = Self {
            nodes: Vec::new(),
            order: Vec::new(),
            slot: Vec::new(),
        };
        tree.clear();
        tree
    }

    /// Forgets every path.
    pub fn clear(&mut self) {
        self.nodes.clear();
        self.nodes.push(Node {
            token: NONE,
            parent: NONE,
            weight: 0.0,
            depth: 0,
            first_child: NONE,
            next_sibling: NONE,
        });
    }

    /// Total weight added.
    pub fn total(&self) -> f32 {
        self.nodes[0].weight
    }

    /// Nodes besides the root.
    pub fn len(&self) -> usize {
        self.nodes.len() - 1
    }

    /// Whether no path was added.
    pub fn is_empty(&self) -> bool {
        self.nodes.len() == 1
    }

    /// Adds `path` under the root with `weight` (every node on it gains the weight).
    pub fn add(&mut self, path: impl Iterator<Item = u32>, weight: f32) {
        self.nodes[0].weight += weight;
        let mut at = 0u32;
        for token in path {
            let mut child = self.nodes[at as usize].first_child;
            while child != NONE && self.nodes[child as usize].token != token {
                child = self.nodes[child as usize].next_sibling;
            }
            if child == NONE {
                child = self.nodes.len() as u32;
                let parent = &self.nodes[at as usize];
                let node = Node {
                    token,
                    parent: at,
                    weight: 0.0,
                    depth: parent.depth.saturating_add(1),
                    first_child: NONE,
                    next_sibling: parent.first_child,
                };
                self.nodes[at as usize].first_child = child;
                self.nodes.push(node);
            }
            self.nodes[child as usize].weight += weight;
            at = child;
        }
    }

    /// The weight share of the heaviest first node (how much one continuation dominates).
    pub fn top_share(&self) -> f32 {
        let total = self.total();
        if total <= 0.0 {
            return 0.0;
        }
        let mut best = 0.0f32;
        let mut child = self.nodes[0].first_child;
        while child != NONE {
            best = best.max(self.nodes[child as usize].weight);
            child = self.nodes[child as usize].next_sibling;
        }
        best / total
    }

    /// The weight behind `node` (0: the root, the total).
    pub fn weight(&self, node: u32) -> f32 {
        self.nodes.get(node as usize).map_or(0.0, |n| n.weight)
    }

    /// The children of `node` (0: the root), as `(child, token)`.
    pub fn children(&self, node: u32) -> impl Iterator<Item = (u32, u32)> + '_ {
        let mut child = self
            .nodes
            .get(node as usize)
            .map_or(NONE, |n| n.first_child);
        std::iter::from_fn(move || {
            let at = child;
            let n = self.nodes.get(at as usize)?;
            child = n.next_sibling;
            Some((at, n.token))
        })
    }

    /// Writes into `out` at most `max_nodes` nodes whose weight is at least `min_share` of
    /// the total, heaviest first (ties: shallower, then added earlier).
    pub fn best_first(&mut self, min_share: f32, max_nodes: usize, out: &mut Candidates) {
        out.clear();
        let total = self.total();
        if total <= 0.0 {
            return;
        }
        let floor = min_share * total;
        self.order.clear();
        self.order.extend(
            (1..self.nodes.len() as u32).filter(|&i| self.nodes[i as usize].weight >= floor),
        );
        let nodes = &self.nodes;
        self.order.sort_by(|&a, &b| {
            let (na, nb) = (&nodes[a as usize], &nodes[b as usize]);
            nb.weight
                .total_cmp(&na.weight)
                .then(na.depth.cmp(&nb.depth))
                .then(a.cmp(&b))
        });
        self.order.truncate(max_nodes);
        self.slot.clear();
        self.slot.resize(self.nodes.len(), NONE);
        for &i in &self.order {
            let node = &self.nodes[i as usize];
            let parent = match node.parent {
                0 => None,
                p => match self.slot[p as usize] {
                    NONE => continue,
                    s => Some(s as usize),
                },
            };
            self.slot[i as usize] = out.push(parent, node.token) as u32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_prefixes_add_up_and_the_heaviest_come_first() {
        let mut tree = ContinuationTree::new();
        tree.add([1, 2, 3].into_iter(), 1.0);
        tree.add([1, 2, 4].into_iter(), 1.0);
        tree.add([5].into_iter(), 1.0);
        assert_eq!(tree.total(), 3.0);
        assert_eq!(tree.len(), 5);
        assert!((tree.top_share() - 2.0 / 3.0).abs() < 1e-6);
        let mut out = Candidates::new();
        tree.best_first(0.0, 10, &mut out);
        // 1 and 2 weigh 2; then 5 (depth 1), 3 and 4 (depth 3) weigh 1.
        let tokens: Vec<u32> = (0..out.len()).map(|i| out.token(i)).collect();
        assert_eq!(tokens, [1, 2, 5, 3, 4]);
        let t = out.tree(0, 10);
        assert_eq!(
            t.parents(),
            &[None, Some(0), Some(1), Some(0), Some(2), Some(2)]
        );
        // A floor of one half keeps the shared prefix only; a cap cuts best first.
        tree.best_first(0.5, 10, &mut out);
        assert_eq!(out.len(), 2);
        tree.best_first(0.0, 1, &mut out);
        assert_eq!(out.len(), 1);
        tree.clear();
        assert!(tree.is_empty());
        tree.best_first(0.0, 10, &mut out);
        assert!(out.is_empty());
    }
}
