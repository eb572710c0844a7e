//! Tests of `auto`'s merged drafter: its own context, the global index and the matrix as
//! sources, outcomes counted per source, and calibration shared engine-wide.

use super::*;
use crate::spec::methods::suffix::global::{SuffixIndexes, DEFAULT_BUDGET};
use crate::spec::methods::suffix::SuffixSpeculator;
use crate::spec::speculator::SeenRequest;

fn auto(indexes: Option<SharedIndexes>, matrix: RecyclingMatrix) -> AutoSpeculator {
    AutoSpeculator::new(Arc::new(RecyclingMatrices::new(matrix)), indexes)
}

fn drafter(s: &AutoSpeculator, tokens: &[u32]) -> Box<dyn Drafter> {
    s.drafter(&NewSequence {
        tokens,
        prompt_len: tokens.len(),
        prediction: None,
        cache_scope: None,
    })
    .expect("auto drafts for every sequence")
}

/// Verifies `d`'s tree of `budget` nodes against `truth` (what the model would output next):
/// the accepted nodes follow it from the root.
fn verify(d: &mut dyn Drafter, tokens: &[u32], budget: usize, truth: &[u32]) -> usize {
    let ctx = DraftContext { tokens };
    d.prepare(&ctx);
    let tree = d.draft(&ctx, budget);
    let mut accepted = vec![0usize];
    for &want in truth {
        let at = *accepted.last().unwrap_or(&0);
        match (1..tree.len()).find(|&n| tree.parents()[n] == Some(at) && tree.tokens()[n] == want) {
            Some(n) => accepted.push(n),
            None => break,
        }
    }
    d.record(tree.len() - 1, accepted.len() - 1);
    d.verified(&tree, &accepted);
    accepted.len() - 1
}

#[test]
fn a_repeating_context_drafts_its_continuation_counted_as_context() {
    let s = auto(None, RecyclingMatrix::new(64, 8));
    let tokens: Vec<u32> = (0..40).map(|i| i % 10).collect();
    let mut d = drafter(&s, &tokens);
    let accepted = verify(d.as_mut(), &tokens, 8, &[0, 1, 2, 3, 4, 5]);
    assert!(accepted >= 4, "accepted {accepted}");
    let outcomes = d.source_outcomes();
    assert_eq!(outcomes.len(), 1, "{outcomes:?}");
    assert_eq!(outcomes[0].method, SpecMethod::Context);
    assert_eq!(outcomes[0].accepted(), accepted);
    assert!(d.expected_accepted().is_some_and(|e| !e.is_empty()));
}

#[test]
fn what_another_request_sent_drafts_through_the_global_index() {
    let mut suffix = SuffixSpeculator::new(SuffixIndexes::new(DEFAULT_BUDGET, None));
    let earlier: Vec<u32> = (100..140).collect();
    suffix.admitted(&SeenRequest {
        tokens: &earlier,
        prompt_len: earlier.len(),
        cache_scope: None,
    });
    let s = auto(Some(suffix.shared()), RecyclingMatrix::new(256, 8));
    let tokens = [1, 2, 3, 110, 111, 112, 113];
    let mut d = drafter(&s, &tokens);
    let accepted = verify(d.as_mut(), &tokens, 8, &[114, 115, 116, 117, 118]);
    assert!(accepted >= 3, "accepted {accepted}");
    assert!(d
        .source_outcomes()
        .iter()
        .any(|o| o.method == SpecMethod::SuffixIndex && o.accepted() == accepted));
    // Without the index, nothing in the sequence's own tokens predicts it.
    let alone = auto(None, RecyclingMatrix::new(256, 8));
    let mut d = drafter(&alone, &tokens);
    assert_eq!(d.prepare(&DraftContext { tokens: &tokens }), 0);
}

#[test]
fn rejections_lower_the_price_for_every_sequence_of_the_engine() {
    let s = auto(None, RecyclingMatrix::new(64, 8));
    let tokens: Vec<u32> = (0..40).map(|i| i % 10).collect();
    let ctx = DraftContext { tokens: &tokens };
    let mut first = drafter(&s, &tokens);
    first.prepare(&ctx);
    let before = first.expected_accepted().map_or(0.0, |e| e[e.len() - 1]);
    // The model never follows the context here.
    for _ in 0..300 {
        verify(first.as_mut(), &tokens, 8, &[50]);
    }
    let mut next = drafter(&s, &tokens);
    next.prepare(&ctx);
    let after = next
        .expected_accepted()
        .map_or(0.0, |e| e.last().copied().unwrap_or(0.0));
    assert!(after < before / 2.0, "{before} -> {after}");
}

#[test]
fn a_prediction_is_one_more_source_of_the_same_tree() {
    let s = auto(None, RecyclingMatrix::new(256, 8));
    // The prompt holds 30..40 once; the prediction is 50..120 with 30..34 inside it.
    let prompt: Vec<u32> = (30..40).collect();
    let prediction: Vec<u32> = (50..60).chain(30..34).chain(60..120).collect();
    let prediction = Arc::new(Prediction::new(prediction.into()));
    let new = |tokens: &[u32], prediction: Option<&Arc<Prediction>>| {
        s.drafter(&NewSequence {
            tokens,
            prompt_len: prompt.len(),
            prediction,
            cache_scope: None,
        })
        .expect("auto drafts for every sequence")
    };
    assert!(!new(&prompt, None).drafts_prediction());
    let mut d = new(&prompt, Some(&prediction));
    assert!(d.drafts_prediction(), "auto merges the prediction itself");
    // The output follows the prediction: its chain, counted as the prediction's.
    let mut tokens = prompt.clone();
    tokens.extend(50..53);
    let accepted = verify(d.as_mut(), &tokens, 32, &(53..60).collect::<Vec<_>>());
    assert_eq!(accepted, 7);
    let outcomes = d.source_outcomes().to_vec();
    assert!(
        outcomes
            .iter()
            .any(|o| o.method == SpecMethod::Prediction
                && o.accepted_at == (1..=7).collect::<Vec<_>>()),
        "{outcomes:?}"
    );
    // Where it reaches 30..34 the prompt's own 30..40 proposes the same first tokens: those
    // nodes count for both sources, and the tree holds both continuations after 33.
    tokens.extend(53..60);
    tokens.extend(30..32);
    let ctx = DraftContext { tokens: &tokens };
    let available = d.prepare(&ctx);
    let tree = d.draft(&ctx, available);
    let after_33: Vec<u32> = (1..tree.len())
        .filter(|&n| tree.parents()[n].is_some_and(|p| tree.tokens()[p] == 33))
        .map(|n| tree.tokens()[n])
        .collect();
    assert!(
        after_33.contains(&34) && after_33.contains(&60),
        "{after_33:?}"
    );
    let accepted = verify(d.as_mut(), &tokens, available, &[32, 33, 60, 61]);
    assert_eq!(accepted, 4);
    let counted = |m: SpecMethod| {
        d.source_outcomes()
            .iter()
            .find(|o| o.method == m)
            .map_or(0, SourceOutcome::accepted)
    };
    assert_eq!(counted(SpecMethod::Prediction), 4);
    assert_eq!(counted(SpecMethod::Context), 2);
}
