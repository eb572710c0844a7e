//! The prediction drafter's alignment: following a prediction, rejoining it after an
//! insertion or a replaced line, two branches merged into one tree in the order they are
//! worth drafting, and the prediction going before the wrapped drafter only where the
//! output follows it.

use std::sync::Arc;

use super::*;
use crate::spec::methods::prompt_lookup::PromptLookup;

const PROMPT: [u32; 3] = [900, 901, 902];

fn drafter(prediction: &[u32]) -> PredictionDrafter {
    let prediction = Arc::new(Prediction::new(prediction.into()));
    PredictionDrafter::new(prediction, PROMPT.len())
}

fn tokens(output: &[u32]) -> Vec<u32> {
    PROMPT.iter().chain(output).copied().collect()
}

/// The draft tree's tokens under the root, for `budget` nodes.
fn drafted(d: &mut PredictionDrafter, output: &[u32], budget: usize) -> Vec<u32> {
    let all = tokens(output);
    let ctx = DraftContext { tokens: &all };
    let available = d.prepare(&ctx);
    d.draft(&ctx, budget.min(available)).tokens()[1..].to_vec()
}

#[test]
fn follows_the_prediction_from_its_first_token() {
    let prediction: Vec<u32> = (10..200).collect();
    let mut d = drafter(&prediction);
    assert_eq!(drafted(&mut d, &[10], 5), vec![11, 12, 13, 14, 15]);
    // The output starts to follow the prediction from its start: a level of its own.
    assert_eq!(d.evidence(), level(1, true));
    assert!(level(1, true) > level(1, false));
    assert_eq!(
        drafted(&mut d, &[10, 11, 12, 13, 14, 15, 16], 3),
        vec![17, 18, 19]
    );
    assert_eq!(d.evidence(), level(7, true));
    assert_eq!(d.anchor(), 7);
    // Far from the anchor the same length is weaker evidence; from 8 tokens on, the length
    // alone counts.
    assert_eq!(drafted(&mut d, &[10, 11, 150, 151], 2), vec![152, 153]);
    assert_eq!(d.evidence(), level(2, false));
    assert_eq!(level(9, true), level(9, false));
    // Nothing before the output is matched: with no output there is nothing to draft.
    let mut fresh = drafter(&prediction);
    let all = tokens(&[]);
    assert_eq!(fresh.prepare(&DraftContext { tokens: &all }), 0);
    assert_eq!(fresh.evidence(), 0);
    // The end of the prediction: nothing follows.
    assert_eq!(drafted(&mut d, &prediction, 4), Vec::<u32>::new());
}

#[test]
fn an_insertion_rejoins_where_the_output_left() {
    // A B C D E F G H; the output inserts X Y after C.
    let prediction = [1, 2, 3, 4, 5, 6, 7, 8];
    let mut d = drafter(&prediction);
    assert_eq!(drafted(&mut d, &[1, 2, 3], 2), vec![4, 5]);
    assert_eq!(d.anchor(), 3);
    // Y occurs nowhere: the anchor's branch alone, on the weakest evidence.
    assert_eq!(drafted(&mut d, &[1, 2, 3, 50, 51], 3), vec![4, 5, 6]);
    assert_eq!(d.evidence(), level(0, false));
    // D rejoins: the match continues after it.
    assert_eq!(drafted(&mut d, &[1, 2, 3, 50, 51, 4], 2)[..2], [5, 6]);
}

#[test]
fn a_replaced_line_continues_at_the_next_line() {
    // Lines "a = 1 \n", "b = 2 \n", "c = 3 \n" with NL = 0, "=" = 9.
    let (nl, eq) = (0, 9);
    let prediction = [20, eq, 1, nl, 21, eq, 2, nl, 22, eq, 3, nl];
    let mut d = drafter(&prediction);
    // Following up to "b =": the anchor is at "2".
    assert!(!drafted(&mut d, &[20, eq, 1, nl, 21, eq], 1).is_empty());
    assert_eq!(d.anchor(), 6);
    // "5" instead of "2", then a newline: the newline nearest after the anchor is the one
    // ending the replaced line, so the best branch is the next line; the second branch
    // rejoins at the anchor (the old line's rest).
    let out = [20, eq, 1, nl, 21, eq, 5, nl];
    let tree_tokens = drafted(&mut d, &out, 64);
    assert_eq!(tree_tokens[..3], [22, eq, 3]);
    assert!(tree_tokens.contains(&2), "{tree_tokens:?}");
    // The next line starts near the anchor: a rejoin.
    assert_eq!(d.evidence(), level(1, true));
}

#[test]
fn two_branches_merge_into_one_tree_best_first() {
    // Sure: the first branch whole, then what the second adds beyond the shared prefix.
    let merged = merge_branches(&[1, 2, 3, 4], &[1, 2, 7, 8], false);
    assert_eq!(
        merged,
        vec![
            (None, 1),
            (Some(0), 2),
            (Some(1), 3),
            (Some(2), 4),
            (Some(1), 7),
            (Some(4), 8)
        ]
    );
    // Unsure: both heads first.
    let first: Vec<u32> = (10..20).collect();
    let second: Vec<u32> = (30..40).collect();
    let merged = merge_branches(&first, &second, true);
    let order: Vec<u32> = merged.iter().map(|n| n.1).collect();
    assert_eq!(order[..8], [10, 11, 12, 13, 30, 31, 32, 33]);
    assert_eq!(order[8..14], [14, 15, 16, 17, 18, 19]);
    // Every parent comes before its child, so any prefix is a tree.
    for (i, (parent, _)) in merged.iter().enumerate() {
        assert!(parent.is_none_or(|p| p < i));
    }
    assert_eq!(merged[4], (None, 30));
    assert_eq!(merged[8], (Some(3), 14));
    // A second branch that is the first one's prefix adds nothing.
    assert_eq!(merge_branches(&[1, 2, 3], &[1, 2], true).len(), 3);
}

#[test]
fn the_prediction_goes_first_only_while_the_output_follows_it() {
    let prediction: Vec<u32> = (10..40).collect();
    let d = drafter(&prediction);
    let mut first = PredictionFirst::new(d, Some(Box::new(PromptLookup::new())));
    // The output follows the prediction: it drafts.
    let out = tokens(&[10, 11, 12]);
    assert!(first.prepare(&DraftContext { tokens: &out }) > 0);
    assert_eq!(first.method(), SpecMethod::Prediction);
    assert!(!first.needs_speculator());
    // The output left it and repeats itself: prompt lookup drafts.
    let out = tokens(&[10, 11, 12, 70, 71, 72, 70, 71]);
    assert!(first.prepare(&DraftContext { tokens: &out }) > 0);
    assert_eq!(first.method(), SpecMethod::PromptLookup);
    assert!(first.needs_speculator());
    // Neither has anything strong: the prediction's rejoining guess.
    let out = tokens(&[10, 11, 12, 80, 81]);
    assert!(first.prepare(&DraftContext { tokens: &out }) > 0);
    assert_eq!(first.method(), SpecMethod::Prediction);
    // Without a wrapped drafter the prediction drafts alone.
    let mut alone = PredictionFirst::new(drafter(&prediction), None);
    let out = tokens(&[10, 11, 12, 80, 81, 82, 80, 81]);
    assert!(alone.prepare(&DraftContext { tokens: &out }) > 0);
    assert_eq!(alone.method(), SpecMethod::Prediction);
}
