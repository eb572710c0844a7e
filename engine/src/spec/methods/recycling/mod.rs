//! Token Recycling. One adjacency matrix `M[vocab][k]` (k = 8) for the whole engine: after
//! every forward, for every token fed whose logits were computed, `M[token]` becomes the
//! top-k of those logits (last write wins). Every request drafts from the same matrix, so
//! what one request teaches, all use (the paper's hot start, shared across concurrent
//! requests), and the matrix can be saved and loaded so a restarted server starts warm.
//!
//! Beside `M`, each matrix keeps rows keyed by the last two and three tokens fed on a row's
//! path (`context`), learnt from the same logits: a row in context answers before
//! the token's own row where it is known (on chat, its first candidate is right about twice
//! as often), and how many tokens keyed the root's row is the drafter's evidence, so the
//! engine learns what trees of each kind accept.
//!
//! Drafting walks a static, imbalanced tree (80 nodes in 6 layers, from the paper): a node
//! `[i, j]` is the j-th candidate of the i-th candidate of the root, taken from the row after
//! the end of that node's path. The tree's node list is best first (a chain of first
//! candidates before the root's second), so its first b entries are the tree used for a
//! budget of b.
//!
//! [`RecyclingSpeculator`] is the method's engine-wide side: it owns the matrices (one per
//! cache salt in use, `matrices`; each shared read-only with every drafter that
//! walks it), learns from every row the forward computed (into its sequence's salt's
//! matrix), asks for the logits of prompt rows whose token the matrix has never seen, and
//! saves the unsalted matrix.

use std::io::{Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use kvcache::BlockHash;

pub mod context;
pub mod matrices;

use context::{ContextRows, LONGEST_CONTEXT};
use matrices::RecyclingMatrices;

use crate::spec::speculator::{LastTokens, ObservedRow, Speculator};
use crate::spec::{Candidates, DraftContext, Drafter, NewSequence, SpecMethod};
use crate::{Error, Result};

/// Candidates kept per token.
pub const TOP_K: usize = 8;
const MAGIC: &[u8; 8] = b"THKTRM01";
const UNSET: u32 = u32::MAX;

/// The shared adjacency matrix. Its cells are relaxed atomics so that drafters can hold it
/// (`Arc`) while the engine thread updates it; that one thread is also the only reader, so a
/// row is never seen half written, and a stale candidate would only cost an acceptance.
#[derive(Debug)]
pub struct RecyclingMatrix {
    vocab: usize,
    k: usize,
    /// `vocab * k` candidates; a row is unset until its token is first seen.
    rows: Vec<AtomicU32>,
    /// The rows after the last two and three tokens fed (not saved with the matrix).
    context: ContextRows,
}

impl PartialEq for RecyclingMatrix {
    fn eq(&self, other: &Self) -> bool {
        self.vocab == other.vocab
            && self.k == other.k
            && self
                .rows
                .iter()
                .zip(&other.rows)
                .all(|(a, b)| a.load(Ordering::Relaxed) == b.load(Ordering::Relaxed))
    }
}

impl RecyclingMatrix {
    /// An empty (cold) matrix.
    pub fn new(vocab: usize, k: usize) -> Self {
        Self::from_cells(vocab, k, vec![UNSET; vocab * k])
    }

    fn from_cells(vocab: usize, k: usize, cells: Vec<u32>) -> Self {
        Self {
            vocab,
            k,
            rows: cells.into_iter().map(AtomicU32::new).collect(),
            context: ContextRows::new(k),
        }
    }

    fn cell(&self, index: usize) -> u32 {
        self.rows[index].load(Ordering::Relaxed)
    }

    /// Rows.
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// Candidates per row.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Bytes of the matrix, its rows in context included.
    pub fn bytes(&self) -> usize {
        self.rows.len() * 4 + self.context.bytes()
    }

    /// Rows that have been written.
    pub fn filled_rows(&self) -> usize {
        (0..self.vocab)
            .filter(|&t| self.k > 0 && self.cell(t * self.k) != UNSET)
            .count()
    }

    /// Whether `token`'s row was ever written (false for tokens outside the vocabulary).
    pub fn has_row(&self, token: u32) -> bool {
        self.candidate(token, 0).is_some()
    }

    /// The `rank`-th candidate after `token` (best first), or `None` before it was ever seen.
    pub fn candidate(&self, token: u32, rank: usize) -> Option<u32> {
        let t = token as usize;
        if t >= self.vocab || rank >= self.k || self.cell(t * self.k) == UNSET {
            return None;
        }
        Some(self.cell(t * self.k + rank))
    }

    /// The candidates after `token`, best first, or `None` before it was ever seen.
    pub fn candidates(&self, token: u32) -> Option<Vec<u32>> {
        self.has_row(token).then(|| {
            (0..self.k)
                .filter_map(|r| self.candidate(token, r))
                .collect()
        })
    }

    /// The `rank`-th candidate after `context` (oldest first, the token whose successors
    /// are asked for last) and how many of its tokens keyed the row that answered: the row
    /// after its last three tokens, else its last two, else `M[last]`.
    pub fn candidate_in(&self, context: &[u32], rank: usize) -> Option<(u32, usize)> {
        let &last = context.last()?;
        (2..=context.len().min(LONGEST_CONTEXT))
            .rev()
            .find_map(|n| {
                let keyed = &context[context.len() - n..];
                self.context.candidate(keyed, rank).map(|t| (t, n))
            })
            .or_else(|| self.candidate(last, rank).map(|t| (t, 1)))
    }

    /// Sets `M[token]` to the top-k of `logits`.
    pub fn update(&self, token: u32, logits: &[f32]) {
        self.update_after(&[], token, logits);
    }

    /// Sets `M[token]`, and the rows after `token` preceded by the last one and two tokens of
    /// `before` (the tokens fed before it on its path, oldest first), to the top-k of
    /// `logits`.
    pub fn update_after(&self, before: &[u32], token: u32, logits: &[f32]) {
        let t = token as usize;
        if t >= self.vocab || logits.len() < self.k {
            return;
        }
        let mut best = [UNSET; TOP_K];
        let mut heap;
        let row: &mut [u32] = if self.k <= TOP_K {
            &mut best[..self.k]
        } else {
            heap = vec![UNSET; self.k];
            &mut heap
        };
        crate::spec::top_k_into(logits, row);
        // The first cell marks the row as set, so it is written last.
        for (i, &id) in row.iter().enumerate().rev() {
            self.rows[t * self.k + i].store(id, Ordering::Relaxed);
        }
        let mut context = [0u32; LONGEST_CONTEXT];
        for n in 2..=(before.len() + 1).min(LONGEST_CONTEXT) {
            context[..n - 1].copy_from_slice(&before[before.len() + 1 - n..]);
            context[n - 1] = token;
            self.context.store(&context[..n], row);
        }
    }

    /// Writes the matrix to `path` (atomically, through a temporary file).
    pub fn save(&self, path: &Path) -> Result<()> {
        let tmp = path.with_extension("partial");
        let io = |e| Error::io(format!("saving recycling state to {}", path.display()), e);
        let mut out = std::io::BufWriter::new(std::fs::File::create(&tmp).map_err(io)?);
        out.write_all(MAGIC).map_err(io)?;
        out.write_all(&(self.vocab as u32).to_le_bytes())
            .map_err(io)?;
        out.write_all(&(self.k as u32).to_le_bytes()).map_err(io)?;
        for v in &self.rows {
            out.write_all(&v.load(Ordering::Relaxed).to_le_bytes())
                .map_err(io)?;
        }
        out.flush().map_err(io)?;
        drop(out);
        std::fs::rename(&tmp, path).map_err(io)
    }

    /// Reads a matrix saved by [`RecyclingMatrix::save`]; errors on a file that is not one or
    /// was made for another vocabulary.
    pub fn load(path: &Path, vocab: usize, k: usize) -> Result<Self> {
        let io = |e| {
            Error::io(
                format!("loading recycling state from {}", path.display()),
                e,
            )
        };
        let mut bytes = Vec::new();
        std::fs::File::open(path)
            .map_err(io)?
            .read_to_end(&mut bytes)
            .map_err(io)?;
        let bad = |why: &str| Error::Metadata(format!("recycling state {}: {why}", path.display()));
        let header = bytes.get(..16).ok_or_else(|| bad("truncated"))?;
        if &header[..8] != MAGIC {
            return Err(bad("not a thicket recycling state"));
        }
        let read_u32 = |b: &[u8]| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize;
        let (v, kk) = (read_u32(&header[8..12]), read_u32(&header[12..16]));
        if v != vocab || kk != k {
            return Err(bad(&format!(
                "made for {v} x {kk}, this model needs {vocab} x {k}"
            )));
        }
        let body = &bytes[16..];
        if body.len() != vocab * k * 4 {
            return Err(bad("wrong size"));
        }
        let cells = body
            .chunks_exact(4)
            .map(read_u32)
            .map(|x| x as u32)
            .collect();
        Ok(Self::from_cells(vocab, k, cells))
    }
}

/// The static draft tree: each node is its path of candidate ranks from the root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaticTree {
    /// `parent[i]`: index of node i's parent node, `None` under the root.
    parents: Vec<Option<usize>>,
    /// `rank[i]`: which candidate of its parent node i is.
    ranks: Vec<usize>,
}

const TREE_JSON: &str = include_str!("../../../../data/token_recycling_tree.json");

/// How often the candidate of each rank is the next token, where a row is known: measured
/// on SmolLM2's chat answers over rows keyed by one to three tokens (`benches/recycling_orders.py`
/// counts; rank 0 is 0.17-0.63 by key length, rank 1 0.08).
const RANK_ACCEPTED: [f64; 8] = [0.45, 0.08, 0.04, 0.025, 0.02, 0.015, 0.012, 0.01];

impl StaticTree {
    /// The paper's 80-node tree, its nodes best first ([`StaticTree::best_first`]).
    pub fn paper() -> Self {
        Self::from_json(TREE_JSON)
            .map(Self::best_first)
            .unwrap_or_else(|_| Self::chain(8))
    }

    /// The same tree with its nodes ordered by how likely each is to be accepted, parents
    /// first, so that the first b nodes are the best tree of b nodes it holds rather than
    /// its first layers: a node's estimate is the product of [`RANK_ACCEPTED`] along its
    /// path (ties keep the given order). On a CPU, where a tree is a few nodes, the paper's
    /// layer order drafts the root's first candidates side by side, where the first
    /// candidate's own first candidate is far likelier than the root's second.
    pub fn best_first(self) -> Self {
        let mut likely = Vec::with_capacity(self.len());
        for (&parent, &rank) in self.parents.iter().zip(&self.ranks) {
            let own = RANK_ACCEPTED.get(rank).copied().unwrap_or(0.005);
            likely.push(parent.map_or(1.0, |p: usize| likely[p]) * own);
        }
        let mut order: Vec<usize> = (0..self.len()).collect();
        // A child is less likely than its parent (every factor is below one), so it still
        // comes after it.
        order.sort_by(|&a, &b| likely[b].total_cmp(&likely[a]));
        let mut at = vec![0; self.len()];
        for (new, &old) in order.iter().enumerate() {
            at[old] = new;
        }
        Self {
            parents: order
                .iter()
                .map(|&old| self.parents[old].map(|p| at[p]))
                .collect(),
            ranks: order.iter().map(|&old| self.ranks[old]).collect(),
        }
    }

    /// A chain of `len` top-1 candidates (a fallback that cannot fail).
    pub fn chain(len: usize) -> Self {
        Self {
            parents: (0..len).map(|i| i.checked_sub(1)).collect(),
            ranks: vec![0; len],
        }
    }

    /// Parses `{"paths": [[0], [1], [0, 0], ...]}`: every path's parent must come earlier.
    pub fn from_json(text: &str) -> Result<Self> {
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| Error::Metadata(format!("tree json: {e}")))?;
        let paths: Vec<Vec<usize>> = serde_json::from_value(value["paths"].clone())
            .map_err(|e| Error::Metadata(format!("tree paths: {e}")))?;
        let mut index: std::collections::HashMap<Vec<usize>, usize> = Default::default();
        let (mut parents, mut ranks) = (Vec::new(), Vec::new());
        for (i, path) in paths.iter().enumerate() {
            let (&rank, prefix) = path
                .split_last()
                .ok_or_else(|| Error::Metadata("empty tree path".into()))?;
            let parent = if prefix.is_empty() {
                None
            } else {
                Some(*index.get(prefix).ok_or_else(|| {
                    Error::Metadata(format!("tree path {path:?} comes before its parent"))
                })?)
            };
            parents.push(parent);
            ranks.push(rank);
            index.insert(path.clone(), i);
        }
        Ok(Self { parents, ranks })
    }

    /// Nodes.
    pub fn len(&self) -> usize {
        self.parents.len()
    }

    /// Whether the tree has no node.
    pub fn is_empty(&self) -> bool {
        self.parents.is_empty()
    }
}

/// A sequence's Token Recycling drafter: walks the engine's shared matrix.
#[derive(Debug, Clone)]
pub struct TokenRecycling {
    matrix: Arc<RecyclingMatrix>,
    tree: Arc<StaticTree>,
    candidates: Candidates,
    /// How many tokens keyed the row that gave this step's first candidate (0: none).
    evidence: u8,
}

impl TokenRecycling {
    /// A drafter walking `tree` over `matrix`.
    pub fn new(matrix: Arc<RecyclingMatrix>, tree: Arc<StaticTree>) -> Self {
        Self {
            matrix,
            tree,
            candidates: Candidates::new(),
            evidence: 0,
        }
    }
}

/// The last [`LONGEST_CONTEXT`] tokens of a path, oldest first: what the matrix's rows are
/// keyed by (here and in `auto`'s merged tree).
pub(crate) type PathEnd = LastTokens<LONGEST_CONTEXT>;

impl Drafter for TokenRecycling {
    fn method(&self) -> SpecMethod {
        SpecMethod::Recycling
    }

    fn prepare(&mut self, ctx: &DraftContext<'_>) -> usize {
        self.candidates.clear();
        self.evidence = 0;
        if ctx.tokens.is_empty() {
            return 0;
        }
        let root = PathEnd::new(ctx.tokens);
        // Each static-tree node's candidate index and the end of its path, `None` where its
        // parent had no row. A node's candidates come from the row after the longest end of
        // its path the matrix knows (three tokens, two, or its own token alone).
        let mut placed: Vec<Option<(usize, PathEnd)>> = Vec::with_capacity(self.tree.len());
        for (&parent, &rank) in self.tree.parents.iter().zip(&self.tree.ranks) {
            let (path, parent_index) = match parent {
                None => (Some(root), None),
                Some(p) => match placed[p] {
                    Some((c, path)) => (Some(path), Some(c)),
                    None => (None, None),
                },
            };
            let found = path.and_then(|mut path| {
                let (token, keyed) = self.matrix.candidate_in(path.tokens(), rank)?;
                path.push(token);
                Some((token, keyed, path))
            });
            if parent.is_none() && rank == 0 {
                self.evidence = found.map_or(0, |(_, keyed, _)| keyed as u8);
            }
            placed.push(
                found.map(|(token, _, path)| (self.candidates.push(parent_index, token), path)),
            );
        }
        self.candidates.len()
    }

    fn evidence(&self) -> u8 {
        self.evidence
    }

    fn candidates(&self) -> Option<&Candidates> {
        Some(&self.candidates)
    }
}

/// Token Recycling's engine-wide side: the matrices, learned from every computed row.
#[derive(Debug)]
pub struct RecyclingSpeculator {
    matrices: Arc<RecyclingMatrices>,
    tree: Arc<StaticTree>,
    state: Option<std::path::PathBuf>,
}

impl RecyclingSpeculator {
    /// A matrix for `vocab` tokens, loaded from `state` when that file exists (a file made
    /// for another model is reported and replaced by a cold matrix); saved there at shutdown.
    pub fn new(vocab: usize, state: Option<std::path::PathBuf>) -> Self {
        let matrix = match &state {
            Some(path) if path.exists() => RecyclingMatrix::load(path, vocab, TOP_K)
                .unwrap_or_else(|e| {
                    tracing::warn!("starting with a cold recycling matrix: {e}");
                    RecyclingMatrix::new(vocab, TOP_K)
                }),
            _ => RecyclingMatrix::new(vocab, TOP_K),
        };
        Self {
            matrices: Arc::new(RecyclingMatrices::new(matrix)),
            tree: Arc::new(StaticTree::paper()),
            state,
        }
    }

    /// The shared matrices, for drafters that combine sources (`auto`).
    pub fn shared(&self) -> Arc<RecyclingMatrices> {
        Arc::clone(&self.matrices)
    }
}

impl Speculator for RecyclingSpeculator {
    fn method(&self) -> SpecMethod {
        SpecMethod::Recycling
    }

    fn drafter(&self, seq: &NewSequence<'_>) -> Option<Box<dyn Drafter>> {
        let matrix = self.matrices.get(seq.cache_scope);
        Some(Box::new(TokenRecycling::new(
            matrix,
            Arc::clone(&self.tree),
        )))
    }

    fn wants_logits(&self, token: u32, cache_scope: Option<BlockHash>) -> bool {
        self.matrices.lacks_row(token, cache_scope)
    }

    fn observe_row(&mut self, row: &ObservedRow<'_>) {
        self.matrices
            .get(row.cache_scope)
            .update_after(row.before.tokens(), row.token, row.logits);
    }

    fn save(&self) {
        if let Some(path) = &self.state {
            if let Err(e) = self.matrices.unsalted().save(path) {
                tracing::warn!("{e}");
            }
        }
    }
}

#[cfg(test)]
mod tests;
