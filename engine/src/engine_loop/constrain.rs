//! The constraint stage, in two parts. Before the forward: where a constrained sequence was
//! granted a draft tree (the planner offers the tokens its format forces as certain, so it
//! is granted room for them even without drafts of its own) and its format forces the next
//! tokens (each the only one allowed), the tree becomes the chain of those tokens
//! (jump-forward: the model's masked choice at each of them can only be the next, so every
//! one is accepted); otherwise the tree keeps only the nodes whose path the format allows
//! (pruned nodes are never fed). During the forward, on another thread: each row that will
//! be sampled gets the mask of tokens allowed after it, one for a plain decode row, one per
//! node of a tree, each computed from the path that leads to it. Verification then chooses
//! every node's token from its masked row, so greedy output with speculation is the greedy
//! output without it, and sampling keeps the masked distribution.

use std::collections::HashMap;

use kvcache::SeqId;
use rayon::prelude::*;
use scheduler::ScheduledSeq;

use super::record::SeqRecord;
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

/// One deferred sequence's masks (or why they failed), with its id and request.
pub(super) type RowMasks = (SeqId, u64, Result<Vec<TokenMask>>);

/// Rows whose masks are left to compute while the forward runs: per constrained sequence,
/// its request and its pruned tree (`None`: one plain row).
pub(super) type Deferred = Vec<(SeqId, u64, Option<TokenTree>)>;

/// What the stage before the forward made of one constrained sequence.
enum Before {
    /// Its masks, complete (a forced chain's masks are known once the chain is).
    Ready(SeqMasks),
    /// Its rows' masks are computed during the forward.
    Later(Option<TokenTree>),
}

impl Engine {
    /// The part of the constraint stage the forward needs first: constrained sequences' trees
    /// (`trees[i]` belongs to `scheduled[i]`) become the format's forced tokens or are pruned
    /// to what it allows. Returns the masks known already and the rows whose masks can wait
    /// for [`deferred_masks`], run beside the forward. A constraint that fails fails its
    /// request only.
    pub(super) fn constrain(
        &mut self,
        scheduled: &[ScheduledSeq],
        trees: &mut [Option<TokenTree>],
    ) -> (Masks, Deferred) {
        let started = std::time::Instant::now();
        let sampling: HashMap<SeqId, (usize, usize)> = scheduled
            .iter()
            .enumerate()
            .filter(|(_, s)| s.samples)
            .map(|(i, s)| (s.seq, (i, s.draft_budget)))
            .collect();
        let mut slots: Vec<Option<&mut Option<TokenTree>>> = trees.iter_mut().map(Some).collect();
        let mut jobs = Vec::new();
        // A plain row has nothing to settle: its mask alone waits for the forward.
        let mut deferred = Vec::new();
        for (&seq, record) in self.records.iter_mut() {
            let (Some(&(at, budget)), Some(constraint)) =
                (sampling.get(&seq), record.constraint.as_mut())
            else {
                continue;
            };
            match slots[at].take() {
                Some(Some(tree)) => jobs.push((seq, record.request, constraint, tree, budget)),
                Some(None) => deferred.push((seq, record.request, None)),
                None => {}
            }
        }
        if jobs.is_empty() && deferred.is_empty() {
            return (HashMap::new(), deferred);
        }
        // Sequences are independent: their trees are settled on every core.
        let eos = &self.eos_ids;
        let outcomes: Vec<(SeqId, u64, Result<Before>)> = jobs
            .into_par_iter()
            .map(|(seq, request, constraint, tree, budget)| {
                (
                    seq,
                    request,
                    settle_tree(constraint.as_mut(), tree, budget, eos),
                )
            })
            .collect();
        let mut masks = HashMap::new();
        for (seq, request, outcome) in outcomes {
            match outcome {
                Ok(Before::Ready(m)) => {
                    masks.insert(seq, m);
                }
                Ok(Before::Later(tree)) => deferred.push((seq, request, tree)),
                Err(e) => self.fail_request_with(request, Failure::from_error(&e)),
            }
        }
        metrics::histogram!(crate::metrics::CONSTRAINT_DURATION)
            .record(started.elapsed().as_secs_f64());
        (masks, deferred)
    }

    /// Adds the masks [`deferred_masks`] computed; a constraint that failed fails its
    /// request (its rows were computed for nothing, and its outcome is `Gone`).
    pub(super) fn merge_masks(&mut self, masks: &mut Masks, computed: Vec<RowMasks>) {
        for (seq, request, rows) in computed {
            match rows {
                Ok(rows) => {
                    masks.insert(
                        seq,
                        SeqMasks {
                            rows,
                            forced: false,
                        },
                    );
                }
                Err(e) => self.fail_request_with(request, Failure::from_error(&e)),
            }
        }
    }
}

/// One deferred sequence's work: its id, its request, its constraint and its pruned tree
/// (`None`: one plain row).
pub(super) type MaskJob<'a> = (SeqId, u64, &'a mut Box<dyn Constraint>, Option<TokenTree>);

/// The deferred constraints of `records` with their rows (`deferred`), ready to be handed to
/// [`deferred_masks`] on another thread.
pub(super) fn deferred_jobs(
    records: &mut HashMap<SeqId, SeqRecord>,
    deferred: Deferred,
) -> Vec<MaskJob<'_>> {
    let mut wanted: HashMap<SeqId, (u64, Option<TokenTree>)> = deferred
        .into_iter()
        .map(|(seq, request, tree)| (seq, (request, tree)))
        .collect();
    let mut jobs = Vec::with_capacity(wanted.len());
    for (&seq, record) in records.iter_mut() {
        let (Some(constraint), Some((request, tree))) =
            (record.constraint.as_mut(), wanted.remove(&seq))
        else {
            continue;
        };
        jobs.push((seq, request, constraint, tree));
    }
    jobs
}

/// The masks of deferred rows: a plain row's one mask, or one per node of a pruned tree,
/// sequences in parallel. Runs beside the forward, which does not need them (only sampling
/// does), and records its time in the constraint stage's histogram.
pub(super) fn deferred_masks(jobs: Vec<MaskJob<'_>>) -> Vec<RowMasks> {
    if jobs.is_empty() {
        return Vec::new();
    }
    let started = std::time::Instant::now();
    let computed = jobs
        .into_par_iter()
        .map(|(seq, request, constraint, tree)| {
            let rows = match tree {
                Some(tree) => tree_masks(constraint.as_mut(), &tree),
                None => constraint.mask().map(|mask| vec![mask]),
            };
            (seq, request, rows)
        })
        .collect();
    metrics::histogram!(crate::metrics::CONSTRAINT_DURATION)
        .record(started.elapsed().as_secs_f64());
    computed
}

/// Replaces `tree` by the forced tokens (as many as the `budget` of nodes granted, whatever
/// the drafter made of it) where the format forces some, with their masks; or else prunes it
/// and leaves its rows' masks for later.
fn settle_tree(
    constraint: &mut dyn Constraint,
    tree: &mut TokenTree,
    budget: usize,
    eos: &[u32],
) -> Result<Before> {
    let (forced, masks) = forced_chain(constraint, budget, eos)?;
    if !forced.is_empty() {
        let mut chain = tree.tokens()[..1].to_vec();
        chain.extend_from_slice(&forced);
        *tree = TokenTree::chain(&chain);
        return Ok(Before::Ready(SeqMasks {
            rows: masks,
            forced: true,
        }));
    }
    *tree = prune(constraint, tree, eos)?;
    Ok(Before::Later(Some(tree.clone())))
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
