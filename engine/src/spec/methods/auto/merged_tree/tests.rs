//! Tests of the merged tree: sources merge into one node, paths are priced by the calibrated
//! rates, Token Recycling branches under every node, and a prediction's long chain is
//! trusted more than a match's.

use super::*;

const LIMITS: Limits = Limits {
    max_nodes: 64,
    floor: 0.02,
    recycling_branch: 2,
    recycling_depth: 2,
    recycling_alone: 0,
};

fn trie(paths: &[&[u32]]) -> ContinuationTree {
    let mut trie = ContinuationTree::new();
    for path in paths {
        trie.add(path.iter().copied(), 1.0);
    }
    trie
}

fn context_only(proposal: Proposal<'_>) -> Proposals<'_> {
    Proposals {
        context: Some(proposal),
        ..Proposals::default()
    }
}

/// A matrix of 16 tokens where after each token `t` the model gave `t + step` (mod 16) the
/// logit of each `(step, logit)`.
fn successors(steps: &[(u32, f32)]) -> RecyclingMatrix {
    let matrix = RecyclingMatrix::new(16, 8);
    for token in 0..16u32 {
        let mut logits = vec![0.0f32; 16];
        for &(step, logit) in steps {
            logits[((token + step) % 16) as usize] = logit;
        }
        matrix.update(token, &logits);
    }
    matrix
}

fn tokens(tree: &MergedTree) -> Vec<u32> {
    (0..tree.candidates.len())
        .map(|i| tree.candidates.token(i))
        .collect()
}

#[test]
fn sources_proposing_the_same_node_merge_and_raise_it() {
    let calibration = Calibration::new();
    let context = trie(&[&[1, 2, 3], &[1, 2, 3], &[7]]);
    let global = trie(&[&[1, 2, 4]]);
    let mut tree = MergedTree::default();
    let proposal = |trie| Proposal { trie, evidence: 3 };
    let only = Proposals {
        context: Some(proposal(&context)),
        ..Proposals::default()
    };
    tree.grow(&[0], &only, None, &calibration, LIMITS);
    let alone = tree.p[0];
    assert_eq!(tree.candidates.token(0), 1);
    let both = Proposals {
        global: Some(proposal(&global)),
        ..only
    };
    tree.grow(&[0], &both, None, &calibration, LIMITS);
    assert_eq!(tree.candidates.token(0), 1);
    assert!(
        tree.p[0] > alone,
        "two sources agree: {} <= {alone}",
        tree.p[0]
    );
    let first = tree.cells[0];
    assert!(first[Source::Context as usize].is_some());
    assert!(first[Source::Global as usize].is_some());
    assert!(first[Source::Recycling as usize].is_none());
    // Every token of both tries is there once; paths never gain probability downwards and
    // the expected acceptance is their running sum.
    let mut all = tokens(&tree);
    all.sort_unstable();
    assert_eq!(all, [1, 2, 3, 4, 7]);
    for i in 0..tree.candidates.len() {
        if let Some(parent) = tree.candidates.parent(i) {
            assert!(parent < i && tree.p[parent] >= tree.p[i]);
        }
        let sum: f32 = tree.p[..=i].iter().sum();
        assert!((tree.expected[i] - sum).abs() < 1e-5);
    }
}

#[test]
fn calibration_learns_what_each_kind_of_proposal_is_worth() {
    let calibration = Calibration::new();
    let context = trie(&[&[1, 2, 3, 4, 5, 6]]);
    let proposal = Proposal {
        trie: &context,
        evidence: 2,
    };
    let mut tree = MergedTree::default();
    tree.grow(&[0], &context_only(proposal), None, &calibration, LIMITS);
    let before = tree.expected.last().copied().unwrap_or(0.0);
    // Every one of these proposals accepted: the whole chain is expected to be.
    for _ in 0..200 {
        for cell in tree.cells.iter().flatten().flatten() {
            calibration.record(*cell, true);
        }
    }
    tree.grow(&[0], &context_only(proposal), None, &calibration, LIMITS);
    let after = tree.expected.last().copied().unwrap_or(0.0);
    assert_eq!(tree.candidates.len(), 6);
    assert!(after > 5.5 && after > before, "{before} -> {after}");
    // Rejected from then on: its nodes fall below the floor and are not drafted.
    for _ in 0..4000 {
        for cell in tree.cells.iter().flatten().flatten() {
            calibration.record(*cell, false);
        }
    }
    tree.grow(&[0], &context_only(proposal), None, &calibration, LIMITS);
    assert!(tree.candidates.len() <= 1, "{:?}", tokens(&tree));
    // Another kind of proposal (a longer match) kept its own record.
    let longer = Proposal {
        trie: &context,
        evidence: 5,
    };
    tree.grow(&[0], &context_only(longer), None, &calibration, LIMITS);
    assert!(tree.candidates.len() >= 2);
}

#[test]
fn recycling_branches_and_extends_what_a_match_proposes_and_drafts_alone_where_allowed() {
    let calibration = Calibration::new();
    let matrix = successors(&[(1, 2.0), (5, 1.0)]);
    let mut tree = MergedTree::default();
    // Nothing matches: no tree, unless recycling may draft alone.
    tree.grow(
        &[0],
        &Proposals::default(),
        Some(&matrix),
        &calibration,
        LIMITS,
    );
    assert!(tree.candidates.is_empty());
    let alone = Limits {
        recycling_alone: 2,
        ..LIMITS
    };
    tree.grow(
        &[0],
        &Proposals::default(),
        Some(&matrix),
        &calibration,
        alone,
    );
    let all = tokens(&tree);
    // 1 and 5 after 0, then (what clears the floor of) 2 and 6 after 1, 6 and 10 after 5;
    // never a third level.
    for token in [1, 5, 2] {
        assert!(all.contains(&token), "{token} missing from {all:?}");
    }
    for i in 0..tree.candidates.len() {
        let parent = tree.candidates.parent(i);
        assert!(
            parent.is_none_or(|p| tree.candidates.parent(p).is_none()),
            "{all:?}"
        );
    }
    let alone_rate = tree.p[0];
    assert!(tree
        .cells
        .iter()
        .all(|c| c[Source::Recycling as usize].is_some_and(|c| c.evidence() >= ALONE)));
    // A match proposes 9 then 9: recycling branches beside it (1 and 5 after 0, 10 and 14
    // after 9) and extends past its end, two levels at most.
    let context = trie(&[&[9, 9]]);
    let proposal = Proposal {
        trie: &context,
        evidence: 4,
    };
    tree.grow(
        &[0],
        &context_only(proposal),
        Some(&matrix),
        &calibration,
        LIMITS,
    );
    let all = tokens(&tree);
    for token in [9, 1, 5, 10, 14] {
        assert!(all.contains(&token), "{token} missing from {all:?}");
    }
    let depth = |mut i: usize| {
        let mut d = 1;
        while let Some(p) = tree.candidates.parent(i) {
            i = p;
            d += 1;
        }
        d
    };
    for i in 0..tree.candidates.len() {
        assert!(depth(i) <= 4, "{all:?}");
        let from_match = tree.cells[i][Source::Context as usize].is_some();
        assert!(from_match || tree.cells[i][Source::Recycling as usize].is_some());
    }
    // Under the root only the match's token and recycling's two candidates.
    let roots: Vec<u32> = (0..tree.candidates.len())
        .filter(|&i| tree.candidates.parent(i).is_none())
        .map(|i| tree.candidates.token(i))
        .collect();
    let mut roots_sorted = roots.clone();
    roots_sorted.sort_unstable();
    assert_eq!(roots_sorted, [1, 5, 9]);
    // Beside a match, recycling's first candidate is priced apart from (above) alone.
    let beside = (0..tree.candidates.len())
        .find(|&i| tree.candidates.parent(i).is_none() && tree.candidates.token(i) == 1)
        .map(|i| tree.p[i]);
    assert!(
        beside.is_some_and(|p| p > alone_rate),
        "{beside:?} <= {alone_rate}"
    );
}

#[test]
fn a_prediction_merges_with_a_match_and_its_chain_reaches_deeper() {
    let calibration = Calibration::new();
    let chain: Vec<u32> = (100..160).collect();
    let predicted = trie(&[&chain]);
    let matched = trie(&[&chain[..3], &[100, 7]]);
    let evidence = 5;
    let prediction = Proposal {
        trie: &predicted,
        evidence,
    };
    let context = Proposal {
        trie: &matched,
        evidence,
    };
    let mut tree = MergedTree::default();
    let limits = Limits {
        max_nodes: 160,
        ..LIMITS
    };
    // The same chain: from the prediction, more of it clears the floor than from a match.
    tree.grow(&[0], &context_only(prediction), None, &calibration, limits);
    let as_context = tree.candidates.len();
    let alone = Proposals {
        prediction: Some(prediction),
        ..Proposals::default()
    };
    tree.grow(&[0], &alone, None, &calibration, limits);
    let as_prediction = tree.candidates.len();
    assert!(
        as_prediction > as_context && as_prediction >= 16,
        "{as_prediction} <= {as_context}"
    );
    assert!(tree.cells[0][Source::Prediction as usize].is_some());
    // With a match proposing its first three tokens (and a branch of its own): one chain,
    // its first nodes proposed by both, the branch beside it.
    let merged = Proposals {
        context: Some(context),
        ..alone
    };
    tree.grow(&[0], &merged, None, &calibration, limits);
    let all = tokens(&tree);
    assert_eq!(all.iter().filter(|&&t| t == 100).count(), 1, "{all:?}");
    assert!(all.contains(&7), "{all:?}");
    let both = |i: usize| {
        tree.cells[i][Source::Prediction as usize].is_some()
            && tree.cells[i][Source::Context as usize].is_some()
    };
    let first = (0..tree.candidates.len())
        .filter(|&i| tree.candidates.parent(i).is_none())
        .find(|&i| tree.candidates.token(i) == 100);
    assert!(first.is_some_and(both), "{all:?}");
    assert_eq!((0..tree.candidates.len()).filter(|&i| both(i)).count(), 3);
    assert_eq!(Source::Prediction.method(), SpecMethod::Prediction);
}

#[test]
fn a_sources_proposals_that_others_share_are_calibrated_apart_from_its_own() {
    let calibration = Calibration::new();
    // After 0 the matrix's first candidate is always 1.
    let matrix = successors(&[(1, 2.0)]);
    let agrees = trie(&[&[1]]);
    let differs = trie(&[&[2]]);
    let proposal = |trie| Proposal { trie, evidence: 3 };
    let mut tree = MergedTree::default();
    let p_of = |tree: &MergedTree, token: u32| {
        (0..tree.candidates.len())
            .find(|&i| tree.candidates.parent(i).is_none() && tree.candidates.token(i) == token)
            .map(|i| tree.p[i])
    };
    // Where the match continues with 1 too, 1 is accepted; where the match continues with
    // 2, the matrix's 1 is rejected (and the match's 2 accepted).
    for _ in 0..300 {
        for (trie, accepted) in [(&agrees, 1), (&differs, 2)] {
            tree.grow(
                &[0],
                &context_only(proposal(trie)),
                Some(&matrix),
                &calibration,
                LIMITS,
            );
            for (i, cells) in tree.cells.iter().enumerate() {
                if tree.candidates.parent(i).is_none() {
                    let hit = tree.candidates.token(i) == accepted;
                    for cell in cells.iter().flatten() {
                        calibration.record(*cell, hit);
                    }
                }
            }
        }
    }
    tree.grow(
        &[0],
        &context_only(proposal(&agrees)),
        Some(&matrix),
        &calibration,
        LIMITS,
    );
    let shared = p_of(&tree, 1).expect("1 is drafted where both propose it");
    tree.grow(
        &[0],
        &context_only(proposal(&differs)),
        Some(&matrix),
        &calibration,
        LIMITS,
    );
    let own = p_of(&tree, 1).unwrap_or(0.0);
    let matched = p_of(&tree, 2).expect("the match's 2 is drafted");
    // Pooled, the matrix's first candidate would read about one in two either way.
    assert!(shared > 0.9, "proposed by both: {shared}");
    assert!(own < 0.1, "proposed by the matrix alone: {own}");
    assert!(matched > 0.9, "{matched}");
}

#[test]
fn recycling_reads_the_row_keyed_by_the_paths_last_tokens_first() {
    let calibration = Calibration::new();
    let matrix = RecyclingMatrix::new(16, 8);
    let top = |token: usize| {
        let mut logits = vec![0.0f32; 16];
        logits[token] = 2.0;
        logits
    };
    // After 7 then 1 the model said 9, and after 9 (following 7, 1) it said 11; its last
    // word after 1 alone was 5, and after 9 alone 3.
    matrix.update_after(&[7], 1, &top(9));
    matrix.update_after(&[7, 1], 9, &top(11));
    matrix.update(1, &top(5));
    matrix.update(9, &top(3));
    let alone = Limits {
        recycling_alone: 2,
        recycling_branch: 1,
        ..LIMITS
    };
    let mut tree = MergedTree::default();
    let none = Proposals::default();
    tree.grow(&[7, 1], &none, Some(&matrix), &calibration, alone);
    assert_eq!(tokens(&tree), [9, 11]);
    let keyed = tree.cells[0][Source::Recycling as usize].expect("recycled");
    tree.grow(&[4, 1], &none, Some(&matrix), &calibration, alone);
    assert_eq!(tokens(&tree), [5]);
    let own = tree.cells[0][Source::Recycling as usize].expect("recycled");
    // Rows keyed by more tokens are calibrated apart, and trusted more at first.
    assert_ne!(keyed, own);
    assert!(calibration.rate(keyed) > calibration.rate(own));
}
