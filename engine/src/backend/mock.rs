//! [`MockBackend`]: a tensor-free stand-in for a model. It remembers which token each KV
//! slot holds and scores the next token as a fixed function of the tokens a row can see, so
//! the engine, scheduler and server can be tested quickly and exactly without a model. A
//! test may give its own function ([`NextToken`]), to have the "model" write a given text.

use std::sync::Arc;

use kvcache::KvMove;

use super::Backend;
use crate::tree_batch::TreeBatch;
use crate::{Error, Result};

/// The next token after the tokens a row sees (a mock model's whole behaviour).
pub type NextToken = Arc<dyn Fn(&[u32]) -> u32 + Send + Sync>;

/// The tokens a mock model prefers after the tokens a row sees, most likely first (what it
/// writes where the first is masked: a model that tries to end early, say).
pub type RankedTokens = Arc<dyn Fn(&[u32]) -> Vec<u32> + Send + Sync>;

/// A mock's behaviour: one next token, or a ranking.
#[derive(Clone)]
enum Rule {
    One(NextToken),
    Ranked(RankedTokens),
}

/// A tensor-free stand-in for a model: the next token after a sequence is
/// [`MockBackend::next_token`] of the tokens it can see (its context from the slots, then
/// its tree ancestors), or the test's own [`NextToken`], with a clear margin over every other
/// token.
#[derive(Clone)]
pub struct MockBackend {
    vocab: usize,
    slots: Vec<Option<u32>>,
    rule: Option<Rule>,
}

impl std::fmt::Debug for MockBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MockBackend")
            .field("vocab", &self.vocab)
            .field("slots", &self.slots.len())
            .field("scripted", &self.rule.is_some())
            .finish()
    }
}

impl MockBackend {
    /// A mock with `vocab` logits per row and `num_slots` KV rows.
    pub fn new(vocab: usize, num_slots: usize) -> Self {
        Self {
            vocab,
            slots: vec![None; num_slots],
            rule: None,
        }
    }

    /// A mock whose next token is `rule`'s.
    pub fn scripted(vocab: usize, num_slots: usize, rule: NextToken) -> Self {
        Self {
            rule: Some(Rule::One(rule)),
            ..Self::new(vocab, num_slots)
        }
    }

    /// A mock whose tokens rank as `rule` says: its first choice as [`Self::scripted`]'s,
    /// the others after it in order, above every token it does not name.
    pub fn ranked(vocab: usize, num_slots: usize, rule: RankedTokens) -> Self {
        Self {
            rule: Some(Rule::Ranked(rule)),
            ..Self::new(vocab, num_slots)
        }
    }

    /// The mock model's greedy continuation of `prompt`: its next `len` tokens.
    pub fn continuation(prompt: &[u32], len: usize, vocab: usize) -> Vec<u32> {
        let mut tokens = prompt.to_vec();
        for _ in 0..len {
            tokens.push(Self::next_token(&tokens, vocab));
        }
        tokens.split_off(prompt.len())
    }

    /// The mock model's greedy next token after `tokens` (a hash of the last three).
    pub fn next_token(tokens: &[u32], vocab: usize) -> u32 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for &t in tokens.iter().rev().take(3) {
            h = (h ^ u64::from(t)).wrapping_mul(0x0100_0000_01b3);
        }
        (h % vocab.max(1) as u64) as u32
    }

    /// The mock model's final-normed state after `tokens` (what a pooling request gets): a
    /// bag of its tokens, component `k` one plus how many of them are `k` modulo
    /// [`MockBackend::STATE_WIDTH`]. Equal token bags give equal states.
    pub fn state(tokens: &[u32]) -> Vec<f32> {
        let mut state = vec![1.0; Self::STATE_WIDTH];
        for &t in tokens {
            state[t as usize % Self::STATE_WIDTH] += 1.0;
        }
        state
    }

    /// Width of [`MockBackend::state`].
    pub const STATE_WIDTH: usize = 8;

    /// Logits that make `next` the most likely token, then tokens close to it.
    fn logits(&self, next: u32) -> Vec<f32> {
        (0..self.vocab as u32)
            .map(|t| {
                let gap = (t as i64 - next as i64).unsigned_abs() as f32;
                -gap.min(8.0)
            })
            .collect()
    }

    /// Logits ranking `tokens` first, in order (the first as [`Self::logits`] has it, the
    /// others between it and every token not named).
    fn ranked_logits(&self, tokens: &[u32]) -> Vec<f32> {
        let Some((&first, rest)) = tokens.split_first() else {
            return self.logits(0);
        };
        let mut logits = self.logits(first);
        let step = 1.0 / (rest.len() + 1) as f32;
        for (i, &t) in rest.iter().enumerate() {
            if let Some(logit) = logits.get_mut(t as usize) {
                if t != first {
                    *logit = logit.max(-step * (i + 1) as f32);
                }
            }
        }
        logits
    }
}

impl Backend for MockBackend {
    fn vocab_size(&self) -> usize {
        self.vocab
    }

    fn num_slots(&self) -> usize {
        self.slots.len()
    }

    fn describe(&self) -> String {
        "mock model (no tensors)".into()
    }

    fn forward(&mut self, batch: &TreeBatch) -> Result<Vec<Vec<f32>>> {
        let num_slots = self.slots.len();
        let slot_of = |s: kvcache::Slot| -> Result<usize> {
            let i = s.index();
            (i < num_slots)
                .then_some(i)
                .ok_or_else(|| Error::InvalidBatch(format!("slot {i} outside the mock store")))
        };
        // Every row's visible sequence, computed before any row is written.
        let mut seen: Vec<Vec<u32>> = vec![Vec::new(); batch.num_rows()];
        for seq in &batch.seqs {
            let mut context = Vec::with_capacity(seq.context_len);
            for p in 0..seq.context_len {
                let slot = batch
                    .context_slot(seq, p)
                    .ok_or_else(|| Error::InvalidBatch("context past the table".into()))?;
                let token = self.slots[slot_of(slot)?]
                    .ok_or_else(|| Error::InvalidBatch(format!("context position {p} unset")))?;
                context.push(token);
            }
            for (local, row) in seq.rows.clone().enumerate() {
                let mut tokens = context.clone();
                tokens.extend(
                    seq.mask
                        .visible(local)
                        .map(|j| batch.token_ids[seq.rows.start + j]),
                );
                seen[row] = tokens;
            }
        }
        for (row, &slot) in batch.slots.iter().enumerate() {
            let at = slot_of(slot)?;
            self.slots[at] = Some(batch.token_ids[row]);
        }
        Ok(batch
            .logit_rows
            .iter()
            .enumerate()
            .map(|(i, &row)| match &self.rule {
                _ if batch.wants_hidden(i) => Self::state(&seen[row]),
                Some(Rule::One(rule)) => self.logits(rule(&seen[row])),
                Some(Rule::Ranked(rule)) => self.ranked_logits(&rule(&seen[row])),
                None => self.logits(Self::next_token(&seen[row], self.vocab)),
            })
            .collect())
    }

    fn returns_states(&self) -> bool {
        true
    }

    fn move_kv(&mut self, moves: &[KvMove]) -> Result<()> {
        for m in moves {
            let (from, to) = (m.from.index(), m.to.index());
            if m.group != kvcache::KvGroup::Full {
                return Err(Error::InvalidBatch(
                    "the mock store keeps one KV space".into(),
                ));
            }
            if from >= self.slots.len() || to >= self.slots.len() {
                return Err(Error::InvalidBatch("kv move outside the mock store".into()));
            }
            self.slots[to] = self.slots[from];
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::TokenTree;
    use crate::tree_batch::LogitRows;
    use kvcache::{BlockId, BlockTable};

    #[test]
    fn mock_scores_what_each_row_sees() {
        let mut mock = MockBackend::new(50, 16);
        let table = BlockTable::from_blocks(vec![BlockId(0), BlockId(1)]);
        let mut batch = TreeBatch::new(4);
        batch
            .push(0, &table, &TokenTree::chain(&[1, 2, 3]), LogitRows::Last)
            .unwrap();
        let logits = mock.forward(&batch).unwrap();
        assert_eq!(
            crate::sampler::argmax(&logits[0]),
            MockBackend::next_token(&[1, 2, 3], 50)
        );
        // A tree over that context: node 2 sees [1, 2, 3, 7, 9], not node 1's token 8.
        let mut batch = TreeBatch::new(4);
        let tree = TokenTree::new(vec![7, 8, 9], vec![None, Some(0), Some(0)]).unwrap();
        batch.push(3, &table, &tree, LogitRows::All).unwrap();
        let logits = mock.forward(&batch).unwrap();
        assert_eq!(
            crate::sampler::argmax(&logits[2]),
            MockBackend::next_token(&[1, 2, 3, 7, 9], 50)
        );
    }
}
