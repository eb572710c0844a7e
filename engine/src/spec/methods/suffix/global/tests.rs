//! Tests of the global suffix indexes: scopes, the token budget, and the state file.

use super::*;
use crate::spec::methods::suffix::index::tests::xorshift;
use crate::spec::methods::suffix::index::Occurrences;

fn matches(indexes: &SuffixIndexes, scope: Option<BlockHash>, context: &[u32]) -> usize {
    let mut out = Occurrences::default();
    match indexes.get(scope) {
        Some(index) => index.find(context, &(0..0), &mut out),
        None => return 0,
    }
    out.len
}

#[test]
fn each_scope_sees_only_what_its_requests_sent() {
    let mut indexes = SuffixIndexes::new(DEFAULT_BUDGET, None);
    let (a, b) = (BlockHash::scope(b"a"), BlockHash::scope(b"b"));
    let _ = indexes.learn(&[1, 2, 3, 4], Some(a));
    let _ = indexes.learn(&[5, 6, 7, 8], None);
    assert_eq!(matches(&indexes, Some(a), &[1, 2, 3]), 3);
    assert_eq!(matches(&indexes, None, &[1, 2, 3]), 0);
    assert_eq!(matches(&indexes, Some(b), &[1, 2, 3]), 0);
    assert_eq!(matches(&indexes, None, &[5, 6, 7]), 3);
    assert_eq!(matches(&indexes, Some(a), &[5, 6, 7]), 0);
    // An output is learnt after the end of its prompt.
    indexes.learn_output(&[9, 9, 9, 10, 11, 12], 3, Some(b));
    assert_eq!(matches(&indexes, Some(b), &[9, 9, 10, 11]), 4);
    assert_eq!(indexes.counts().requests, 3);
}

#[test]
fn the_budget_evicts_whole_requests_oldest_first_across_scopes() {
    let mut indexes = SuffixIndexes::new(100, None);
    let a = BlockHash::scope(b"a");
    let _ = indexes.learn(&[1; 30], None);
    let _ = indexes.learn(&[2; 30], Some(a));
    let _ = indexes.learn(&[3; 30], None);
    assert_eq!(indexes.counts().tokens, 93);
    assert_eq!(indexes.counts().evictions, 0);
    let _ = indexes.learn(&[4; 30], Some(a));
    // 124 > 100: the oldest request (the first, unsalted) goes.
    let counts = indexes.counts();
    assert_eq!(
        (counts.tokens, counts.requests, counts.evictions),
        (93, 3, 1)
    );
    assert_eq!(matches(&indexes, None, &[1, 1]), 0);
    assert_eq!(matches(&indexes, None, &[3, 3]), 2);
    assert_eq!(matches(&indexes, Some(a), &[2, 2]), 2);
    // A request longer than the budget keeps its end.
    let long: Vec<u32> = (0..500).collect();
    let _ = indexes.learn(&long, None);
    let counts = indexes.counts();
    assert_eq!((counts.tokens, counts.requests), (100, 1));
    assert_eq!(matches(&indexes, None, &[480, 481]), 2);
    assert_eq!(matches(&indexes, None, &[10, 11]), 0);
    // Emptied salts lose their index.
    assert!(indexes.get(Some(a)).is_none());
}

#[test]
fn a_prompt_is_found_where_it_was_learnt() {
    let mut indexes = SuffixIndexes::new(DEFAULT_BUDGET, None);
    let a = Some(BlockHash::scope(b"a"));
    let _ = indexes.learn(&[9, 9], None);
    indexes.learn_prompt(&[1, 2, 3], None);
    indexes.learn_prompt(&[1, 2, 3], a);
    assert_eq!(indexes.own_prompt(&[1, 2, 3], None), 3..7);
    assert_eq!(indexes.own_prompt(&[1, 2, 3], a), 0..4);
    assert_eq!(indexes.own_prompt(&[1, 2], None), 0..0);
    // Passed over, the prompt's own occurrence matches nothing.
    let mut out = Occurrences::default();
    let index = indexes.get(None).expect("unsalted");
    index.find(&[1, 2], &(3..7), &mut out);
    assert_eq!(out.len, 0);
    index.find(&[1, 2], &(0..0), &mut out);
    assert_eq!(out.len, 2);
}

#[test]
fn a_zero_budget_learns_nothing() {
    let mut indexes = SuffixIndexes::new(0, None);
    let _ = indexes.learn(&[1, 2, 3], None);
    assert!(!indexes.enabled());
    assert_eq!(indexes.counts().tokens, 0);
}

#[test]
fn at_most_so_many_salts_have_an_index() {
    let mut indexes = SuffixIndexes::new(DEFAULT_BUDGET, None);
    for i in 0..=MAX_SALTED_INDEXES {
        let _ = indexes.learn(&[7, 8, 9], Some(BlockHash::scope(i.to_string().as_bytes())));
    }
    assert!(indexes.get(Some(BlockHash::scope(b"0"))).is_none());
    assert!(indexes.get(Some(BlockHash::scope(b"1"))).is_some());
    assert_eq!(indexes.counts().evictions, 1);
}

#[test]
fn the_unsalted_index_survives_a_restart_through_its_state_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("suffix.bin");
    let mut indexes = SuffixIndexes::new(DEFAULT_BUDGET, Some(path.clone()));
    let _ = indexes.learn(&[1, 2, 3, 4], None);
    let _ = indexes.learn(&[5, 6, 7], Some(BlockHash::scope(b"s")));
    let _ = indexes.learn(&[8, 9, 10], None);
    indexes.save();
    let again = SuffixIndexes::new(DEFAULT_BUDGET, Some(path.clone()));
    assert_eq!(matches(&again, None, &[2, 3]), 2);
    assert_eq!(matches(&again, None, &[8, 9]), 2);
    assert_eq!(again.counts().requests, 2, "salted requests are not saved");
    // A file that is not a state file is ignored.
    std::fs::write(&path, b"not an index").expect("write");
    let fresh = SuffixIndexes::new(DEFAULT_BUDGET, Some(path));
    assert_eq!(fresh.counts().tokens, 0);
}

#[test]
fn memory_stays_within_the_budget_under_a_long_stream() {
    let budget = 200_000;
    let mut indexes = SuffixIndexes::new(budget, None);
    let scopes = [
        None,
        Some(BlockHash::scope(b"a")),
        Some(BlockHash::scope(b"b")),
    ];
    let mut state = 11u32;
    let mut peak = 0;
    for r in 0..2_000usize {
        let len = 50 + (r * 37) % 900;
        let tokens: Vec<u32> = (0..len).map(|_| xorshift(&mut state) % 49_152).collect();
        let _ = indexes.learn(&tokens, scopes[r % 3]);
        let counts = indexes.counts();
        assert!(counts.tokens <= budget, "{counts:?}");
        peak = peak.max(counts.bytes);
    }
    let counts = indexes.counts();
    assert!(counts.evictions > 1_000, "{counts:?}");
    // About 33 bytes a token held, plus a partly filled chunk per index: never above 64
    // bytes a token of the budget.
    assert!(peak <= 64 * budget, "peak {peak} bytes for {budget} tokens");
}
