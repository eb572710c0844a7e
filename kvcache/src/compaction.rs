//! `plan_compaction`: after a draft tree is verified, the accepted path's KV rows are moved
//! so the sequence's positions are consecutive again. Tree node `i` was written at position
//! `num_computed + i` of the block table (every node needs its own row); the accepted path
//! `a_0 < a_1 < ...` (parents precede children in a tree, so a path's indices increase)
//! must end up at positions `num_computed + 0, 1, 2, ...`:
//!
//! ```text
//!  tree rows (position = num_computed + i):   [r0 r1 r2 r3 r4 r5 r6]
//!  accepted path: nodes 0, 2, 5                 ^     ^        ^
//!  moves, in order:   pos(2) -> pos(1),  pos(5) -> pos(2)
//!  after:                                     [r0 r2 r5 .. .. .. ..]  (rest truncated)
//! ```
//! Move `j` writes position `num_computed + j` and reads `num_computed + a_j` with
//! `a_j >= j`. Every later source `a_k` (k > j) satisfies `a_k > a_j >= j`, so applying the
//! moves in order never overwrites a row that is still to be read.

use crate::{BlockTable, KvError, KvMove};

/// The row moves that put the accepted tree nodes `accepted` (strictly increasing node
/// indices) at consecutive positions from `num_computed`, in the order they must be applied.
/// Nodes already in place produce no move. Errors when the path is not strictly increasing
/// or reaches past the table.
pub fn plan_compaction(
    table: &BlockTable,
    block_size: usize,
    num_computed: usize,
    accepted: &[usize],
) -> Result<Vec<KvMove>, KvError> {
    let mut moves = Vec::new();
    let mut previous: Option<usize> = None;
    for (j, &node) in accepted.iter().enumerate() {
        if previous.is_some_and(|p| node <= p) {
            return Err(KvError::InvalidPath(format!(
                "accepted nodes must increase, got {accepted:?}"
            )));
        }
        previous = Some(node);
        if node == j {
            continue;
        }
        let slot = |position: usize| {
            table
                .slot(position, block_size)
                .ok_or_else(|| KvError::InvalidPath(format!("position {position} past table")))
        };
        moves.push(KvMove::full(
            slot(num_computed + node)?,
            slot(num_computed + j)?,
        ));
    }
    Ok(moves)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BlockId, Slot};

    /// Every root path of every tree up to 7 nodes, each node's parent any earlier node.
    fn all_trees(max_nodes: usize) -> Vec<Vec<Option<usize>>> {
        let mut trees: Vec<Vec<Option<usize>>> = vec![vec![None]];
        let mut frontier = trees.clone();
        for _ in 1..max_nodes {
            let mut grown = Vec::new();
            for tree in &frontier {
                for parent in 0..tree.len() {
                    let mut t = tree.clone();
                    t.push(Some(parent));
                    grown.push(t);
                }
            }
            trees.extend(grown.iter().cloned());
            frontier = grown;
        }
        trees
    }

    fn path_to(parents: &[Option<usize>], node: usize) -> Vec<usize> {
        let mut path = vec![node];
        let mut at = node;
        while let Some(p) = parents[at] {
            path.push(p);
            at = p;
        }
        path.reverse();
        path
    }

    #[test]
    fn every_path_of_every_small_tree_compacts_in_order() {
        let block_size = 3;
        // Scattered, non-consecutive blocks so slot arithmetic is exercised.
        let table = BlockTable::from_blocks(vec![BlockId(4), BlockId(0), BlockId(6), BlockId(2)]);
        let trees = all_trees(7);
        assert_eq!(trees.len(), 1 + 1 + 2 + 6 + 24 + 120 + 720);
        let mut checked = 0;
        for num_computed in [0, 2, 5] {
            for parents in &trees {
                for node in 0..parents.len() {
                    // Each prefix of a root path is a possible acceptance.
                    let full = path_to(parents, node);
                    for len in 1..=full.len() {
                        let accepted = &full[..len];
                        let moves =
                            plan_compaction(&table, block_size, num_computed, accepted).unwrap();
                        // Model of the slots: each holds the node id written there.
                        let mut rows: Vec<Option<usize>> = vec![None; 8 * block_size];
                        for i in 0..parents.len() {
                            let slot = table.slot(num_computed + i, block_size).unwrap();
                            rows[slot.index()] = Some(i);
                        }
                        for m in &moves {
                            rows[m.to.index()] = rows[m.from.index()];
                        }
                        for (j, &want) in accepted.iter().enumerate() {
                            let slot = table.slot(num_computed + j, block_size).unwrap();
                            assert_eq!(rows[slot.index()], Some(want), "{parents:?} {accepted:?}");
                        }
                        checked += 1;
                    }
                }
            }
        }
        assert!(checked > 10_000, "checked {checked} paths");
    }

    #[test]
    fn rejects_paths_that_do_not_increase_or_overrun() {
        let table = BlockTable::from_blocks(vec![BlockId(1)]);
        assert!(plan_compaction(&table, 4, 0, &[0, 2, 2]).is_err());
        assert!(plan_compaction(&table, 4, 0, &[0, 5]).is_err());
        assert_eq!(
            plan_compaction(&table, 4, 1, &[0, 2]).unwrap(),
            vec![KvMove::full(Slot(7), Slot(6))]
        );
    }
}
