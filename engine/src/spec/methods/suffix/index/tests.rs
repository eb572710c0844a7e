//! Tests of the suffix index: matches, continuations, eviction and rehashing.

use super::*;

fn occurrences(index: &SuffixIndex, context: &[u32]) -> Occurrences {
    let mut out = Occurrences::default();
    index.find(context, &(0..0), &mut out);
    out
}

fn continuations(index: &SuffixIndex, found: &Occurrences, depth: usize) -> Vec<Vec<u32>> {
    found
        .at
        .iter()
        .map(|&(at, _)| index.continuation(at, depth).collect())
        .collect()
}

#[test]
fn the_longest_match_wins_and_its_occurrences_come_most_recent_first() {
    let mut index = SuffixIndex::new();
    index.push_request(&[1, 2, 3, 4, 5, 6], 1);
    index.push_request(&[9, 3, 4, 7, 8], 2);
    index.push_request(&[0, 2, 3, 4, 5, 10], 3);
    // `2 3 4` occurs twice (then 5), `3 4` three times: the longer match is kept.
    let found = occurrences(&index, &[8, 8, 2, 3, 4]);
    assert_eq!(found.len, 3);
    assert_eq!(continuations(&index, &found, 8), [vec![5, 10], vec![5, 6]]);
    // A two-token match takes every occurrence, the newest first; depth cuts them.
    let found = occurrences(&index, &[3, 4]);
    assert_eq!(found.len, 2);
    assert_eq!(
        continuations(&index, &found, 1),
        [vec![5], vec![7], vec![5]]
    );
    // Matches never cross a separator, and a match with nothing after it is no use.
    assert_eq!(occurrences(&index, &[6, 9]).len, 0);
    assert_eq!(occurrences(&index, &[5, 10]).len, 0);
    assert_eq!(occurrences(&index, &[77, 78]).len, 0);
    assert_eq!(occurrences(&SuffixIndex::new(), &[3, 4]).len, 0);
}

#[test]
fn long_matches_are_verified_in_full_up_to_the_cap() {
    let mut index = SuffixIndex::new();
    let text: Vec<u32> = (0..100).map(|i| 1000 + i).collect();
    index.push_request(&text, 1);
    let mut other = text[..60].to_vec();
    other[30] = 5;
    index.push_request(&other, 2);
    // The query ends at token 1059: the first request matches it for 40 tokens back (29
    // in the second, which differs at 1030), so only the first is kept.
    let query = &text[20..60];
    let found = occurrences(&index, query);
    assert_eq!(found.len, MAX_MATCH);
    assert_eq!(found.at.len(), 1);
    assert_eq!(continuations(&index, &found, 3), [vec![1060, 1061, 1062]]);
}

#[test]
fn a_growing_sequence_matches_its_own_earlier_tokens() {
    let mut index = SuffixIndex::new();
    index.extend(&[5, 6, 7, 8, 5, 6]);
    let found = occurrences(&index, &[5, 6, 7, 8, 5, 6]);
    assert_eq!(found.len, 2);
    assert_eq!(continuations(&index, &found, 4), [vec![7, 8, 5, 6]]);
    index.extend(&[7]);
    let found = occurrences(&index, &[5, 6, 7, 8, 5, 6, 7]);
    assert_eq!(found.len, 3);
    assert_eq!(continuations(&index, &found, 4), [vec![8, 5, 6, 7]]);
}

#[test]
fn eviction_drops_whole_requests_oldest_first_and_frees_chunks() {
    let mut index = SuffixIndex::new();
    let request: Vec<u32> = (0..5000).collect();
    for i in 0..10u64 {
        let mut tokens = request.clone();
        tokens[0] = 100_000 + i as u32;
        index.push_request(&tokens, i);
    }
    assert_eq!(index.requests(), 10);
    assert_eq!(index.len(), 10 * 5001);
    let bytes = index.bytes();
    let found = occurrences(&index, &[100_003, 1, 2]);
    assert_eq!(found.len, 3);
    for _ in 0..4 {
        assert_eq!(index.evict_oldest(), 5001);
    }
    assert_eq!(index.requests(), 6);
    assert_eq!(index.oldest_arrival(), Some(4));
    assert!(index.bytes() < bytes, "evicting frees whole chunks");
    // The evicted request's tokens are gone (only the `1 2` of later requests matches); the
    // rest still match.
    assert_eq!(occurrences(&index, &[100_003, 1, 2]).len, 2);
    assert_eq!(occurrences(&index, &[100_004, 1, 2]).len, 3);
    let kept: Vec<Vec<u32>> = index.live_requests().collect();
    assert_eq!(kept.len(), 6);
    assert_eq!(kept[0][0], 100_004);
    assert_eq!(kept[0].len(), 5000);
    while index.evict_oldest() > 0 {}
    assert!(index.is_empty());
    assert_eq!(occurrences(&index, &[1, 2]).len, 0);
    // It fills again after emptying.
    index.push_request(&[1, 2, 3], 20);
    assert_eq!(occurrences(&index, &[1, 2]).len, 2);
}

#[test]
fn rehashing_keeps_every_match() {
    let mut index = SuffixIndex::new();
    let mut state = 7u32;
    let mut requests = Vec::new();
    for r in 0..40 {
        let tokens: Vec<u32> = (0..300).map(|_| xorshift(&mut state) % 50_000).collect();
        index.push_request(&tokens, r);
        requests.push(tokens);
    }
    assert!(index.heads.len() > MIN_SLOTS, "the table grew");
    // Every request's every 8-gram is found where it ends, with what follows it.
    for tokens in &requests {
        for start in (0..280).step_by(37) {
            let found = occurrences(&index, &tokens[start..start + 8]);
            assert!(found.len >= 8, "an 8-gram at {start}");
            let next: Vec<Vec<u32>> = continuations(&index, &found, 2);
            assert!(next.contains(&tokens[start + 8..start + 10].to_vec()));
        }
    }
}

/// The next of a xorshift stream: token streams with no structure, for the index's tests.
pub(crate) fn xorshift(state: &mut u32) -> u32 {
    *state ^= *state << 13;
    *state ^= *state >> 17;
    *state ^= *state << 5;
    *state
}
