//! Predicted Outputs: drafting from the text a request expects its output to be (OpenAI's
//! `prediction`; a file before an edit, a document before it is reformatted). The prediction
//! is tokenized once, and an index of where each token occurs in it is built once per
//! request ([`Prediction`]). Each step [`PredictionDrafter`] finds where the output stands
//! in the prediction: the longest match of the output's last tokens in the prediction
//! (ties go to the occurrence nearest the anchor, the place the output last followed the
//! prediction for a few tokens), so that an output that departs from the prediction and
//! later rejoins it is followed again. It drafts what follows that match as a chain, and
//! where the anchor points elsewhere (the output left the prediction and may come back
//! where it left) a second branch from the anchor: an inserted line rejoins the prediction
//! where it left it, a replaced line a line later. The evidence is the match length.
//!
//! `auto` merges the prediction's proposal ([`PredictionDrafter::propose`]) into its one
//! tree with its other sources. [`PredictionFirst`] puts the prediction before any other
//! method's drafter: it drafts while the output follows the prediction and hands the step
//! to the wrapped drafter where the output has left it.

use std::collections::HashMap;
use std::sync::Arc;

use crate::spec::methods::continuations::ContinuationTree;
use crate::spec::{Candidates, DraftContext, Drafter, SourceOutcome, SpecMethod};
use crate::tree::TokenTree;

/// Longest match measured (a longer one is as strong as this).
const MAX_MATCH: usize = 32;
/// Most nodes of the chain after the best match.
const PRIMARY_NODES: usize = 128;
/// Most nodes of the branch from the anchor (or the second-best match).
const SECONDARY_NODES: usize = 32;
/// A match this long moves the anchor (shorter ones are too ambiguous in text that repeats
/// itself, as code does), as does one that covers the whole output so far.
const ANCHOR_MATCH: usize = 3;
/// Below this match length, the first nodes of both branches come before the rest of the
/// best one: neither alignment is sure.
const SURE_MATCH: usize = 4;
/// Nodes of each branch that come first when neither alignment is sure.
const UNSURE_HEAD: usize = 4;

/// A request's prediction: its tokens and, per token, where it occurs.
#[derive(Debug)]
pub struct Prediction {
    tokens: Arc<[u32]>,
    positions: HashMap<u32, Vec<u32>>,
}

impl Prediction {
    /// The index of `tokens`.
    pub fn new(tokens: Arc<[u32]>) -> Self {
        let mut positions: HashMap<u32, Vec<u32>> = HashMap::new();
        for (i, &t) in tokens.iter().enumerate() {
            positions.entry(t).or_default().push(i as u32);
        }
        Self { tokens, positions }
    }

    /// Its tokens.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Tokens in it.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether it has none.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Every place the output's end matches: `(start of the continuation, match length)`
    /// for each occurrence of `output`'s last token, the length counted backwards (at most
    /// [`MAX_MATCH`] and the output's length).
    fn matches<'a>(&'a self, output: &'a [u32]) -> impl Iterator<Item = (usize, usize)> + 'a {
        let last = output.last().copied();
        let positions = last
            .and_then(|t| self.positions.get(&t))
            .map_or(&[][..], Vec::as_slice);
        let cap = MAX_MATCH.min(output.len());
        positions.iter().map(move |&p| {
            let p = p as usize;
            let k = (0..cap.min(p + 1))
                .take_while(|&j| self.tokens[p - j] == output[output.len() - 1 - j])
                .count();
            (p + 1, k)
        })
    }
}

/// One sequence's drafter from its request's prediction.
#[derive(Debug)]
pub struct PredictionDrafter {
    prediction: Arc<Prediction>,
    /// Where the output starts in the sequence's tokens.
    prompt_len: usize,
    /// Where in the prediction the output is expected to continue: after the last place it
    /// followed the prediction for [`ANCHOR_MATCH`] tokens (the start, before that).
    anchor: usize,
    candidates: Candidates,
    evidence: u8,
}

/// How far continuing at `start` is from continuing at `anchor`, forwards first: an output
/// that left the prediction mostly comes back further on.
fn distance(start: usize, anchor: usize, len: usize) -> usize {
    if start >= anchor {
        start - anchor
    } else {
        anchor - start + len
    }
}

/// The nodes of two branches under the root as `(parent, token)`, each parent an earlier
/// node (or the root), in the order they are worth drafting. The second branch shares the
/// nodes it agrees with the first on. The first branch comes first; where the alignment is
/// `unsure`, the first [`UNSURE_HEAD`] nodes of both come before the rest of the first.
fn merge_branches(first: &[u32], second: &[u32], unsure: bool) -> Vec<(Option<usize>, u32)> {
    // (parent, token, rank) in push order; sorted by rank below.
    let mut nodes: Vec<(Option<usize>, u32, usize)> =
        Vec::with_capacity(first.len() + second.len());
    let mut parent = None;
    for (i, &token) in first.iter().enumerate() {
        let rank = if unsure && i >= UNSURE_HEAD {
            i + UNSURE_HEAD
        } else {
            i
        };
        nodes.push((parent, token, rank));
        parent = Some(nodes.len() - 1);
    }
    let mut parent = None;
    let mut shared = true;
    for (j, &token) in second.iter().enumerate() {
        if shared && first.get(j) == Some(&token) {
            parent = Some(j);
            continue;
        }
        shared = false;
        let rank = if unsure && j < UNSURE_HEAD {
            UNSURE_HEAD + j
        } else {
            first.len() + UNSURE_HEAD + j
        };
        nodes.push((parent, token, rank));
        parent = Some(nodes.len() - 1);
    }
    // A child's rank is above its parent's, so parents stay first.
    let mut order: Vec<usize> = (0..nodes.len()).collect();
    order.sort_by_key(|&i| nodes[i].2);
    let mut placed = vec![0usize; nodes.len()];
    order
        .iter()
        .enumerate()
        .map(|(at, &i)| {
            placed[i] = at;
            let (parent, token, _) = nodes[i];
            (parent.map(|p| placed[p]), token)
        })
        .collect()
}

/// The evidence level of a match of `k` tokens: 1 for none (the anchor's branch alone),
/// then growing with the length. A short match `near` the anchor (continuing at most
/// [`NEAR`] tokens after it: the output starting to follow the prediction from its start,
/// or rejoining it where it left or a line later) has levels of its own: it says more than
/// the same length anywhere else.
fn level(k: usize, near: bool) -> u8 {
    match k {
        0 => 1,
        1..=7 if near => 11 + k as u8,
        1..=3 => 1 + k as u8,
        4..=7 => 5,
        8..=15 => 6,
        16..=31 => 7,
        _ => 8,
    }
}

/// The share of a prediction's drafted nodes, each given its parent, expected accepted at
/// evidence `level` before any was verified: a long match, or a short one where the output
/// follows from its start or rejoins it, is followed for long; the anchor's branch with
/// no match is a guess.
pub(crate) fn prior_rate(level: u8) -> f32 {
    match level {
        0 | 1 => 0.5,
        2 => 0.55,
        3 => 0.65,
        4 => 0.75,
        5 => 0.8,
        6 => 0.9,
        7 => 0.93,
        8 => 0.95,
        12..=18 => 0.84 + 0.015 * f32::from(level - 12),
        _ => 0.5,
    }
}

/// The highest [`prior_rate`].
pub(crate) const BEST_PRIOR_RATE: f32 = 0.95;

/// How far after the anchor a match may continue and still count as rejoining there.
const NEAR: usize = 48;

impl PredictionDrafter {
    /// A drafter for a sequence whose output starts after `prompt_len` tokens.
    pub fn new(prediction: Arc<Prediction>, prompt_len: usize) -> Self {
        Self {
            prediction,
            prompt_len,
            anchor: 0,
            candidates: Candidates::new(),
            evidence: 0,
        }
    }

    /// Where the output is expected to continue in the prediction.
    pub fn anchor(&self) -> usize {
        self.anchor
    }

    /// Where the output of a sequence with `tokens` stands in the prediction (moving the
    /// anchor where it follows it); `None` before any output, with an empty prediction, or
    /// where nothing would be drafted.
    fn align(&mut self, tokens: &[u32]) -> Option<Alignment> {
        let output = &tokens[self.prompt_len.min(tokens.len())..];
        let len = self.prediction.len();
        if output.is_empty() || len == 0 {
            return None;
        }
        // The best match and the best one continuing elsewhere (the longer first, then the
        // nearer the anchor).
        let anchor = self.anchor;
        let rank =
            |(start, k): (usize, usize)| (k, std::cmp::Reverse(distance(start, anchor, len)));
        let mut best: Option<(usize, usize)> = None;
        let mut second: Option<(usize, usize)> = None;
        for m in self.prediction.matches(output).filter(|m| m.1 > 0) {
            if best.is_none_or(|b| rank(m) > rank(b)) {
                second = best;
                best = Some(m);
            } else if second.is_none_or(|s| rank(m) > rank(s)) {
                second = Some(m);
            }
        }
        let k = best.map_or(0, |b| b.1);
        if let Some((start, k)) = best {
            if k >= ANCHOR_MATCH.min(output.len()) {
                self.anchor = start;
            }
        }
        // The second branch: from the anchor where the best match continues elsewhere,
        // else from the runner-up.
        let other = match best {
            Some((start, _)) if start != self.anchor => Some(self.anchor),
            Some(_) => second.map(|s| s.0),
            None => Some(self.anchor),
        };
        let branch = |start: usize, most: usize| start.min(len)..(start + most).min(len);
        let found = Alignment {
            primary: best.map_or(0..0, |(start, _)| branch(start, PRIMARY_NODES)),
            secondary: other.map_or(0..0, |s| branch(s, SECONDARY_NODES)),
            k,
            // Near the anchor as it was before this step's match moved it.
            near: best.is_some_and(|(start, _)| start >= anchor && start - anchor <= NEAR + k),
        };
        (!found.primary.is_empty() || !found.secondary.is_empty()).then_some(found)
    }

    /// This step's proposal as weighted paths into `trie` (cleared first), for a drafter
    /// that merges the prediction with other sources: the best match's continuation, and
    /// the other branch weighing as much where neither alignment is sure, a fifth of it
    /// where the match is. Returns the evidence bucket (0 to 7: the match's length, a
    /// short one near the anchor above the same far from it); `None`: nothing to propose.
    pub fn propose(&mut self, tokens: &[u32], trie: &mut ContinuationTree) -> Option<usize> {
        trie.clear();
        let found = self.align(tokens)?;
        let tokens = self.prediction.tokens();
        let other = if found.unsure() { 0.8 } else { 0.2 };
        trie.add(tokens[found.primary.clone()].iter().copied(), 1.0);
        trie.add(tokens[found.secondary.clone()].iter().copied(), other);
        Some(bucket(found.k, found.near))
    }
}

/// Where the output stands in the prediction this step.
#[derive(Debug, Clone)]
struct Alignment {
    /// The continuation of the best match (empty: none).
    primary: std::ops::Range<usize>,
    /// The other branch: from the anchor, or the runner-up match.
    secondary: std::ops::Range<usize>,
    /// The best match's length.
    k: usize,
    /// Whether it continues near the anchor.
    near: bool,
}

impl Alignment {
    /// Whether the match is too short to prefer its branch outright.
    fn unsure(&self) -> bool {
        self.k < SURE_MATCH
    }
}

/// [`level`]'s evidence on a merged tree's scale of 8 buckets: no match; one token far
/// from the anchor; two or three far; one to three near; four to seven far; four to seven
/// near, or eight to fifteen; sixteen to thirty-one; longer.
fn bucket(k: usize, near: bool) -> usize {
    match k {
        0 => 0,
        1 if !near => 1,
        2..=3 if !near => 2,
        1..=3 => 3,
        4..=7 if !near => 4,
        4..=15 => 5,
        16..=31 => 6,
        _ => 7,
    }
}

impl Drafter for PredictionDrafter {
    fn method(&self) -> SpecMethod {
        SpecMethod::Prediction
    }

    fn prepare(&mut self, ctx: &DraftContext<'_>) -> usize {
        self.candidates.clear();
        self.evidence = 0;
        let Some(found) = self.align(ctx.tokens) else {
            return 0;
        };
        let tokens = self.prediction.tokens();
        let primary = &tokens[found.primary.clone()];
        let secondary = &tokens[found.secondary.clone()];
        for (parent, token) in merge_branches(primary, secondary, found.unsure()) {
            self.candidates.push(parent, token);
        }
        if !self.candidates.is_empty() {
            self.evidence = level(found.k, found.near);
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

/// The prediction before another drafter: the prediction drafts while the output follows it
/// (a match of two tokens or more, or the output so far being its start); elsewhere the
/// wrapped drafter does, and the prediction's weaker guesses only where that one has none.
pub struct PredictionFirst {
    prediction: PredictionDrafter,
    inner: Option<Box<dyn Drafter>>,
    /// Whether the prediction drafts this step.
    using_prediction: bool,
}

/// The evidence from which the prediction goes before the wrapped drafter: any match of
/// two tokens, and a one-token match near the anchor.
fn follows(level: u8) -> bool {
    level >= 3
}

impl PredictionFirst {
    /// `prediction` first, then `inner` (none: the prediction alone).
    pub fn new(prediction: PredictionDrafter, inner: Option<Box<dyn Drafter>>) -> Self {
        Self {
            prediction,
            inner,
            using_prediction: true,
        }
    }

    fn current(&self) -> &dyn Drafter {
        match &self.inner {
            Some(inner) if !self.using_prediction => inner.as_ref(),
            _ => &self.prediction,
        }
    }

    fn current_mut(&mut self) -> &mut dyn Drafter {
        match &mut self.inner {
            Some(inner) if !self.using_prediction => inner.as_mut(),
            _ => &mut self.prediction,
        }
    }
}

impl Drafter for PredictionFirst {
    fn method(&self) -> SpecMethod {
        self.current().method()
    }

    fn prepare(&mut self, ctx: &DraftContext<'_>) -> usize {
        let own = self.prediction.prepare(ctx);
        self.using_prediction = true;
        if own > 0 && follows(self.prediction.evidence()) {
            return own;
        }
        if let Some(inner) = self.inner.as_mut() {
            let theirs = inner.prepare(ctx);
            if theirs > 0 || own == 0 {
                self.using_prediction = false;
                return theirs;
            }
        }
        own
    }

    fn evidence(&self) -> u8 {
        self.current().evidence()
    }

    fn candidates(&self) -> Option<&Candidates> {
        self.current().candidates()
    }

    fn draft(&mut self, ctx: &DraftContext<'_>, budget: usize) -> TokenTree {
        self.current_mut().draft(ctx, budget)
    }

    fn observe(&mut self, tokens: &[u32], appended: usize) {
        self.prediction.observe(tokens, appended);
        if let Some(inner) = self.inner.as_mut() {
            inner.observe(tokens, appended);
        }
    }

    fn record(&mut self, drafted: usize, accepted: usize) {
        self.current_mut().record(drafted, accepted);
    }

    fn expected_accepted(&self) -> Option<&[f32]> {
        self.current().expected_accepted()
    }

    fn verified(&mut self, tree: &TokenTree, accepted: &[usize]) {
        self.current_mut().verified(tree, accepted);
    }

    fn source_outcomes(&self) -> &[SourceOutcome] {
        self.current().source_outcomes()
    }

    fn needs_speculator(&self) -> bool {
        !self.using_prediction && self.inner.as_ref().is_some_and(|d| d.needs_speculator())
    }
}

#[cfg(test)]
mod tests;
