//! The constraint stage, before the forward. Where a constrained sequence was granted a draft
//! tree (the planner offers the tokens its format forces as certain, so it is granted room
//! for them even without drafts of its own) and its format forces the next tokens (each the
//! only one allowed), the tree becomes the chain of those tokens (jump-forward: the model's
//! masked choice at each of them can only be the next, so every one is accepted). Otherwise the tree keeps only the nodes whose
//! path the format allows (pruned nodes are never fed). Each row that will be sampled gets
//! the mask of tokens allowed after it: one for a plain decode row, one per node of a tree,
//! each computed from the path that leads to it. Verification then chooses every node's
//! token from its masked row, so greedy output with speculation is the greedy output without
//! it, and sampling keeps the masked distribution.

use std::collections::HashMap;

use kvcache::SeqId;
use rayon::prelude::*;
use scheduler::ScheduledSeq;

use super::Engine;
use crate::constraint::{Constraint, TokenMask};
use crate::request::Failure;
use crate::tree::TokenTree;
use crate::Result;

/// One constrained sequence's masks this step.
pub(super) struct SeqMasks {
    /// The allowed tokens after each of its sampled rows, in row order.
    pub(super) rows: Vec<TokenMask>,
    /// Whether its tree is the format's forced tokens rather than its drafter's.
    pub(super) forced: bool,
}

/// Per constrained sequence, its masks.
pub(super) type Masks = HashMap<SeqId, SeqMasks>;

impl Engine {
    /// Prunes constrained sequences' trees (`trees[i]` belongs to `scheduled[i]`) and
    /// returns their masks. A constraint that fails fails its request only.
    pub(super) fn constrain(
        &mut self,
        scheduled: &[ScheduledSeq],
        trees: &mut [Option<TokenTree>],
    ) -> Masks {
        let started = std::time::Instant::now();
        let sampling: HashMap<SeqId, (usize, usize)> = scheduled
            .iter()
            .enumerate()
            .filter(|(_, s)| s.samples)
            .map(|(i, s)| (s.seq, (i, s.draft_budget)))
            .collect();
        let mut slots: Vec<Option<&mut Option<TokenTree>>> = trees.iter_mut().map(Some).collect();
        let mut jobs = Vec::new();
        for (&seq, record) in self.records.iter_mut() {
            let (Some(&(at, budget)), Some(constraint)) =
                (sampling.get(&seq), record.constraint.as_mut())
            else {
                continue;
            };
            if let Some(tree) = slots[at].take() {
                jobs.push((seq, record.request, constraint, tree, budget));
            }
        }
        if jobs.is_empty() {
            return HashMap::new();
        }
        // Sequences are independent: their masks are computed on every core.
        let eos = &self.eos_ids;
        let outcomes: Vec<(SeqId, u64, Result<SeqMasks>)> = jobs
            .into_par_iter()
            .map(|(seq, request, constraint, tree, budget)| {
                let outcome = match tree {
                    Some(tree) => constrain_tree(constraint.as_mut(), tree, budget, eos),
                    None => constraint.mask().map(|mask| SeqMasks {
                        rows: vec![mask],
                        forced: false,
                    }),
                };
                (seq, request, outcome)
            })
            .collect();
        let mut masks = HashMap::new();
        for (seq, request, outcome) in outcomes {
            match outcome {
                Ok(m) => {
                    masks.insert(seq, m);
                }
                Err(e) => self.fail_request_with(request, Failure::from_error(&e)),
            }
        }
        metrics::histogram!(crate::metrics::CONSTRAINT_DURATION)
            .record(started.elapsed().as_secs_f64());
        masks
    }
}

/// Replaces `tree` by the forced tokens (as many as the `budget` of nodes granted, whatever
/// the drafter made of it) where the format forces some, or else prunes it; returns the masks
/// of its rows.
fn constrain_tree(
    constraint: &mut dyn Constraint,
    tree: &mut TokenTree,
    budget: usize,
    eos: &[u32],
) -> Result<SeqMasks> {
    let (forced, masks) = forced_chain(constraint, budget, eos)?;
    if !forced.is_empty() {
        let mut chain = tree.tokens()[..1].to_vec();
        chain.extend_from_slice(&forced);
        *tree = TokenTree::chain(&chain);
        return Ok(SeqMasks {
            rows: masks,
            forced: true,
        });
    }
    let pruned = prune(constraint, tree, eos)?;
    let rows = tree_masks(constraint, &pruned)?;
    *tree = pruned;
    Ok(SeqMasks {
        rows,
        forced: false,
    })
}

/// The tokens the format forces next (each the only one allowed, never an end token), at
/// most `budget`, and the masks after each prefix of them (one more mask than tokens).
fn forced_chain(
    constraint: &mut dyn Constraint,
    budget: usize,
    eos: &[u32],
) -> Result<(Vec<u32>, Vec<TokenMask>)> {
    let mut tokens = Vec::new();
    let mut masks = vec![constraint.mask()?];
    while tokens.len() < budget {
        let Some(token) = masks.last().and_then(TokenMask::single) else {
            break;
        };
        if eos.contains(&token) {
            break;
        }
        tokens.push(token);
        masks.push(constraint.mask_after(&tokens)?);
    }
    Ok((tokens, masks))
}

/// The drafts under `node`'s path, root excluded.
fn drafts_to(tree: &TokenTree, node: usize) -> Vec<u32> {
    tree.path_to(node)[1..]
        .iter()
        .map(|&n| tree.tokens()[n])
        .collect()
}

/// `tree` without the nodes `constraint` does not allow after their ancestors (and without
/// end tokens: an output ends by being sampled, never as a draft).
fn prune(constraint: &mut dyn Constraint, tree: &TokenTree, eos: &[u32]) -> Result<TokenTree> {
    let mut error = None;
    let pruned = tree.retain(|node| {
        if error.is_some() || eos.contains(&tree.tokens()[node]) {
            return false;
        }
        let path = drafts_to(tree, node);
        match constraint.allowed_prefix(&path) {
            Ok(n) => n == path.len(),
            Err(e) => {
                error = Some(e);
                false
            }
        }
    });
    match error {
        Some(e) => Err(e),
        None => Ok(pruned),
    }
}

/// The allowed tokens after every node of `tree`.
fn tree_masks(constraint: &mut dyn Constraint, tree: &TokenTree) -> Result<Vec<TokenMask>> {
    (0..tree.len())
        .map(|node| constraint.mask_after(&drafts_to(tree, node)))
        .collect()
}
