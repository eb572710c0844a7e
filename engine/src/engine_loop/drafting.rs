//! The speculation side of a step, as the engine loop asks it of the coordinator
//! (`spec::coordinator`): before planning, every decoding sequence's draft offer (its best
//! case at the step's size, with the tokens its output format forces); after planning, the
//! draft tree of every sequence granted a budget, in the plan's order.

use std::collections::{HashMap, HashSet};

use kvcache::SeqId;
use rayon::prelude::*;
use scheduler::ScheduledSeq;

use super::{missing, Engine};
use crate::tree::TokenTree;
use crate::Result;

impl Engine {
    /// Offers of every sequence that decodes in `plan` and speculates (and whose best case
    /// could pay at the plan's size), with the tokens its output format forces (if it has
    /// one) offered as certain.
    pub(super) fn draft_offers(
        &mut self,
        plan: &scheduler::StepPlan,
    ) -> Option<scheduler::DraftInputs> {
        let decoding: HashSet<SeqId> = plan
            .scheduled
            .iter()
            .filter(|s| s.decodes())
            .map(|s| s.seq)
            .collect();
        if decoding.is_empty() {
            return None;
        }
        let scheduler = &self.scheduler;
        let room = scheduler.draft_room(plan);
        let mut candidates = Vec::new();
        let mut constraints = Vec::new();
        for (&id, record) in self.records.iter_mut() {
            let (Some(drafter), Some(seq)) = (record.drafter.as_mut(), scheduler.seq(id)) else {
                continue;
            };
            let ready = decoding.contains(&id) && seq.pending_forks() == 0;
            if ready {
                candidates.push((id, seq.tokens(), drafter));
                constraints.push(record.constraint.as_mut());
            }
        }
        // The look at each format's next mask runs on every core, as the constraint stage
        // does (which then reuses the mask the constraint kept).
        let forced: Vec<usize> = if constraints.iter().any(Option::is_some) {
            constraints
                .par_iter_mut()
                .map(|c| c.as_mut().map_or(0, |c| c.forced_estimate()))
                .collect()
        } else {
            vec![0; candidates.len()]
        };
        let offers = candidates
            .into_iter()
            .zip(forced)
            .map(|((id, tokens, drafter), forced)| (id, tokens, drafter, forced));
        self.spec.offers(offers, plan.num_batched_tokens, room)
    }

    /// The draft tree of every scheduled sequence granted a budget, in `scheduled`'s order
    /// (`None` for the others): one call into speculation before the forward.
    pub(super) fn draft_trees(
        &mut self,
        scheduled: &[ScheduledSeq],
    ) -> Result<Vec<Option<TokenTree>>> {
        let mut trees: Vec<Option<TokenTree>> = vec![None; scheduled.len()];
        let order: HashMap<SeqId, (usize, usize)> = scheduled
            .iter()
            .enumerate()
            .filter(|(_, s)| s.draft_budget > 0)
            .map(|(i, s)| (s.seq, (i, s.draft_budget)))
            .collect();
        if order.is_empty() {
            return Ok(trees);
        }
        let scheduler = &self.scheduler;
        let mut granted = Vec::with_capacity(order.len());
        for (&id, record) in self.records.iter_mut() {
            let (Some(&(at, budget)), Some(drafter)) = (order.get(&id), record.drafter.as_mut())
            else {
                continue;
            };
            let seq = scheduler.seq(id).ok_or_else(|| missing(id))?;
            granted.push((at, (id, seq.tokens(), budget, drafter)));
        }
        if granted.len() != order.len() {
            let lost = order
                .keys()
                .find(|id| self.records.get(id).is_none_or(|r| r.drafter.is_none()));
            return Err(missing(lost.copied().unwrap_or(SeqId(u64::MAX))));
        }
        // In scheduled order, so that batched drafting does not depend on hashing.
        granted.sort_unstable_by_key(|g| g.0);
        let positions: Vec<usize> = granted.iter().map(|g| g.0).collect();
        let mut granted: Vec<_> = granted.into_iter().map(|g| g.1).collect();
        let drafted = self.spec.draft_all(&mut granted);
        for (at, tree) in positions.into_iter().zip(drafted) {
            trees[at] = Some(tree);
        }
        Ok(trees)
    }
}
