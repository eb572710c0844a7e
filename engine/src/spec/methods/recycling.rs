//! Token Recycling. One adjacency matrix `M[vocab][k]` (k = 8) for the whole engine: after
//! every forward, for every token fed whose logits were computed, `M[token]` becomes the
//! top-k of those logits (last write wins). Every request drafts from the same matrix, so
//! what one request teaches, all use (the paper's hot start, shared across concurrent
//! requests), and the matrix can be saved and loaded so a restarted server starts warm.
//!
//! Drafting walks a static, imbalanced tree (80 nodes in 6 layers, from the paper) breadth
//! first: a node `[i, j]` is the j-th candidate of the i-th candidate of the root. The
//! tree's node list is in layer order, so its first b entries are the smaller tree used for
//! a budget of b.
//!
//! [`RecyclingSpeculator`] is the method's engine-wide side: it owns the matrices (one per
//! cache salt in use, `recycling_matrices`; each shared read-only with every drafter that
//! walks it), learns from every row the forward computed (into its sequence's salt's
//! matrix), asks for the logits of prompt rows whose token the matrix has never seen, and
//! saves the unsalted matrix.

use std::io::{Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use kvcache::BlockHash;

use super::recycling_matrices::RecyclingMatrices;
use crate::spec::speculator::{ObservedRow, Speculator};
use crate::spec::{Candidates, DraftContext, Drafter, NewSequence, SpecMethod};
use crate::tree::TokenTree;
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

    /// Bytes of the matrix.
    pub fn bytes(&self) -> usize {
        self.rows.len() * 4
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

    /// Sets `M[token]` to the top-k of `logits`.
    pub fn update(&self, token: u32, logits: &[f32]) {
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

const TREE_JSON: &str = include_str!("../../../data/token_recycling_tree.json");

impl StaticTree {
    /// The paper's 80-node tree.
    pub fn paper() -> Self {
        Self::from_json(TREE_JSON).unwrap_or_else(|_| Self::chain(8))
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
}

impl TokenRecycling {
    /// A drafter walking `tree` over `matrix`.
    pub fn new(matrix: Arc<RecyclingMatrix>, tree: Arc<StaticTree>) -> Self {
        Self {
            matrix,
            tree,
            candidates: Candidates::new(),
        }
    }
}

impl Drafter for TokenRecycling {
    fn method(&self) -> SpecMethod {
        SpecMethod::Recycling
    }

    fn prepare(&mut self, ctx: &DraftContext<'_>) -> usize {
        self.candidates.clear();
        let Some(&pending) = ctx.tokens.last() else {
            return 0;
        };
        // Candidate index of each static-tree node, `None` where its parent had no row.
        let mut placed: Vec<Option<usize>> = Vec::with_capacity(self.tree.len());
        for (&parent, &rank) in self.tree.parents.iter().zip(&self.tree.ranks) {
            let (source, parent_index) = match parent {
                None => (Some(pending), None),
                Some(p) => match placed[p] {
                    Some(c) => (Some(self.candidates.token(c)), Some(c)),
                    None => (None, None),
                },
            };
            let token = source.and_then(|t| self.matrix.candidate(t, rank));
            placed.push(token.map(|t| self.candidates.push(parent_index, t)));
        }
        self.candidates.len()
    }

    fn draft(&mut self, ctx: &DraftContext<'_>, budget: usize) -> TokenTree {
        let pending = ctx.tokens.last().copied().unwrap_or(0);
        self.candidates.tree(pending, budget)
    }

    fn observe(&mut self, _tokens: &[u32], _appended: usize) {}
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
            .update(row.token, row.logits);
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
mod tests {
    use super::*;

    #[test]
    fn the_paper_tree_has_80_nodes_in_layer_order() {
        let tree = StaticTree::paper();
        assert_eq!(tree.len(), 80);
        assert!(tree
            .parents
            .iter()
            .enumerate()
            .all(|(i, p)| p.is_none_or(|p| p < i)));
        assert_eq!(tree.parents.iter().filter(|p| p.is_none()).count(), 8);
    }

    #[test]
    fn matrix_keeps_the_top_k_and_round_trips_through_a_file() {
        let m = RecyclingMatrix::new(10, 3);
        assert_eq!(m.candidates(4), None);
        m.update(4, &[0.0, 5.0, 1.0, 9.0, 2.0, 0.5, 3.0, 0.0, 0.0, 0.0]);
        assert_eq!(m.candidates(4), Some(vec![3, 1, 6]));
        assert_eq!(m.candidate(4, 1), Some(1));
        assert_eq!(m.candidate(4, 3), None);
        assert_eq!(m.filled_rows(), 1);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.bin");
        m.save(&path).unwrap();
        assert_eq!(RecyclingMatrix::load(&path, 10, 3).unwrap(), m);
        assert!(RecyclingMatrix::load(&path, 11, 3).is_err());
        std::fs::write(&path, b"junk").unwrap();
        assert!(RecyclingMatrix::load(&path, 10, 3).is_err());
    }

    #[test]
    fn a_salted_sequence_drafts_only_from_its_salts_rows() {
        let mut spec = RecyclingSpeculator::new(10, None);
        let a = Some(BlockHash::scope(b"a"));
        let mut logits = vec![0.0; 10];
        logits[2] = 2.0;
        logits[3] = 1.0;
        spec.observe_row(&ObservedRow {
            token: 1,
            logits: &logits,
            cache_scope: a,
        });
        let tokens = [7, 1];
        let ctx = DraftContext { tokens: &tokens };
        let candidates = |scope| {
            let new = NewSequence {
                tokens: &tokens,
                prompt_len: 1,
                prediction: None,
                cache_scope: scope,
            };
            spec.drafter(&new).expect("recycling drafts").prepare(&ctx)
        };
        assert!(candidates(a) > 0);
        assert_eq!(candidates(None), 0);
        assert_eq!(candidates(Some(BlockHash::scope(b"b"))), 0);
        assert!(spec.wants_logits(1, None));
        assert!(!spec.wants_logits(1, a));
    }

    #[test]
    fn drafts_follow_the_matrix_breadth_first() {
        let m = RecyclingMatrix::new(10, 2);
        let row = |best: usize, second: usize| {
            let mut l = vec![0.0; 10];
            l[best] = 2.0;
            l[second] = 1.0;
            l
        };
        m.update(1, &row(2, 3));
        m.update(2, &row(4, 5));
        let tree =
            StaticTree::from_json(r#"{"paths": [[0], [1], [0, 0], [1, 0], [0, 0, 0]]}"#).unwrap();
        let mut d = TokenRecycling::new(Arc::new(m), Arc::new(tree));
        let tokens = [7, 1];
        let ctx = DraftContext { tokens: &tokens };
        // Root 1 -> [2, 3]; 2 -> [4]; 3 has no row; 4 has no row.
        assert_eq!(d.prepare(&ctx), 3);
        let t = d.draft(&ctx, 3);
        assert_eq!(t.tokens(), &[1, 2, 3, 4]);
        assert_eq!(t.parents(), &[None, Some(0), Some(0), Some(1)]);
    }
}
