//! `auto`: one tree per sequence, merged from every source the engine has for it
//! (`merged_tree`): the longest match of its recent tokens in its own tokens (a local suffix
//! index that grows with it) and in the global suffix index of its cache salt (what every
//! request of the salt sent and received, `suffix::global`), the request's prediction of its
//! output where it gave one (`prediction`: where the output stands in it), and Token
//! Recycling's matrix of
//! its salt, which branches beside and extends past what those matches propose, and drafts
//! alone, two levels deep, where nothing matches (calibrated apart).
//! Each node is priced by the calibrated
//! acceptance of the sources that proposed it, learnt engine-wide from every verified tree
//! ([`Calibration`]); the tree's running expected acceptance goes to the planner, which keeps
//! the nodes that pay for their rows. Drafts are counted per source (`context`,
//! `suffix_index`, `prediction`, `recycling`; a node several proposed counts for each), so
//! the prediction's accepted and rejected tokens are reported as under any other method.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use kvcache::BlockHash;

pub mod merged_tree;

use merged_tree::{Calibration, Limits, MergedTree, Proposal, Proposals, Source, SOURCES};

use crate::spec::methods::continuations::ContinuationTree;
use crate::spec::methods::prediction::{Prediction, PredictionDrafter};
use crate::spec::methods::recycling::matrices::RecyclingMatrices;
use crate::spec::methods::recycling::RecyclingMatrix;
use crate::spec::methods::suffix::index::{Occurrences, SuffixIndex};
use crate::spec::methods::suffix::{
    find_global, match_bucket, own_prompt, OwnTokens, SharedIndexes,
};
use crate::spec::speculator::Speculator;
use crate::spec::{Candidates, DraftContext, Drafter, NewSequence, SourceOutcome, SpecMethod};
use crate::tree::TokenTree;

/// The shape of `auto`'s trees.
const LIMITS: Limits = Limits {
    max_nodes: 64,
    floor: 0.02,
    recycling_branch: 2,
    recycling_depth: 3,
    recycling_alone: 2,
};
/// Most nodes of a tree where the request gave a prediction: its chains are long where the
/// output copies it.
const MAX_NODES_PREDICTED: usize = 160;
/// Deepest continuation of a match, and the shallowest a match allows.
const MAX_DEPTH: usize = 32;
const MIN_DEPTH: usize = 4;

/// The `auto` drafter.
pub struct AutoDrafter {
    own_tokens: OwnTokens,
    global: Option<SharedIndexes>,
    scope: Option<BlockHash>,
    /// Where its own prompt lies in the global index (its local index has it).
    own: Range<u64>,
    matrix: Arc<RecyclingMatrix>,
    calibration: Arc<Calibration>,
    found_global: Occurrences,
    context_trie: ContinuationTree,
    global_trie: ContinuationTree,
    /// The request's prediction, where it gave one.
    prediction: Option<PredictionDrafter>,
    prediction_trie: ContinuationTree,
    tree: MergedTree,
    evidence: u8,
    outcomes: Vec<SourceOutcome>,
}

impl AutoDrafter {
    /// A drafter for a sequence of `scope`, merging its own tokens, `global` (where the
    /// engine keeps one; passing over `own`, its prompt there) and `matrix`, priced by the
    /// engine-wide `calibration`.
    pub fn new(
        global: Option<SharedIndexes>,
        scope: Option<BlockHash>,
        own: Range<u64>,
        matrix: Arc<RecyclingMatrix>,
        calibration: Arc<Calibration>,
    ) -> Self {
        Self {
            own_tokens: OwnTokens::default(),
            global,
            scope,
            own,
            matrix,
            calibration,
            found_global: Occurrences::default(),
            context_trie: ContinuationTree::new(),
            global_trie: ContinuationTree::new(),
            prediction: None,
            prediction_trie: ContinuationTree::new(),
            tree: MergedTree::default(),
            evidence: 0,
            outcomes: Vec::new(),
        }
    }

    /// Also drafts from `prediction`, the request's prediction of its output (the output
    /// starting after `prompt_len` tokens).
    pub fn with_prediction(mut self, prediction: Arc<Prediction>, prompt_len: usize) -> Self {
        self.prediction = Some(PredictionDrafter::new(prediction, prompt_len));
        self
    }

    /// The continuations of `found`'s occurrences in `index`, into `trie`.
    fn fill(trie: &mut ContinuationTree, index: &SuffixIndex, found: &Occurrences) {
        trie.clear();
        let depth = (2 * found.len).clamp(MIN_DEPTH, MAX_DEPTH);
        for &(at, _) in &found.at {
            trie.add(index.continuation(at, depth), 1.0);
        }
    }
}

impl Drafter for AutoDrafter {
    fn method(&self) -> SpecMethod {
        SpecMethod::Auto
    }

    fn prepare(&mut self, ctx: &DraftContext<'_>) -> usize {
        let tokens = ctx.tokens;
        let Some(&pending) = tokens.last() else {
            return 0;
        };
        let context = self.own_tokens.find(tokens);
        Self::fill(
            &mut self.context_trie,
            self.own_tokens.index(),
            &self.own_tokens.found,
        );
        self.global_trie.clear();
        if let Some(global) = &self.global {
            let indexes = global.lock().unwrap_or_else(|e| e.into_inner());
            let index = find_global(
                &indexes,
                self.scope,
                context,
                &self.own,
                1,
                &mut self.found_global,
            );
            if let Some(index) = index {
                Self::fill(&mut self.global_trie, index, &self.found_global);
            }
        } else {
            self.found_global.clear();
        }
        fn proposal<'a>(trie: &'a ContinuationTree, found: &Occurrences) -> Option<Proposal<'a>> {
            (found.len > 0).then(|| Proposal {
                trie,
                evidence: usize::from(match_bucket(found.len)),
            })
        }
        let predicted = self.prediction.as_mut().and_then(|p| {
            p.propose(tokens, &mut self.prediction_trie)
                .filter(|_| !self.prediction_trie.is_empty())
        });
        let proposals = Proposals {
            context: proposal(&self.context_trie, &self.own_tokens.found),
            global: proposal(&self.global_trie, &self.found_global),
            prediction: predicted.map(|evidence| Proposal {
                trie: &self.prediction_trie,
                evidence,
            }),
        };
        let matrix = self.matrix.has_row(pending).then_some(&*self.matrix);
        let limits = match self.prediction {
            Some(_) => Limits {
                max_nodes: MAX_NODES_PREDICTED,
                ..LIMITS
            },
            None => LIMITS,
        };
        self.tree
            .grow(tokens, &proposals, matrix, &self.calibration, limits);
        self.evidence = match_bucket(self.own_tokens.found.len.max(self.found_global.len));
        self.tree.candidates.len()
    }

    fn evidence(&self) -> u8 {
        self.evidence
    }

    fn expected_accepted(&self) -> Option<&[f32]> {
        Some(&self.tree.expected)
    }

    fn candidates(&self) -> Option<&Candidates> {
        Some(&self.tree.candidates)
    }

    fn verified(&mut self, tree: &TokenTree, accepted: &[usize]) {
        // Each verified node back to the candidate it was: by its parent's and its token.
        let candidates = &self.tree.candidates;
        let by_path: HashMap<(Option<usize>, u32), usize> = (0..candidates.len())
            .map(|i| ((candidates.parent(i), candidates.token(i)), i))
            .collect();
        let mut drafted_as: Vec<Option<usize>> = vec![None; tree.len()];
        self.outcomes.clear();
        let mut drafted = [0usize; SOURCES];
        let mut accepted_at: [Vec<usize>; SOURCES] = Default::default();
        for node in 1..tree.len() {
            let Some(parent) = tree.parents()[node] else {
                continue;
            };
            let parent_candidate = match parent {
                0 => None,
                p => match drafted_as[p] {
                    Some(c) => Some(c),
                    None => continue,
                },
            };
            let Some(&candidate) = by_path.get(&(parent_candidate, tree.tokens()[node])) else {
                continue;
            };
            drafted_as[node] = Some(candidate);
            // The accepted path is root first: a hit's depth is its place on it.
            let depth = accepted.iter().position(|&a| a == node);
            let hit = depth.is_some();
            let parent_hit = accepted.contains(&parent);
            for cell in self.tree.cells[candidate].iter().flatten() {
                if parent_hit {
                    self.calibration.record(*cell, hit);
                }
            }
            for source in Source::ALL {
                let at = source as usize;
                if self.tree.cells[candidate][at].is_some() {
                    drafted[at] += 1;
                    accepted_at[at].extend(depth);
                }
            }
        }
        for (source, (drafted, mut accepted_at)) in
            Source::ALL.iter().zip(drafted.into_iter().zip(accepted_at))
        {
            if drafted > 0 {
                accepted_at.sort_unstable();
                self.outcomes.push(SourceOutcome {
                    method: source.method(),
                    drafted,
                    accepted_at,
                });
            }
        }
    }

    fn source_outcomes(&self) -> &[SourceOutcome] {
        &self.outcomes
    }

    fn drafts_prediction(&self) -> bool {
        self.prediction.is_some()
    }
}

/// `auto`'s speculator: Token Recycling's matrices (learnt by its own speculator; a sequence
/// drafts from its cache salt's), the global suffix indexes (taught by the `suffix`
/// speculator, which sees every request), and the calibration every `auto` sequence shares.
pub struct AutoSpeculator {
    matrices: Arc<RecyclingMatrices>,
    indexes: Option<SharedIndexes>,
    calibration: Arc<Calibration>,
}

impl AutoSpeculator {
    /// Drafters over `matrices` and `indexes` (none: the context and the matrix alone).
    pub fn new(matrices: Arc<RecyclingMatrices>, indexes: Option<SharedIndexes>) -> Self {
        Self {
            matrices,
            indexes,
            calibration: Arc::new(Calibration::new()),
        }
    }
}

impl Speculator for AutoSpeculator {
    fn method(&self) -> SpecMethod {
        SpecMethod::Auto
    }

    fn drafter(&self, seq: &NewSequence<'_>) -> Option<Box<dyn Drafter>> {
        let own = self
            .indexes
            .as_ref()
            .map_or(0..0, |indexes| own_prompt(indexes, seq));
        let drafter = AutoDrafter::new(
            self.indexes.clone(),
            seq.cache_scope,
            own,
            self.matrices.get(seq.cache_scope),
            Arc::clone(&self.calibration),
        );
        Some(Box::new(match seq.prediction {
            Some(p) => drafter.with_prediction(Arc::clone(p), seq.prompt_len),
            None => drafter,
        }))
    }

    fn wants_logits(&self, token: u32, cache_scope: Option<BlockHash>) -> bool {
        self.matrices.lacks_row(token, cache_scope)
    }
}

#[cfg(test)]
mod tests;
