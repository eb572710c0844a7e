//! Tests of the `suffix` drafter and its speculator.

use super::*;
use crate::spec::methods::suffix::global::DEFAULT_BUDGET;

fn speculator() -> SuffixSpeculator {
    SuffixSpeculator::new(SuffixIndexes::new(DEFAULT_BUDGET, None))
}

fn drafter(s: &SuffixSpeculator, tokens: &[u32], scope: Option<BlockHash>) -> Box<dyn Drafter> {
    s.drafter(&NewSequence {
        tokens,
        prompt_len: tokens.len(),
        prediction: None,
        cache_scope: scope,
    })
    .expect("suffix drafts for every sequence")
}

fn draft(d: &mut dyn Drafter, tokens: &[u32], budget: usize) -> Vec<u32> {
    let ctx = DraftContext { tokens };
    d.prepare(&ctx);
    d.draft(&ctx, budget).tokens()[1..].to_vec()
}

fn seen(tokens: &[u32], prompt_len: usize, scope: Option<BlockHash>) -> SeenRequest<'_> {
    SeenRequest {
        tokens,
        prompt_len,
        cache_scope: scope,
    }
}

#[test]
fn a_finished_output_is_drafted_for_the_next_request_of_its_scope_only() {
    let mut s = speculator();
    let output: Vec<u32> = (100..140).collect();
    let mut first = vec![1, 2, 3, 4];
    first.extend(&output);
    s.admitted(&seen(&first[..4], 4, None));
    s.finished(&seen(&first, 4, None));
    // A new request whose recent tokens are the output's start drafts the rest.
    let tokens = [7, 8, 100, 101, 102, 103];
    let mut d = drafter(&s, &tokens, None);
    let drafted = draft(d.as_mut(), &tokens, 6);
    assert_eq!(drafted, [104, 105, 106, 107, 108, 109]);
    assert!(d.evidence() >= 8, "the global index contributed");
    // A request with a salt sees nothing of it.
    let salted = Some(BlockHash::scope(b"other"));
    let mut d = drafter(&s, &tokens, salted);
    assert!(draft(d.as_mut(), &tokens, 6).is_empty());
}

#[test]
fn the_own_context_drafts_without_the_global_index() {
    let s = SuffixSpeculator::new(SuffixIndexes::new(0, None));
    let tokens = [5, 6, 7, 8, 9, 1, 2, 5, 6, 7];
    let mut d = drafter(&s, &tokens, None);
    assert_eq!(draft(d.as_mut(), &tokens, 3), [8, 9, 1]);
    assert!(d.evidence() < 8);
    // Nothing repeats: nothing to draft.
    let fresh = [1, 2, 3, 4];
    let mut d = drafter(&s, &fresh, None);
    assert!(draft(d.as_mut(), &fresh, 3).is_empty());
}

#[test]
fn several_continuations_make_a_tree_heaviest_first() {
    // (Global matches shorter than four tokens do not draft.)
    let mut s = speculator();
    for (tail, n) in [(50u32, 3), (60, 1)] {
        for _ in 0..n {
            let tokens = [10, 11, 12, 13, tail, tail + 1];
            s.admitted(&seen(&tokens, 6, None));
        }
    }
    let tokens = [1, 10, 11, 12, 13];
    let mut d = drafter(&s, &tokens, None);
    let ctx = DraftContext { tokens: &tokens };
    assert!(d.prepare(&ctx) >= 4);
    let tree = d.draft(&ctx, 4);
    // 50 (3 of 4) then its child 51, then 60 (1 of 4) beside it, then 61.
    assert_eq!(tree.tokens(), &[13, 50, 51, 60, 61]);
    assert_eq!(tree.parents(), &[None, Some(0), Some(1), Some(0), Some(3)]);
}
