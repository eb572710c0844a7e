//! What the CUDA kernels are told, worked out on the host: a forward's plan (for every row,
//! its token, position and slot, its sequence's context length and block table and the slots
//! of the tree rows it sees, and which rows' logits are wanted, packed into one `i32` buffer
//! so one upload per forward carries it all; padded to a captured step's row count where a
//! graph runs it), the row and run counts steps are captured at (`bucket`), and the
//! waves a list of KV moves runs in (moves that may run at once, in an order that gives what
//! running them one by one gives). Plain data, testable without a GPU.

use kvcache::KvMove;

use crate::tree_batch::TreeBatch;
use crate::{Error, Result};

/// Per-row fields in [`AttentionPlan::words`]: context length, offset of the sequence's block
/// table, offset of the row's visible tree slots, how many there are, the row's slot, its
/// RoPE position, its token (`ROW_FIELDS` in `kernels.cu`).
pub const ROW_FIELDS: usize = 7;

/// One forward's attention metadata as the kernel reads it: `rows * ROW_FIELDS` row words,
/// then the logit list (the rows whose logits are wanted, one word each, padded with row 0
/// to `rows` entries), then every sequence's block table (block ids), then every row's
/// visible tree slots (ancestors first, the row itself last), then the spare slot where the
/// plan has padding rows. Offsets are from the start of `words`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttentionPlan {
    /// The packed buffer.
    pub words: Vec<i32>,
    /// The most keys any row sees (context plus visible tree rows).
    pub max_keys: usize,
    /// Where the logit list starts (`rows * ROW_FIELDS`).
    pub logits_at: usize,
}

impl AttentionPlan {
    /// The plan for `batch`, one header per row.
    pub fn new(batch: &TreeBatch) -> Result<Self> {
        Self::padded(batch, batch.num_rows(), 0)
    }

    /// The plan for `batch` padded to `rows` rows (at least the batch's): each padding row
    /// has token 0 at position 0, no context, and writes and reads only `spare`, a slot
    /// outside the engine's (so a captured step of `rows` rows can run a smaller batch and
    /// leave every real row's result and every real slot as the batch alone would).
    pub fn padded(batch: &TreeBatch, rows: usize, spare: usize) -> Result<Self> {
        let real = batch.num_rows();
        if rows < real {
            return Err(Error::InvalidBatch(format!(
                "a plan of {rows} rows for a batch of {real}"
            )));
        }
        let word = |x: usize| {
            i32::try_from(x).map_err(|_| Error::InvalidBatch(format!("{x} overflows i32")))
        };
        let mut header = vec![0i32; rows * ROW_FIELDS];
        let mut tables = Vec::new();
        let mut visible = Vec::new();
        let mut max_keys = 0;
        for seq in &batch.seqs {
            let table_at = tables.len();
            for b in seq.block_table.blocks() {
                tables.push(word(b.0 as usize)?);
            }
            for (i, row) in seq.rows.clone().enumerate() {
                let at = visible.len();
                for j in seq.mask.visible(i) {
                    visible.push(word(batch.slots[seq.rows.start + j].index())?);
                }
                let seen = visible.len() - at;
                max_keys = max_keys.max(seq.context_len + seen);
                header[row * ROW_FIELDS..(row + 1) * ROW_FIELDS].copy_from_slice(&[
                    word(seq.context_len)?,
                    table_at as i32,
                    at as i32,
                    word(seen)?,
                    word(batch.slots[row].index())?,
                    word(batch.positions[row] as usize)?,
                    word(batch.token_ids[row] as usize)?,
                ]);
            }
        }
        let mut logits: Vec<i32> = Vec::with_capacity(rows);
        for &r in &batch.logit_rows {
            logits.push(word(r)?);
        }
        logits.resize(rows, 0);
        let logits_at = header.len();
        let tables_at = word(logits_at + logits.len())?;
        let visible_at = word(logits_at + logits.len() + tables.len())?;
        for row in header[..real * ROW_FIELDS].chunks_mut(ROW_FIELDS) {
            row[1] += tables_at;
            row[2] += visible_at;
        }
        let spare_at = word(logits_at + logits.len() + tables.len() + visible.len())?;
        let spare = word(spare)?;
        for row in header[real * ROW_FIELDS..].chunks_mut(ROW_FIELDS) {
            // No context, one visible slot (the spare one, its own), token 0 at position 0.
            row.copy_from_slice(&[0, tables_at, spare_at, 1, spare, 0, 0]);
        }
        let mut words = header;
        words.extend(logits);
        words.extend(tables);
        words.extend(visible);
        if rows > real {
            words.push(spare);
        }
        word(words.len())?;
        Ok(Self {
            words,
            max_keys: max_keys.max(usize::from(rows > real)),
            logits_at,
        })
    }

    /// The slots row `row` reads, in the order the kernel visits them (context positions
    /// through the block table, then the visible tree rows): what the kernel computes, here.
    #[cfg(test)]
    pub fn key_slots(&self, row: usize, block_size: usize) -> Vec<usize> {
        let h = &self.words[row * ROW_FIELDS..(row + 1) * ROW_FIELDS];
        let (ctx, table, at, seen) = (h[0] as usize, h[1] as usize, h[2] as usize, h[3] as usize);
        let mut slots: Vec<usize> = (0..ctx)
            .map(|p| self.words[table + p / block_size] as usize * block_size + p % block_size)
            .collect();
        slots.extend(self.words[at..at + seen].iter().map(|&s| s as usize));
        slots
    }
}

/// Keys per attention block by default (`split` in `kernels.cu`; `THICKET_CUDA_SPLIT_KEYS`
/// sets another): a row that sees more is split into runs of this many, one block each,
/// merged by a second kernel, so even one row over a long context spreads over the GPU.
/// One tile of keys per block. Where the runs fall depends only on the row's own keys.
pub const SPLIT_KEYS: usize = 128;

/// The row counts a step is captured at as a CUDA graph: a batch runs in the smallest that
/// holds it (padded, `AttentionPlan::padded`), so a few graphs serve every decode and tree
/// batch; larger batches (prefill chunks) run launch by launch.
pub const GRAPH_ROWS: [usize; 18] = [
    1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256,
];

/// The captured row count for a batch of `rows`, `None` past the largest.
pub fn graph_rows(rows: usize) -> Option<usize> {
    GRAPH_ROWS.iter().copied().find(|&b| b >= rows.max(1))
}

/// Runs of `split` keys the longest row needs (at least one).
pub fn attention_runs(max_keys: usize, split: usize) -> usize {
    max_keys.div_ceil(split.max(1)).max(1)
}

/// The run count a graph is captured at: one, or the next power of two (extra runs start
/// past a row's keys and are skipped; a row's result depends only on its own keys).
pub fn graph_runs(max_keys: usize, split: usize) -> usize {
    attention_runs(max_keys, split).next_power_of_two()
}

/// `moves` split into waves: within a wave no slot is both read and written, and no slot is
/// written twice, so a wave's copies may run in parallel; waves run in order. Running the
/// waves gives what running the moves one by one gives. Moves onto themselves are dropped.
pub fn move_waves(moves: &[KvMove]) -> Vec<Vec<KvMove>> {
    let mut waves: Vec<Vec<KvMove>> = Vec::new();
    let mut reads = std::collections::HashSet::new();
    let mut writes = std::collections::HashSet::new();
    let mut wave = Vec::new();
    for &m in moves.iter().filter(|m| m.from != m.to) {
        let clashes = writes.contains(&m.from) || writes.contains(&m.to) || reads.contains(&m.to);
        if clashes {
            waves.push(std::mem::take(&mut wave));
            reads.clear();
            writes.clear();
        }
        reads.insert(m.from);
        writes.insert(m.to);
        wave.push(m);
    }
    if !wave.is_empty() {
        waves.push(wave);
    }
    waves
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::TokenTree;
    use crate::tree_batch::LogitRows;
    use kvcache::{BlockId, BlockTable, Slot};

    #[test]
    fn each_row_reads_its_context_then_the_tree_rows_it_sees() {
        let mut batch = TreeBatch::new(4);
        let table_a = BlockTable::from_blocks(vec![BlockId(3), BlockId(1)]);
        let tree = TokenTree::new(vec![7, 8, 9], vec![None, Some(0), Some(0)]).unwrap();
        batch.push(5, &table_a, &tree, LogitRows::All).unwrap();
        let table_b = BlockTable::from_blocks(vec![BlockId(0)]);
        let chain = TokenTree::chain(&[1, 2]);
        batch.push(0, &table_b, &chain, LogitRows::Last).unwrap();
        let plan = AttentionPlan::new(&batch).unwrap();
        // Sequence A: context positions 0..5 -> block 3 (slots 12..16), block 1 (slot 4).
        let context: Vec<usize> = vec![12, 13, 14, 15, 4];
        let with = |tail: &[usize]| [context.as_slice(), tail].concat();
        assert_eq!(plan.key_slots(0, 4), with(&[5]));
        assert_eq!(plan.key_slots(1, 4), with(&[5, 6]));
        // Siblings do not see each other.
        assert_eq!(plan.key_slots(2, 4), with(&[5, 7]));
        // Sequence B has no context and never sees A.
        assert_eq!(plan.key_slots(3, 4), vec![0]);
        assert_eq!(plan.key_slots(4, 4), vec![0, 1]);
        assert_eq!(plan.max_keys, 7);
        // Slot, position and token of each row, as the batch has them.
        for row in 0..batch.num_rows() {
            let h = &plan.words[row * ROW_FIELDS..(row + 1) * ROW_FIELDS];
            assert_eq!(h[4] as usize, batch.slots[row].index());
            assert_eq!(h[5] as u32, batch.positions[row]);
            assert_eq!(h[6] as u32, batch.token_ids[row]);
        }
        // The kernel's view equals the batch's own slot lookup for every context position.
        let seq = &batch.seqs[0];
        let direct: Vec<usize> = (0..5)
            .map(|p| batch.context_slot(seq, p).unwrap().index())
            .collect();
        assert_eq!(direct, context);
    }

    #[test]
    fn padding_rows_see_only_the_spare_slot_and_leave_real_rows_alone() {
        let mut batch = TreeBatch::new(4);
        let table = BlockTable::from_blocks(vec![BlockId(2), BlockId(5)]);
        let tree = TokenTree::new(vec![7, 8, 9], vec![None, Some(0), Some(1)]).unwrap();
        batch.push(3, &table, &tree, LogitRows::All).unwrap();
        let plain = AttentionPlan::new(&batch).unwrap();
        let padded = AttentionPlan::padded(&batch, 8, 99).unwrap();
        for row in 0..3 {
            assert_eq!(plain.key_slots(row, 4), padded.key_slots(row, 4));
            let h =
                |p: &AttentionPlan| p.words[row * ROW_FIELDS + 4..(row + 1) * ROW_FIELDS].to_vec();
            assert_eq!(h(&plain), h(&padded));
        }
        for row in 3..8 {
            assert_eq!(padded.key_slots(row, 4), vec![99]);
            let h = &padded.words[row * ROW_FIELDS..(row + 1) * ROW_FIELDS];
            assert_eq!((h[4], h[5], h[6]), (99, 0, 0));
        }
        // The logit list: the batch's rows first, row 0 after, as many entries as rows.
        let list = |p: &AttentionPlan, n: usize| p.words[p.logits_at..p.logits_at + n].to_vec();
        assert_eq!(list(&plain, 3), vec![0, 1, 2]);
        assert_eq!(list(&padded, 8), vec![0, 1, 2, 0, 0, 0, 0, 0]);
        assert_eq!(padded.max_keys, plain.max_keys);
        assert!(AttentionPlan::padded(&batch, 2, 99).is_err());
    }

    #[test]
    fn batches_run_in_the_smallest_captured_size_that_holds_them() {
        assert_eq!(graph_rows(0), Some(1));
        assert_eq!(graph_rows(1), Some(1));
        assert_eq!(graph_rows(9), Some(12));
        assert_eq!(graph_rows(64), Some(64));
        assert_eq!(graph_rows(65), Some(96));
        assert_eq!(graph_rows(256), Some(256));
        assert_eq!(graph_rows(257), None);
        assert!(GRAPH_ROWS.windows(2).all(|w| w[0] < w[1]));
        let runs = |keys| (attention_runs(keys, 512), graph_runs(keys, 512));
        assert_eq!(runs(0), (1, 1));
        assert_eq!(runs(512), (1, 1));
        assert_eq!(runs(513), (2, 2));
        assert_eq!(runs(1537), (4, 4));
        assert_eq!(runs(2049), (5, 8));
        assert_eq!(attention_runs(512, SPLIT_KEYS), 512 / SPLIT_KEYS);
    }

    fn run(slots: &mut [u32], moves: &[KvMove]) {
        for m in moves {
            slots[m.to.index()] = slots[m.from.index()];
        }
    }

    fn run_waves(slots: &mut [u32], waves: &[Vec<KvMove>]) {
        for wave in waves {
            // Parallel semantics: every read happens before any write.
            let read: Vec<u32> = wave.iter().map(|m| slots[m.from.index()]).collect();
            for (m, v) in wave.iter().zip(read) {
                slots[m.to.index()] = v;
            }
        }
    }

    #[test]
    fn waves_give_what_moves_one_by_one_give() {
        let mv = |from: u32, to: u32| KvMove::full(Slot(from), Slot(to));
        let cases: Vec<Vec<KvMove>> = vec![
            vec![mv(5, 1), mv(6, 2), mv(7, 3)],
            // A chain: 2 -> 1 then 3 -> 2 must read 2 before it is overwritten.
            vec![mv(2, 1), mv(3, 2), mv(4, 3)],
            // Written, then read: 1 -> 0 then 0 -> 5 must see the new 0.
            vec![mv(1, 0), mv(0, 5)],
            // The same slot written twice: the last write wins.
            vec![mv(1, 0), mv(2, 0)],
            vec![mv(3, 3), mv(4, 4)],
        ];
        let mut rng = 7u64;
        let mut random = Vec::new();
        for _ in 0..200 {
            let mut moves = Vec::new();
            for _ in 0..6 {
                rng = rng
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                moves.push(mv((rng >> 33) as u32 % 8, (rng >> 45) as u32 % 8));
            }
            random.push(moves);
        }
        for moves in cases.iter().chain(&random) {
            let mut serial: Vec<u32> = (100..108).collect();
            let mut waved = serial.clone();
            run(&mut serial, moves);
            let waves = move_waves(moves);
            run_waves(&mut waved, &waves);
            assert_eq!(serial, waved, "{moves:?} as {waves:?}");
        }
        assert_eq!(move_waves(&cases[0]).len(), 1);
        assert_eq!(move_waves(&cases[4]).len(), 0);
    }
}
