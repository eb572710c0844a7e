//! Tests of Token Recycling: its static tree, its matrix and rows in context, salts, and
//! the drafter's walk.

use super::*;

/// Ten logits whose largest is `best`'s and second largest `second`'s.
fn row(best: usize, second: usize) -> Vec<f32> {
    let mut l = vec![0.0; 10];
    l[best] = 2.0;
    l[second] = 1.0;
    l
}

#[test]
fn the_paper_tree_has_80_nodes_best_first() {
    let tree = StaticTree::paper();
    assert_eq!(tree.len(), 80);
    assert!(tree
        .parents
        .iter()
        .enumerate()
        .all(|(i, p)| p.is_none_or(|p| p < i)));
    assert_eq!(tree.parents.iter().filter(|p| p.is_none()).count(), 8);
    // The first three nodes are the chain of first candidates, then the root's second.
    assert_eq!(&tree.parents[..4], &[None, Some(0), Some(1), None]);
    assert_eq!(&tree.ranks[..4], &[0, 0, 0, 1]);
    // The same nodes as the file's tree, in another order.
    let mut given = StaticTree::from_json(TREE_JSON)
        .expect("the paper tree parses")
        .paths();
    let mut ordered = tree.paths();
    given.sort();
    ordered.sort();
    assert_eq!(given, ordered);
}

#[test]
fn matrix_keeps_the_top_k_and_round_trips_through_a_file() {
    let m = RecyclingMatrix::new(10, 3);
    assert_eq!(m.candidates(4), None);
    m.update(4, &[0.0, 5.0, 1.0, 9.0, 2.0, 0.5, 3.0, 0.0, 0.0, 0.0]);
    assert_eq!(m.candidates(4), Some(vec![3, 1, 6]));
    assert_eq!(m.candidate(4, 1), Some(1));
    assert_eq!(m.candidate(4, 3), None);
    assert_eq!(m.filled_rows(), 1);
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("m.bin");
    m.save(&path).expect("saved");
    assert_eq!(RecyclingMatrix::load(&path, 10, 3).expect("loaded"), m);
    assert!(RecyclingMatrix::load(&path, 11, 3).is_err());
    std::fs::write(&path, b"junk").expect("written");
    assert!(RecyclingMatrix::load(&path, 10, 3).is_err());
}

#[test]
fn a_salted_sequence_drafts_only_from_its_salts_rows() {
    let mut spec = RecyclingSpeculator::new(10, None);
    let a = Some(BlockHash::scope(b"a"));
    let mut logits = vec![0.0; 10];
    logits[2] = 2.0;
    logits[3] = 1.0;
    spec.observe_row(&ObservedRow {
        token: 1,
        logits: &logits,
        cache_scope: a,
        before: Default::default(),
    });
    let tokens = [7, 1];
    let ctx = DraftContext { tokens: &tokens };
    let candidates = |scope| {
        let new = NewSequence {
            tokens: &tokens,
            prompt_len: 1,
            prediction: None,
            cache_scope: scope,
        };
        spec.drafter(&new).expect("recycling drafts").prepare(&ctx)
    };
    assert!(candidates(a) > 0);
    assert_eq!(candidates(None), 0);
    assert_eq!(candidates(Some(BlockHash::scope(b"b"))), 0);
    assert!(spec.wants_logits(1, None));
    assert!(!spec.wants_logits(1, a));
}

#[test]
fn rows_in_context_answer_before_the_tokens_own_row() {
    let m = RecyclingMatrix::new(10, 2);
    // 3 after 1 2 3 was followed by 4; after 5 2 3 by 6; 3 last seen after 7 8.
    m.update_after(&[1, 2], 3, &row(4, 0));
    m.update_after(&[5, 2], 3, &row(6, 0));
    m.update_after(&[7, 8], 3, &row(9, 0));
    assert_eq!(m.candidate_in(&[1, 2, 3], 0), Some((4, 3)));
    assert_eq!(m.candidate_in(&[5, 2, 3], 0), Some((6, 3)));
    // Unknown three tokens: the row after the last two (the last write: 5 2 3's).
    assert_eq!(m.candidate_in(&[0, 2, 3], 0), Some((6, 2)));
    assert_eq!(m.candidate_in(&[2, 3], 0), Some((6, 2)));
    // Unknown two tokens: the token's own row.
    assert_eq!(m.candidate_in(&[0, 0, 3], 0), Some((9, 1)));
    assert_eq!(m.candidate_in(&[3], 1), Some((0, 1)));
    assert_eq!(m.candidate_in(&[1, 2, 4], 0), None);
    assert_eq!(m.candidate_in(&[], 0), None);
    // Nothing before the token: its own row only.
    m.update_after(&[], 4, &row(5, 0));
    assert_eq!(m.candidate_in(&[2, 3, 4], 0), Some((5, 1)));
}

#[test]
fn a_tree_walks_the_rows_after_each_nodes_path() {
    let m = RecyclingMatrix::new(10, 2);
    // After 7 1 the model said 2 (and 3); after 7 1 2, 5; then after 1 2, 4 (the row
    // after 1 2 that 7 1 2 also wrote is overwritten); 2 alone: 8.
    m.update_after(&[7], 1, &row(2, 3));
    m.update_after(&[7, 1], 2, &row(5, 0));
    m.update_after(&[1], 2, &row(4, 0));
    m.update_after(&[], 2, &row(8, 0));
    let tree = StaticTree::from_json(r#"{"paths": [[0], [1], [0, 0]]}"#).expect("tree");
    let mut d = TokenRecycling::new(Arc::new(m), Arc::new(tree));
    let tokens = [6, 7, 1];
    let ctx = DraftContext { tokens: &tokens };
    assert_eq!(d.prepare(&ctx), 3);
    // The root's row was keyed by 7 1; under 2, the row after 7 1 2.
    assert_eq!(d.evidence(), 2);
    let t = d.draft(&ctx, 3);
    assert_eq!(t.tokens(), &[1, 2, 3, 5]);
    assert_eq!(t.parents(), &[None, Some(0), Some(0), Some(1)]);
    // Another token before 1: its own row, and under 2 the row after 1 2.
    let tokens = [6, 0, 1];
    let ctx = DraftContext { tokens: &tokens };
    assert_eq!(d.prepare(&ctx), 3);
    assert_eq!(d.evidence(), 1);
    assert_eq!(d.draft(&ctx, 3).tokens(), &[1, 2, 3, 4]);
}

#[test]
fn drafts_follow_the_matrix_breadth_first() {
    let m = RecyclingMatrix::new(10, 2);
    m.update(1, &row(2, 3));
    m.update(2, &row(4, 5));
    let tree =
        StaticTree::from_json(r#"{"paths": [[0], [1], [0, 0], [1, 0], [0, 0, 0]]}"#).expect("tree");
    let mut d = TokenRecycling::new(Arc::new(m), Arc::new(tree));
    let tokens = [7, 1];
    let ctx = DraftContext { tokens: &tokens };
    // Root 1 -> [2, 3]; 2 -> [4]; 3 has no row; 4 has no row.
    assert_eq!(d.prepare(&ctx), 3);
    let t = d.draft(&ctx, 3);
    assert_eq!(t.tokens(), &[1, 2, 3, 4]);
    assert_eq!(t.parents(), &[None, Some(0), Some(0), Some(1)]);
}

impl StaticTree {
    /// Every node's path of ranks from the root.
    fn paths(&self) -> Vec<Vec<usize>> {
        let mut paths: Vec<Vec<usize>> = Vec::with_capacity(self.len());
        for (&parent, &rank) in self.parents.iter().zip(&self.ranks) {
            let mut path = parent.map_or_else(Vec::new, |p| paths[p].clone());
            path.push(rank);
            paths.push(path);
        }
        paths
    }
}
