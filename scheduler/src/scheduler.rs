//! `Scheduler`: the queues and the step algorithm.
//!
//! ```text
//!  schedule():
//!   1 running, oldest admission first: feed min(known - computed, budget left - one token
//!     for each running sequence still to serve); if the blocks for that do not exist,
//!     preempt the newest running sequence (maybe this one) and retry
//!   2 if nobody was preempted: admit waiting sequences in arrival order while the sequence
//!     cap, the budget and the blocks allow (reusing cached prefix blocks); stop at the first
//!     that does not fit, so nobody overtakes it
//!   prefill-only sequences (pooling requests, `prefill_only`) take at most a share of a step
//!   while a generating sequence is in the scheduler; one with no room left this step is
//!   passed over, not waited on
//!  grant_drafts(plan, offers):  split the room left among the decoding sequences' offers
//!   (`crate::budget`)
//!  commit(seq, progress, new tokens):  computed += fed (or accepted path), tokens += new
//! ```
//! Preempted sequences drop their KV and go to the front of the queue in arrival order; they
//! recompute their known tokens as a prefill, which gives the same logits, so they resume
//! with identical output.

mod prefill_only;

use std::collections::{HashMap, VecDeque};

use kvcache::{BlockHash, BlockManager, BlockTable, CacheStats, KvMove, SeqId};

use crate::budget::{allocate, DraftInputs, DraftOffer};
use crate::{
    Progress, ScheduledSeq, SchedulerConfig, SchedulerError, SeqStatus, Sequence, StepPlan,
};

/// The most that draft rows may add to the estimated cost of a step that gives a prompt its
/// first token. Drafting trades a longer step for more tokens per step, and a request whose
/// first token waits on the step gains nothing from the trade: with 16 clients on a CPU,
/// drafting methods measured a 1-4% longer time to the first token than the control.
const FIRST_TOKEN_SHARE: f64 = 0.02;

/// Counters of the scheduler's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SchedulerStats {
    /// Sequences running now.
    pub running: usize,
    /// Sequences waiting now.
    pub waiting: usize,
    /// Preemptions so far.
    pub preemptions: u64,
    /// Steps planned so far.
    pub steps: u64,
}

/// Sequences, queues and the KV blocks they hold.
#[derive(Debug)]
pub struct Scheduler {
    config: SchedulerConfig,
    blocks: BlockManager,
    seqs: HashMap<SeqId, Sequence>,
    /// Arrival order; preempted sequences are put back in their arrival place at the front.
    waiting: VecDeque<SeqId>,
    /// Admission order, oldest first.
    running: Vec<SeqId>,
    next_arrival: u64,
    preemptions: u64,
    steps: u64,
}

impl Scheduler {
    /// A scheduler with an empty KV pool of `config.kv`.
    pub fn new(config: SchedulerConfig) -> Result<Self, SchedulerError> {
        config.validate()?;
        Ok(Self {
            blocks: BlockManager::new(config.kv),
            config,
            seqs: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            next_arrival: 0,
            preemptions: 0,
            steps: 0,
        })
    }

    /// The limits in force.
    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// Queues a new sequence that will be forked into `n` sequences (`n >= 1`) once its
    /// prompt is computed. It (and its forks) finds and leaves cached prefix blocks only
    /// under `cache_scope` (its request's cache salt, [`BlockHash::scope`]; `None`: no salt).
    pub fn add(
        &mut self,
        seq: SeqId,
        prompt: Vec<u32>,
        n: usize,
        cache_scope: Option<BlockHash>,
    ) -> Result<(), SchedulerError> {
        if self.seqs.contains_key(&seq) {
            return Err(SchedulerError::DuplicateSeq(seq));
        }
        if prompt.is_empty() {
            return Err(SchedulerError::EmptyPrompt);
        }
        if prompt.len() >= self.config.max_model_len {
            return Err(SchedulerError::PromptTooLong {
                len: prompt.len(),
                limit: self.config.max_model_len,
            });
        }
        if n == 0 || n > self.config.max_num_seqs {
            return Err(SchedulerError::InvalidUpdate {
                seq,
                reason: format!("n = {n} outside 1..={}", self.config.max_num_seqs),
            });
        }
        let arrival = self.next_arrival;
        self.next_arrival += 1;
        self.seqs.insert(
            seq,
            Sequence {
                id: seq,
                num_prompt_tokens: prompt.len(),
                tokens: prompt,
                num_computed: 0,
                status: SeqStatus::Waiting,
                arrival,
                pending_forks: n - 1,
                num_preemptions: 0,
                scheduled: 0,
                scheduled_draft: 0,
                cache_scope,
                prefill_only: false,
            },
        );
        self.waiting.push_back(seq);
        Ok(())
    }

    /// Removes a sequence in any state, freeing its blocks at once. Returns false when it
    /// was not there.
    pub fn abort(&mut self, seq: SeqId) -> bool {
        let Some(entry) = self.seqs.remove(&seq) else {
            return false;
        };
        match entry.status {
            SeqStatus::Waiting => self.waiting.retain(|&s| s != seq),
            SeqStatus::Running => self.running.retain(|&s| s != seq),
        }
        if self.blocks.contains(seq) {
            // Present by the check above; release cannot fail.
            let _ = self.blocks.release(seq);
        }
        true
    }

    /// Removes a finished sequence (same as [`Scheduler::abort`]).
    pub fn finish(&mut self, seq: SeqId) -> bool {
        self.abort(seq)
    }

    /// One sequence.
    pub fn seq(&self, seq: SeqId) -> Option<&Sequence> {
        self.seqs.get(&seq)
    }

    /// The block table of a running sequence.
    pub fn block_table(&self, seq: SeqId) -> Option<&BlockTable> {
        self.blocks.block_table(seq)
    }

    /// The block table of a running sequence in the windowed layers' own space, where they
    /// have one.
    pub fn window_table(&self, seq: SeqId) -> Option<&BlockTable> {
        self.blocks.window_table(seq)
    }

    /// The block manager (read-only).
    pub fn blocks(&self) -> &BlockManager {
        &self.blocks
    }

    /// Where cached prefixes may end (a model with recurrent layers resumes only where their
    /// state was kept): the block manager's resume points.
    pub fn resume_points(&mut self) -> ResumePoints<'_> {
        ResumePoints(&mut self.blocks)
    }

    /// The sequence first in line for admission.
    pub fn waiting_front(&self) -> Option<SeqId> {
        self.waiting.front().copied()
    }

    /// Whether any sequence is waiting or running.
    pub fn has_work(&self) -> bool {
        !self.seqs.is_empty()
    }

    /// Queue lengths and counters.
    pub fn stats(&self) -> SchedulerStats {
        SchedulerStats {
            running: self.running.len(),
            waiting: self.waiting.len(),
            preemptions: self.preemptions,
            steps: self.steps,
        }
    }

    /// KV block counts.
    pub fn cache_stats(&self) -> CacheStats {
        self.blocks.stats()
    }

    /// Plans the next step; with `drafts`, decoding sequences that made an offer also get
    /// draft budgets (see [`crate::budget`]): [`Scheduler::schedule`], then
    /// [`Scheduler::grant_drafts`].
    pub fn schedule_with(&mut self, drafts: Option<&DraftInputs>) -> StepPlan {
        let mut plan = self.schedule();
        if let Some(drafts) = drafts {
            self.grant_drafts(&mut plan, drafts);
        }
        plan
    }

    /// Rows a step planned as `plan` may still add as draft nodes.
    pub fn draft_room(&self, plan: &StepPlan) -> usize {
        self.config
            .max_num_batched_tokens
            .saturating_sub(plan.num_batched_tokens)
    }

    /// Gives the decoding sequences of `plan` (just planned by [`Scheduler::schedule`]) that
    /// made an offer their draft budgets, within [`Scheduler::draft_room`]. An engine that
    /// asks for offers only once it knows the step's rows calls this after `schedule`;
    /// once per plan.
    pub fn grant_drafts(&mut self, plan: &mut StepPlan, drafts: &DraftInputs) {
        let budget = self.draft_room(plan);
        self.assign_draft_budgets(drafts, budget, plan);
    }

    /// Plans the next step with no speculation (see the module diagram).
    pub fn schedule(&mut self) -> StepPlan {
        self.steps += 1;
        for seq in self.seqs.values_mut() {
            seq.scheduled = 0;
            seq.scheduled_draft = 0;
        }
        let mut plan = StepPlan::default();
        let mut budget = self.config.max_num_batched_tokens;
        let mut prefill_room = self.prefill_only_room();
        let mut i = 0;
        while i < self.running.len() {
            let id = self.running[i];
            let seq = &self.seqs[&id];
            let still_to_serve = self.running.len() - i - 1;
            let want = seq.tokens.len() - seq.num_computed;
            let n = want.min(budget.saturating_sub(still_to_serve)).max(1);
            let prefill_only = seq.prefill_only;
            let n = match prefill_only {
                true => n.min(prefill_room),
                false => n,
            };
            if n == 0 {
                // A prefill-only sequence with no room this step waits for the next.
                i += 1;
                continue;
            }
            let end = seq.num_computed + n;
            match self.blocks.ensure_capacity(id, end) {
                Ok(Some(copies)) => {
                    plan.kv_copies.extend(copies);
                    budget = budget.saturating_sub(n);
                    if prefill_only {
                        prefill_room -= n;
                    }
                    self.mark_scheduled(id, n, false, &mut plan);
                    i += 1;
                }
                Ok(None) | Err(_) => {
                    // Out of blocks: the newest running sequence gives its blocks back.
                    let victim = *self.running.last().expect("invariant: i < len");
                    self.preempt(victim);
                    plan.preempted.push(victim);
                }
            }
        }
        if plan.preempted.is_empty() {
            self.admit_waiting(&mut budget, &mut prefill_room, &mut plan);
        }
        plan
    }

    fn assign_draft_budgets(&mut self, drafts: &DraftInputs, budget: usize, plan: &mut StepPlan) {
        let candidates: Vec<(usize, SeqId, &DraftOffer)> = plan
            .scheduled
            .iter()
            .enumerate()
            .filter(|(_, s)| s.decodes())
            .filter_map(|(i, s)| drafts.offers.get(&s.seq).map(|o| (i, s.seq, o)))
            .collect();
        if candidates.is_empty() {
            return;
        }
        let offers: Vec<(SeqId, &DraftOffer)> =
            candidates.iter().map(|&(_, id, o)| (id, o)).collect();
        // Every row already planned is useful work worth one token (a decode row yields a
        // token, a prompt row is a token that had to be computed anyway).
        let base = plan.num_batched_tokens;
        // A step that gives a prompt its first token is waited on by that request: drafts
        // may lengthen it only a little.
        let first_token = plan.scheduled.iter().any(|s| {
            s.samples
                && self
                    .seqs
                    .get(&s.seq)
                    .is_some_and(|q| q.tokens.len() == q.num_prompt_tokens)
        });
        let budget = if first_token {
            drafts.cost.rows_within(base, FIRST_TOKEN_SHARE, budget)
        } else {
            budget
        };
        let budgets = allocate(&offers, base, base, budget, &drafts.cost);
        let mut granted = Vec::new();
        for (&(index, id, _), &nodes) in candidates.iter().zip(&budgets) {
            // A tree never reaches past the model length (positions beyond it do not exist).
            let computed = plan.scheduled[index].num_computed;
            let room = self.config.max_model_len.saturating_sub(computed + 1);
            let nodes = nodes.min(room);
            if nodes == 0 {
                continue;
            }
            let end = computed + 1 + nodes;
            // Drafts never preempt anyone: without room the sequence decodes plainly.
            if let Ok(Some(copies)) = self.blocks.ensure_capacity(id, end) {
                plan.kv_copies.extend(copies);
                granted.push((index, nodes));
            }
        }
        for (index, nodes) in granted {
            let id = plan.scheduled[index].seq;
            if let Some(seq) = self.seqs.get_mut(&id) {
                seq.scheduled_draft = nodes;
            }
            plan.scheduled[index].draft_budget = nodes;
            plan.num_batched_tokens += nodes;
        }
    }

    fn admit_waiting(&mut self, budget: &mut usize, prefill_room: &mut usize, plan: &mut StepPlan) {
        let mut at = 0;
        while let Some(&id) = self.waiting.get(at) {
            if *budget == 0 {
                break;
            }
            let seq = &self.seqs[&id];
            // A prefill-only sequence with no room this step lets those behind it pass.
            if seq.prefill_only && *prefill_room == 0 {
                at += 1;
                continue;
            }
            let slots: usize = self.running.iter().map(|s| self.seqs[s].slots()).sum();
            if slots + seq.slots() > self.config.max_num_seqs {
                break;
            }
            let hit = self.blocks.cached_prefix_len(&seq.tokens, seq.cache_scope);
            let mut n = (seq.tokens.len() - hit).min(*budget);
            if seq.prefill_only {
                n = n.min(*prefill_room);
                *prefill_room -= n;
            }
            match self.blocks.admit(id, &seq.tokens, hit + n, seq.cache_scope) {
                Ok(Some(cached)) => {
                    debug_assert_eq!(cached, hit, "the cache cannot change in between");
                    self.waiting.remove(at);
                    let seq = self
                        .seqs
                        .get_mut(&id)
                        .expect("invariant: queued seqs exist");
                    seq.num_computed = cached;
                    seq.status = SeqStatus::Running;
                    self.running.push(id);
                    *budget -= n;
                    self.mark_scheduled(id, n, true, plan);
                }
                Ok(None) | Err(_) => break,
            }
        }
    }

    fn mark_scheduled(&mut self, id: SeqId, n: usize, admitted: bool, plan: &mut StepPlan) {
        let seq = self
            .seqs
            .get_mut(&id)
            .expect("invariant: scheduled seqs exist");
        seq.scheduled = n;
        plan.num_batched_tokens += n;
        plan.scheduled.push(ScheduledSeq {
            seq: id,
            num_computed: seq.num_computed,
            num_new_tokens: n,
            samples: seq.num_computed + n == seq.tokens.len(),
            first_since_admission: admitted,
            draft_budget: 0,
        });
    }

    fn preempt(&mut self, id: SeqId) {
        self.running.retain(|&s| s != id);
        let _ = self.blocks.release(id);
        let seq = self
            .seqs
            .get_mut(&id)
            .expect("invariant: running seqs exist");
        seq.status = SeqStatus::Waiting;
        seq.num_computed = 0;
        seq.scheduled = 0;
        seq.num_preemptions += 1;
        self.preemptions += 1;
        // Back into the queue at its arrival place (the queue is sorted by arrival).
        let arrival = seq.arrival;
        let at = self
            .waiting
            .iter()
            .position(|s| self.seqs[s].arrival > arrival)
            .unwrap_or(self.waiting.len());
        self.waiting.insert(at, id);
    }

    /// Reports what became of `seq`'s fed tokens this step and appends `new_tokens` (the
    /// accepted draft tokens and the newly sampled one; nothing for an unfinished prefill
    /// chunk). Returns the KV moves of a tree's accepted path, to run before the next step.
    pub fn commit(
        &mut self,
        id: SeqId,
        progress: Progress<'_>,
        new_tokens: &[u32],
    ) -> Result<Vec<KvMove>, SchedulerError> {
        let seq = self.seqs.get(&id).ok_or(SchedulerError::UnknownSeq(id))?;
        let invalid = |reason: String| SchedulerError::InvalidUpdate { seq: id, reason };
        if seq.scheduled == 0 {
            return Err(invalid(
                "commit of a sequence not scheduled this step".into(),
            ));
        }
        let start = seq.num_computed;
        let accepted_len = match progress {
            Progress::Chain => seq.scheduled,
            Progress::Tree { accepted } => {
                if accepted.first() != Some(&0)
                    || accepted.last().is_some_and(|&n| n > seq.scheduled_draft)
                {
                    return Err(invalid(format!(
                        "accepted path {accepted:?} must start at node 0 and stay within {} drafted nodes",
                        seq.scheduled_draft
                    )));
                }
                accepted.len()
            }
        };
        let computed = start + accepted_len;
        let known = seq.tokens.len() + new_tokens.len();
        let caught_up = start + seq.scheduled >= seq.tokens.len();
        let expected_known = if caught_up {
            computed + 1
        } else {
            seq.tokens.len()
        };
        if known != expected_known || accepted_len == 0 {
            return Err(invalid(format!(
                "{accepted_len} accepted and {} new tokens do not fit {} known, {start} computed, {} fed",
                new_tokens.len(),
                seq.tokens.len(),
                seq.scheduled
            )));
        }
        let moves = match progress {
            Progress::Chain => Vec::new(),
            Progress::Tree { accepted } => {
                let moves = self.blocks.plan_compaction(id, start, accepted)?;
                self.blocks.truncate(id, computed)?;
                moves
            }
        };
        let seq = self.seqs.get_mut(&id).expect("invariant: checked above");
        seq.tokens.extend_from_slice(new_tokens);
        seq.num_computed = computed;
        seq.scheduled = 0;
        seq.scheduled_draft = 0;
        self.blocks.commit(id, &seq.tokens[..computed])?;
        Ok(moves)
    }

    /// Creates `child` from `parent` after the parent's prompt is computed: the child shares
    /// the parent's KV blocks (copy-on-write) and its own first token is `pending`.
    pub fn fork(
        &mut self,
        parent: SeqId,
        child: SeqId,
        pending: u32,
    ) -> Result<(), SchedulerError> {
        if self.seqs.contains_key(&child) {
            return Err(SchedulerError::DuplicateSeq(child));
        }
        let source = self
            .seqs
            .get(&parent)
            .ok_or(SchedulerError::UnknownSeq(parent))?;
        if source.status != SeqStatus::Running
            || source.pending_forks == 0
            || source.num_computed + 1 != source.tokens.len()
        {
            return Err(SchedulerError::InvalidUpdate {
                seq: parent,
                reason: "fork needs a running sequence with forks owed and its prompt computed"
                    .into(),
            });
        }
        let mut tokens = source.tokens[..source.num_computed].to_vec();
        tokens.push(pending);
        let entry = Sequence {
            id: child,
            num_prompt_tokens: source.num_prompt_tokens,
            tokens,
            num_computed: source.num_computed,
            status: SeqStatus::Running,
            arrival: source.arrival,
            pending_forks: 0,
            num_preemptions: 0,
            scheduled: 0,
            scheduled_draft: 0,
            cache_scope: source.cache_scope,
            prefill_only: false,
        };
        self.blocks.fork(parent, child)?;
        if let Some(source) = self.seqs.get_mut(&parent) {
            source.pending_forks -= 1;
        }
        self.seqs.insert(child, entry);
        self.running.push(child);
        Ok(())
    }

    /// Checks the scheduler's and the block manager's invariants; `Err` names the first
    /// violation. For tests.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.blocks.check_invariants()?;
        if self.waiting.len() + self.running.len() != self.seqs.len() {
            return Err("queues and sequences disagree".into());
        }
        for id in &self.running {
            let seq = &self.seqs[id];
            if seq.status != SeqStatus::Running || !self.blocks.contains(*id) {
                return Err(format!("{id:?} running without blocks"));
            }
            if self.blocks.seq_len(*id) != Some(seq.num_computed) {
                return Err(format!("{id:?} computed disagrees with its blocks"));
            }
            if seq.num_computed >= seq.tokens.len() {
                return Err(format!("{id:?} has no pending token"));
            }
        }
        for id in &self.waiting {
            let seq = &self.seqs[id];
            if seq.status != SeqStatus::Waiting || self.blocks.contains(*id) {
                return Err(format!("{id:?} waiting with blocks"));
            }
        }
        let slots: usize = self.running.iter().map(|s| self.seqs[s].slots()).sum();
        if slots > self.config.max_num_seqs {
            return Err(format!("{slots} sequence slots over the cap"));
        }
        Ok(())
    }
}

/// The block boundaries a cached prefix may end at ([`Scheduler::resume_points`]).
pub struct ResumePoints<'a>(&'a mut BlockManager);

impl ResumePoints<'_> {
    /// From now on only at those marked.
    pub fn restrict(&mut self) {
        self.0.restrict_resume_points();
    }

    /// After the block `hash`.
    pub fn add(&mut self, hash: kvcache::BlockHash) {
        self.0.add_resume_point(hash);
    }

    /// No longer after the block `hash`.
    pub fn remove(&mut self, hash: kvcache::BlockHash) {
        self.0.remove_resume_point(hash);
    }
}
