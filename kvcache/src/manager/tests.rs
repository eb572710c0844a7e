//! The block manager's unit tests: sharing, copy-on-write, the prefix cache, the watermark.
use super::*;
use crate::window::block_slot;
use crate::{KvGroup, WindowConfig};

fn manager(num_blocks: usize, block_size: usize) -> BlockManager {
    BlockManager::new(ManagerConfig {
        num_blocks,
        block_size,
        prefix_caching: true,
        watermark: 0.0,
        window: None,
    })
}

#[test]
fn fork_shares_blocks_and_copies_the_partial_one_on_write() {
    let mut m = manager(8, 4);
    let (a, b) = (SeqId(1), SeqId(2));
    let prompt: Vec<u32> = (0..6).collect();
    assert_eq!(m.admit(a, &prompt, 6, None).unwrap(), Some(0));
    m.commit(a, &prompt).unwrap();
    m.fork(a, b).unwrap();
    assert_eq!(m.stats().in_use, 2);
    let moves = m.ensure_capacity(b, 7).unwrap().unwrap();
    // Rows 4 and 5 of the shared partial block are copied to B's private block.
    assert_eq!(moves.len(), 2);
    let (old, new) = (m.block_table(a).unwrap().blocks()[1], {
        m.block_table(b).unwrap().blocks()[1]
    });
    assert_ne!(old, new);
    assert_eq!(moves[0].from, block_slot(old, 4, 0));
    assert_eq!(moves[1].to, block_slot(new, 4, 1));
    // A is sole owner again: no copy.
    assert_eq!(m.ensure_capacity(a, 8).unwrap().unwrap(), vec![]);
    assert_eq!(
        m.block_table(a).unwrap().blocks()[0],
        m.block_table(b).unwrap().blocks()[0]
    );
    m.check_invariants().unwrap();
    m.release(a).unwrap();
    m.release(b).unwrap();
    assert_eq!(m.stats().in_use, 0);
    m.check_invariants().unwrap();
}

#[test]
fn cached_blocks_are_shared_only_within_one_cache_salt() {
    let mut m = manager(16, 4);
    let prompt: Vec<u32> = (10..22).collect();
    let (a, b) = (BlockHash::scope(b"a"), BlockHash::scope(b"b"));
    m.admit(SeqId(1), &prompt, 12, Some(a)).unwrap().unwrap();
    m.commit(SeqId(1), &prompt).unwrap();
    // Neither another salt nor no salt finds salt a's blocks; salt a does.
    assert_eq!(m.cached_prefix_len(&prompt, None), 0);
    assert_eq!(m.cached_prefix_len(&prompt, Some(b)), 0);
    assert_eq!(m.cached_prefix_len(&prompt, Some(a)), 8);
    // A fork commits under its parent's salt.
    m.fork(SeqId(1), SeqId(2)).unwrap();
    let mut longer = prompt.clone();
    longer.extend([7, 7, 7, 7]);
    m.ensure_capacity(SeqId(2), 16).unwrap().unwrap();
    m.commit(SeqId(2), &longer).unwrap();
    m.release(SeqId(1)).unwrap();
    m.release(SeqId(2)).unwrap();
    longer.push(1);
    assert_eq!(m.cached_prefix_len(&longer, Some(a)), 16);
    assert_eq!(m.cached_prefix_len(&longer, None), 0);
    // Unsalted prompts share among themselves as before.
    assert_eq!(m.admit(SeqId(3), &prompt, 12, None).unwrap(), Some(0));
    m.commit(SeqId(3), &prompt).unwrap();
    assert_eq!(m.cached_prefix_len(&prompt, None), 8);
    assert_eq!(m.cached_prefix_len(&prompt, Some(b)), 0);
    m.check_invariants().unwrap();
}

#[test]
fn prefix_hit_reuses_committed_blocks_and_leaves_one_token_to_compute() {
    let mut m = manager(8, 4);
    let prompt: Vec<u32> = (10..22).collect(); // 12 tokens = 3 full blocks
    m.admit(SeqId(1), &prompt, 12, None).unwrap().unwrap();
    m.commit(SeqId(1), &prompt).unwrap();
    m.release(SeqId(1)).unwrap();
    assert_eq!(m.stats().cached, 3);
    // Same prompt: the last block is recomputed so logits exist for the last token.
    assert_eq!(m.admit(SeqId(2), &prompt, 12, None).unwrap(), Some(8));
    assert_eq!(m.stats().cached, 1);
    // A prompt that diverges in block 1 reuses block 0 only.
    let mut other = prompt.clone();
    other[5] = 99;
    assert_eq!(m.admit(SeqId(3), &other, 12, None).unwrap(), Some(4));
    assert_eq!(m.stats().prefix_hit_tokens, 12);
    assert_eq!(m.stats().prefix_query_tokens, 36);
    m.check_invariants().unwrap();
}

#[test]
fn a_prefix_ends_only_at_a_resume_point_where_they_are_restricted() {
    let mut m = manager(8, 4);
    let prompt: Vec<u32> = (10..26).collect(); // 16 tokens = 4 full blocks
    m.admit(SeqId(1), &prompt, 16, None).unwrap().unwrap();
    m.commit(SeqId(1), &prompt).unwrap();
    m.release(SeqId(1)).unwrap();
    assert_eq!(m.cached_prefix_len(&prompt, None), 12);
    m.restrict_resume_points();
    assert_eq!(m.cached_prefix_len(&prompt, None), 0, "no point marked yet");
    let b0 = BlockHash::new(None, &prompt[..4]);
    let b1 = BlockHash::new(Some(b0), &prompt[4..8]);
    let b2 = BlockHash::new(Some(b1), &prompt[8..12]);
    m.add_resume_point(b0);
    m.add_resume_point(b2);
    assert_eq!(m.cached_prefix_len(&prompt, None), 12);
    m.remove_resume_point(b2);
    // The deepest point at or below the cached prefix.
    assert_eq!(m.cached_prefix_len(&prompt, None), 4);
    assert_eq!(m.admit(SeqId(2), &prompt, 16, None).unwrap(), Some(4));
    m.check_invariants().unwrap();
}

#[test]
fn admission_respects_the_pool_and_the_watermark() {
    let mut m = BlockManager::new(ManagerConfig {
        num_blocks: 10,
        block_size: 4,
        prefix_caching: false,
        watermark: 0.2,
        window: None,
    });
    assert!(m.can_allocate(32));
    assert!(!m.can_allocate(33));
    assert_eq!(m.admit(SeqId(1), &[1; 33], 33, None).unwrap(), None);
    assert_eq!(m.stats().in_use, 0);
    assert_eq!(m.admit(SeqId(1), &[1; 32], 32, None).unwrap(), Some(0));
    // Growth may use the watermark, then runs dry without changing anything.
    assert!(m.ensure_capacity(SeqId(1), 40).unwrap().is_some());
    assert_eq!(m.ensure_capacity(SeqId(1), 41).unwrap(), None);
    assert_eq!(m.block_table(SeqId(1)).unwrap().len(), 10);
    assert_eq!(
        m.admit(SeqId(1), &[1], 1, None),
        Err(KvError::DuplicateSeq(SeqId(1)))
    );
    assert_eq!(m.release(SeqId(9)), Err(KvError::UnknownSeq(SeqId(9))));
}

#[test]
fn truncate_returns_trailing_blocks_and_rewrite_drops_a_stale_hash() {
    let mut m = manager(8, 4);
    let s = SeqId(1);
    let tokens: Vec<u32> = (0..8).collect();
    m.admit(s, &tokens, 16, None).unwrap().unwrap();
    m.commit(s, &tokens).unwrap();
    assert_eq!(m.truncate(s, 6).unwrap(), 2);
    assert_eq!(m.seq_len(s), Some(6));
    let block1 = m.block_table(s).unwrap().blocks()[1];
    assert!(m.pool().hash_of(block1).is_some());
    // Writing position 6 overwrites block 1's content: its hash must go.
    assert_eq!(m.ensure_capacity(s, 8).unwrap().unwrap(), vec![]);
    assert_eq!(m.pool().hash_of(block1), None);
    m.check_invariants().unwrap();
}

#[test]
fn eviction_happens_only_when_the_pool_runs_dry() {
    let mut m = manager(4, 2);
    let tokens = [1, 2, 3, 4];
    m.admit(SeqId(1), &tokens, 4, None).unwrap().unwrap();
    m.commit(SeqId(1), &tokens).unwrap();
    m.release(SeqId(1)).unwrap();
    m.admit(SeqId(2), &[9, 9], 4, None).unwrap().unwrap();
    assert_eq!(m.stats().cached, 2);
    assert_eq!(m.stats().evictions, 0);
    m.ensure_capacity(SeqId(2), 6).unwrap().unwrap();
    // The tail block (released first) is evicted; the head is still a hit.
    assert_eq!(m.stats().evictions, 1);
    assert_eq!(m.cached_prefix_len(&[1, 2, 3, 4, 5], None), 2);
    m.check_invariants().unwrap();
}

fn windowed(num_blocks: usize, window_blocks: usize, window: usize) -> BlockManager {
    BlockManager::new(ManagerConfig {
        num_blocks,
        block_size: 4,
        prefix_caching: true,
        watermark: 0.0,
        window: Some(WindowConfig {
            window,
            num_blocks: window_blocks,
        }),
    })
}

#[test]
fn a_window_lets_go_of_what_no_later_query_sees() {
    // Window 6, blocks of 4: a query at position p sees p-5..=p.
    let mut m = windowed(16, 16, 6);
    let s = SeqId(1);
    let tokens: Vec<u32> = (0..40).collect();
    m.admit(s, &tokens[..5], 5, None).unwrap().unwrap();
    m.commit(s, &tokens[..5]).unwrap();
    assert_eq!(m.held_blocks(s), Some(vec![2, 2]));
    for len in 6..=40 {
        m.ensure_capacity(s, len).unwrap().unwrap();
        m.commit(s, &tokens[..len]).unwrap();
        m.check_invariants().unwrap();
        let window = m.window_table(s).unwrap();
        // The next query (position len) sees len-5..: its block and the ones after are held.
        let first_seen = (len + 1 - 6) / 4;
        assert_eq!(window.skipped(), first_seen, "len {len}");
        assert!(window.slot(len + 1 - 6, 4).is_some());
        assert_eq!(m.block_table(s).unwrap().skipped(), 0);
    }
    // 40 positions: 10 full blocks, but only 2 in the window's space.
    assert_eq!(m.held_blocks(s), Some(vec![10, 2]));
    assert_eq!(m.stats().window.unwrap().in_use, 2);
    // Cutting back into what the window let go of is refused, with nothing changed.
    assert!(m.truncate(s, 20).is_err());
    assert_eq!(m.held_blocks(s), Some(vec![10, 2]));
    m.release(s).unwrap();
    m.check_invariants().unwrap();
}

#[test]
fn a_prefix_is_served_only_while_the_window_still_holds_what_its_query_sees() {
    let mut m = windowed(16, 6, 6);
    let prompt: Vec<u32> = (100..117).collect(); // 17 tokens: 4 full blocks
    m.admit(SeqId(1), &prompt, 17, None).unwrap().unwrap();
    m.commit(SeqId(1), &prompt).unwrap();
    m.release(SeqId(1)).unwrap();
    // The window kept blocks 3 and 4 (the query at 17 sees 12..) and cached the three it
    // let go of. The prompt again computes its last token at 16, which sees 11..: blocks 2
    // and 3, both still cached.
    assert_eq!(m.cached_prefix_len(&prompt, None), 16);
    let hit = m.admit(SeqId(2), &prompt, 17, None).unwrap().unwrap();
    assert_eq!(hit, 16);
    assert_eq!(m.window_table(SeqId(2)).unwrap().skipped(), 2);
    m.check_invariants().unwrap();
    m.release(SeqId(2)).unwrap();
    // Fill the windowed pool with another sequence: the cached window blocks are evicted,
    // and the full space alone no longer serves the prefix.
    let other: Vec<u32> = (0..24).collect();
    m.admit(SeqId(3), &other, 24, None).unwrap().unwrap();
    assert_eq!(m.stats().window.unwrap().cached, 0);
    assert!(m
        .pool()
        .lookup(BlockHash::new(None, &prompt[..4]))
        .is_some());
    assert_eq!(m.cached_prefix_len(&prompt, None), 0);
    m.check_invariants().unwrap();
}

#[test]
fn windowed_copies_and_compaction_name_their_space() {
    let mut m = windowed(16, 16, 6);
    let (a, b) = (SeqId(1), SeqId(2));
    let prompt: Vec<u32> = (0..10).collect();
    m.admit(a, &prompt, 10, None).unwrap().unwrap();
    m.commit(a, &prompt).unwrap();
    m.fork(a, b).unwrap();
    // B writes position 10 into the shared partial block 2: one copy per space, rows 8, 9.
    let moves = m.ensure_capacity(b, 14).unwrap().unwrap();
    let groups: Vec<KvGroup> = moves.iter().map(|m| m.group).collect();
    assert_eq!(
        groups,
        vec![
            KvGroup::Full,
            KvGroup::Full,
            KvGroup::Window,
            KvGroup::Window
        ]
    );
    // A tree of 4 nodes at 10..14 whose path is nodes 0 and 2: one move per space.
    let moves = m.plan_compaction(b, 10, &[0, 2]).unwrap();
    assert_eq!(moves.len(), 2);
    assert_eq!(
        (moves[0].group, moves[1].group),
        (KvGroup::Full, KvGroup::Window)
    );
    let window = m.window_table(b).unwrap();
    assert_eq!(moves[1].from, window.slot(12, 4).unwrap());
    assert_eq!(moves[1].to, window.slot(11, 4).unwrap());
    m.check_invariants().unwrap();
}
