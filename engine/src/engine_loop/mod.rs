//! `Engine`: the one thread that owns the backend (model and KV rows), the scheduler (and
//! through it the KV blocks), the shared speculation state, every request's state and one
//! record per live sequence (`record::SeqRecord`, holding its drafter). Each step:
//!
//! ```text
//!  intake     queued submissions -> scheduler; dropped streams -> abort (blocks freed)
//!  schedule   StepPlan: which sequences, how many tokens, KV copies, preemptions; then
//!             the decoding sequences whose best case could pay at the plan's size
//!             prepare their drafters and offer, and each offer may get a draft budget
//!             (drafting.rs)
//!  batch      speculation drafts every granted sequence's tree (each method's speculator
//!             runs its batched work first; drafting.rs); constrained sequences' trees
//!             become their format's forced tokens or keep only what it allows
//!             (constrain.rs); ONE TreeBatch for every scheduled sequence: prefill
//!             chunks, plain decodes and draft trees mixed (batch.rs)
//!  forward    the backend runs it while another thread computes the token masks of the
//!             constrained rows; every speculator sees every computed row (forward.rs)
//!  decide     logits -> StepOutput: per sequence the sampled tokens (and forks' tokens)
//!             or the accepted path of its tree; no state changes (step_output.rs)
//!  update     scheduler commits, KV compaction, forks for n > 1, drafters observe
//!             (step_output.rs)
//!  emit       stop conditions, detokenize, events out; finished sequences leave (emit.rs)
//!  metrics    step time, batch tokens, queue lengths, preemptions, KV use, latencies
//! ```
//! `Engine::step` schedules and records the metrics; between them `Engine::run_plan` calls
//! each stage from batch to emit once, in that order.
//! The crate's folders by stage: `schedule` is the `scheduler` crate with `spec/`'s offers
//! (`spec::coordinator`); `batch` is `spec/` (the methods in `spec/methods/`), `constraint/`
//! and `tree_batch`; `forward` is `backend/` (`backend::cpu` runs `model/` on the kernels of
//! `cpu/`); `decide` is `sampler` and `spec::verify`; `emit` is `request` and
//! `model::detokenizer`; `metrics` is `metrics`. The channels in and out are `handle`.
//!
//! No lock guards any of this: callers talk to the thread only through channels.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use kvcache::SeqId;
use scheduler::{ScheduledSeq, Scheduler};

mod batch;
mod constrain;
mod drafting;
mod emit;
mod forward;
mod record;
mod states;
mod step_output;

use record::SeqRecord;
use states::StateSlots;
pub use states::{StateSnapshotConfig, StateStats};

use crate::backend::Backend;
use crate::constraint::{Constraint, TokenMask};
use crate::metrics as names;
use crate::model::tokenizer::ModelTokenizer;
use crate::request::{Event, Failure, Pooling, Request};
use crate::sampler::{sample, SampleContext, Sampled};
use crate::spec::coordinator::Speculation;
use crate::tree::TokenTree;
use crate::Result;

/// Messages from handles to the engine thread.
pub(crate) enum Command {
    /// A validated request and where its events go.
    Submit(Box<Submission>),
    /// Validated requests to take in together, before the next step.
    SubmitAll(Vec<Submission>),
    /// Reply with a snapshot of the engine's counters.
    Stats(flume::Sender<EngineStats>),
    /// Fail everything pending and stop.
    Shutdown,
}

/// A snapshot of the engine's queues and KV use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineStats {
    /// Queue lengths, preemptions, steps.
    pub scheduler: scheduler::SchedulerStats,
    /// KV block counts and prefix-cache counters.
    pub cache: kvcache::CacheStats,
    /// Requests in the engine (not yet finished).
    pub requests: usize,
    /// Token positions per KV block.
    pub block_size: usize,
    /// Recurrent-state slots and their snapshots (`None`: the model has no recurrent
    /// layers).
    pub states: Option<StateStats>,
}

/// A validated request and where its events go.
pub(crate) struct Submission {
    pub(crate) id: u64,
    pub(crate) request: Request,
    /// The compiled `request.constraint`.
    pub(crate) constraint: Option<Box<dyn Constraint>>,
    pub(crate) events: flume::Sender<Event>,
    pub(crate) submitted: Instant,
}

/// A request with at least one unfinished sample.
struct ActiveRequest {
    request: Request,
    seed: u64,
    events: flume::Sender<Event>,
    submitted: Instant,
    first_token_at: Option<Instant>,
    /// Its sequences (the first, then forks).
    seqs: Vec<SeqId>,
    unfinished: usize,
    cached_tokens: usize,
}

/// The engine thread's state.
pub(crate) struct Engine {
    backend: Box<dyn Backend>,
    tokenizer: Arc<ModelTokenizer>,
    eos_ids: Vec<u32>,
    scheduler: Scheduler,
    inbox: flume::Receiver<Command>,
    pending: Arc<AtomicUsize>,
    requests: HashMap<u64, ActiveRequest>,
    /// One record per live sequence: everything the engine keeps about it.
    records: HashMap<SeqId, SeqRecord>,
    /// The running sequences' recurrent state slots (a model with recurrent layers).
    states: StateSlots,
    spec: Speculation,
    next_seq: u64,
}

/// What the engine thread is built from.
pub(crate) struct EngineParts {
    /// The model and its KV rows.
    pub(crate) backend: Box<dyn Backend>,
    /// Detokenizes the output.
    pub(crate) tokenizer: Arc<ModelTokenizer>,
    /// Tokens that end a sample.
    pub(crate) eos_ids: Vec<u32>,
    /// Queues and KV blocks.
    pub(crate) scheduler: Scheduler,
    /// Drafters, acceptance statistics and the cost curve.
    pub(crate) spec: Speculation,
    /// Commands from handles.
    pub(crate) inbox: flume::Receiver<Command>,
    /// Requests submitted and not yet finished (shared with the handles).
    pub(crate) pending: Arc<AtomicUsize>,
    /// How snapshots of recurrent states are kept.
    pub(crate) state_snapshots: StateSnapshotConfig,
}

impl Engine {
    pub(crate) fn new(parts: EngineParts) -> Self {
        let EngineParts {
            backend,
            tokenizer,
            eos_ids,
            mut scheduler,
            spec,
            inbox,
            pending,
            state_snapshots,
        } = parts;
        if backend.recurrent() {
            // A cached prefix resumes only where a snapshot of the recurrent state was kept.
            scheduler.resume_points().restrict();
        }
        Self {
            states: StateSlots::new(
                backend.recurrent(),
                scheduler.blocks().block_size(),
                backend.state_bytes_per_sequence(),
                state_snapshots,
            )
            // Without a prefix cache nothing resumes from a snapshot: none is taken.
            .with_snapshots(scheduler.blocks().prefix_caching()),
            backend,
            tokenizer,
            eos_ids,
            scheduler,
            inbox,
            pending,
            requests: HashMap::new(),
            records: HashMap::new(),
            spec,
            next_seq: 0,
        }
    }

    /// Runs until shut down or until every handle is gone and the work is done.
    pub(crate) fn run(mut self) {
        loop {
            if !self.scheduler.has_work() {
                match self.inbox.recv() {
                    Ok(Command::Shutdown) | Err(_) => return self.shutdown(),
                    Ok(command) => self.intake(command),
                }
            }
            // Only what is queued now: a steady stream of commands must not stall the step.
            for _ in 0..self.inbox.len() {
                let Ok(command) = self.inbox.try_recv() else {
                    break;
                };
                if matches!(command, Command::Shutdown) {
                    return self.shutdown();
                }
                self.intake(command);
            }
            self.drop_cancelled();
            if self.scheduler.has_work() {
                self.step();
            }
        }
    }

    fn shutdown(&mut self) {
        let ids: Vec<u64> = self.requests.keys().copied().collect();
        for id in ids {
            self.fail_request(id, "the engine is shutting down");
        }
        self.spec.save();
    }

    fn intake(&mut self, command: Command) {
        let submission = match command {
            Command::Submit(submission) => *submission,
            Command::SubmitAll(submissions) => {
                for submission in submissions {
                    self.admit(submission);
                }
                return;
            }
            Command::Stats(reply) => {
                let _ = reply.send(EngineStats {
                    scheduler: self.scheduler.stats(),
                    cache: self.scheduler.cache_stats(),
                    requests: self.requests.len(),
                    block_size: self.scheduler.blocks().block_size(),
                    states: self.state_stats(),
                });
                return;
            }
            Command::Shutdown => return,
        };
        self.admit(submission);
    }

    fn admit(&mut self, submission: Submission) {
        let Submission {
            id,
            request,
            constraint,
            events,
            submitted,
        } = submission;
        if request.pooling == Some(Pooling::State) && !self.backend.returns_states() {
            let message = "this backend returns logits only: it cannot embed";
            let _ = events.send(Event::Error(Failure::engine(message)));
            self.pending.fetch_sub(1, Ordering::SeqCst);
            return;
        }
        let seq = SeqId(self.next_seq);
        self.next_seq += 1;
        let scope = request.cache_scope();
        if let Err(e) = self
            .scheduler
            .add(seq, request.prompt.clone(), request.n, scope)
        {
            let _ = events.send(Event::Error(Failure::from_error(&e.into())));
            self.pending.fetch_sub(1, Ordering::SeqCst);
            return;
        }
        if request.pooling.is_some() {
            // It ends with its prompt, and yields to generation (`set_prefill_only`).
            if let Err(e) = self.scheduler.set_prefill_only(seq) {
                let _ = events.send(Event::Error(Failure::from_error(&e.into())));
                self.pending.fetch_sub(1, Ordering::SeqCst);
                return;
            }
        }
        metrics::counter!(names::PROMPT_TOKENS).increment(request.prompt.len() as u64);
        self.spec.admitted(&request.prompt, scope);
        // A pooling request reads its prompt only: nothing to draft.
        let drafter = request
            .pooling
            .is_none()
            .then(|| {
                self.spec.drafter_for(
                    request.speculation,
                    &request.prompt,
                    request.prompt.len(),
                    request.prediction.as_ref(),
                    scope,
                )
            })
            .flatten();
        let record = SeqRecord::new(id, 0, &request, drafter, constraint, &self.eos_ids);
        self.records.insert(seq, record);
        self.requests.insert(
            id,
            ActiveRequest {
                seed: request.sampling.seed.unwrap_or(0),
                unfinished: request.n,
                request,
                events,
                submitted,
                first_token_at: None,
                seqs: vec![seq],
                cached_tokens: 0,
            },
        );
    }

    /// Aborts requests whose stream was dropped.
    fn drop_cancelled(&mut self) {
        let gone: Vec<u64> = self
            .requests
            .iter()
            .filter(|(_, r)| r.events.is_disconnected())
            .map(|(&id, _)| id)
            .collect();
        if gone.is_empty() {
            return;
        }
        for id in gone {
            self.remove_request(id);
        }
        // With nothing left to run no step follows: publish the freed blocks now.
        names::publish_kv(&self.scheduler.cache_stats());
        if let Some(stats) = self.state_stats() {
            names::publish_states(&stats);
        }
    }

    /// What the recurrent-state slots hold (`None`: the model has no recurrent layers).
    fn state_stats(&self) -> Option<StateStats> {
        self.states.stats(self.scheduler.config().max_num_seqs)
    }

    fn remove_request(&mut self, id: u64) {
        if let Some(request) = self.requests.remove(&id) {
            for seq in request.seqs {
                self.remove_seq(seq);
            }
            self.pending.fetch_sub(1, Ordering::SeqCst);
            metrics::histogram!(names::E2E_LATENCY)
                .record(request.submitted.elapsed().as_secs_f64());
        }
    }

    /// The one way a sequence leaves the engine (finished, aborted or failed): its record,
    /// its place in the scheduler with its KV blocks, and what speculation holds for it.
    fn remove_seq(&mut self, seq: SeqId) -> Option<SeqRecord> {
        if let Some(s) = self.scheduler.seq(seq) {
            self.spec
                .finished(s.tokens(), s.num_prompt_tokens(), s.cache_scope());
        }
        self.scheduler.abort(seq);
        self.states.release(seq);
        let record = self.records.remove(&seq)?;
        if let Some(drafter) = &record.drafter {
            self.spec.release(seq, drafter);
        }
        Some(record)
    }

    fn fail_request(&mut self, id: u64, message: &str) {
        self.fail_request_with(id, Failure::engine(message));
    }

    fn fail_request_with(&mut self, id: u64, failure: Failure) {
        if let Some(request) = self.requests.get(&id) {
            let _ = request.events.send(Event::Error(failure));
        }
        self.remove_request(id);
    }

    fn step(&mut self) {
        let started = Instant::now();
        let mut plan = self.scheduler.schedule();
        if let Some(drafts) = self.draft_offers(&plan) {
            self.scheduler.grant_drafts(&mut plan, &drafts);
            if tracing::enabled!(tracing::Level::DEBUG) {
                let budgets: Vec<(u64, usize)> = plan
                    .scheduled
                    .iter()
                    .filter(|s| s.samples)
                    .map(|s| (s.seq.0, s.draft_budget))
                    .collect();
                tracing::debug!(
                    rows = plan.num_batched_tokens,
                    ?budgets,
                    "draft budgets (sequence, nodes)"
                );
            }
        }
        metrics::counter!(names::PREEMPTIONS).increment(plan.preempted.len() as u64);
        for &seq in &plan.preempted {
            self.states.release(seq);
        }
        if plan.is_empty() {
            self.fail_unschedulable();
            return;
        }
        let ran = self.run_plan(&plan.scheduled, &plan.kv_copies);
        // A failed step's times are dropped, not carried into the next step's.
        self.spec
            .observe_step(ran.is_ok().then(|| started.elapsed().as_secs_f64()));
        if let Err(e) = ran {
            // The forward failed: the requests in it fail, everyone else goes on.
            tracing::warn!("a step failed, failing its requests: {e}");
            let failed: Vec<u64> = plan
                .scheduled
                .iter()
                .filter_map(|s| self.records.get(&s.seq).map(|r| r.request))
                .collect();
            for id in failed {
                self.fail_request(id, &format!("internal error: {e}"));
            }
        }
        tracing::trace!(
            rows = plan.num_batched_tokens,
            sequences = plan.scheduled.len(),
            seconds = started.elapsed().as_secs_f64(),
            "step"
        );
        let stats = self.scheduler.stats();
        metrics::counter!(names::STEPS).increment(1);
        metrics::histogram!(names::STEP_DURATION).record(started.elapsed().as_secs_f64());
        metrics::histogram!(names::BATCH_TOKENS).record(plan.num_batched_tokens as f64);
        metrics::gauge!(names::SEQS_RUNNING).set(stats.running as f64);
        metrics::gauge!(names::SEQS_WAITING).set(stats.waiting as f64);
        names::publish_kv(&self.scheduler.cache_stats());
        if let Some(stats) = self.state_stats() {
            names::publish_states(&stats);
        }
    }

    /// Nothing could be scheduled although work is queued: with nothing running, the head
    /// of the queue can never fit, so it fails instead of waiting forever.
    fn fail_unschedulable(&mut self) {
        if self.scheduler.stats().running > 0 {
            return;
        }
        if let Some(seq) = self.scheduler.waiting_front() {
            if let Some(id) = self.records.get(&seq).map(|r| r.request) {
                self.fail_request(id, "the request does not fit in the KV cache");
            }
        }
    }

    /// Runs one planned step past the schedule: drafts and constraints, the batch, the
    /// forward (the speculators seeing its rows), the decision and its update, and the
    /// emission of every new token.
    fn run_plan(&mut self, scheduled: &[ScheduledSeq], copies: &[kvcache::KvMove]) -> Result<()> {
        self.backend.move_kv(copies)?;
        let mut trees = self.draft_trees(scheduled)?;
        let (mut masks, deferred) = self.constrain(scheduled, &mut trees);
        // A sequence whose constraint failed has left: the step goes on without it.
        let (scheduled, trees): (Vec<ScheduledSeq>, Vec<Option<TokenTree>>) = scheduled
            .iter()
            .cloned()
            .zip(trees)
            .filter(|(s, _)| self.records.contains_key(&s.seq))
            .unzip();
        let scheduled = scheduled.as_slice();
        let plans = self.plan_states(scheduled, &trees)?;
        let batch = self.assemble_batch(scheduled, &trees, &plans)?;
        let forward = self.forward_beside_masks(&batch, deferred, &mut masks);
        self.record_states(scheduled, plans, forward.is_ok());
        let (logits, forward_seconds) = forward?;
        self.observe_rows(&batch, &logits, forward_seconds);
        let decided = Instant::now();
        let output = self.decide(scheduled, trees, logits, &masks)?;
        let sampling = decided.elapsed().as_secs_f64();
        let emissions = self.update(scheduled, output)?;
        let tokens = emissions.iter().map(|(_, t)| t.len()).sum();
        self.spec.observe_sampling(tokens, sampling);
        self.emit_all(emissions)
    }

    /// The model's choice from `row` for `seq_id` after `output` (its output so far).
    fn choose(
        &self,
        seq_id: SeqId,
        index_offset: usize,
        row: &[f32],
        output: &[u32],
        mask: Option<&TokenMask>,
    ) -> Option<Sampled> {
        let state = self.records.get(&seq_id)?;
        let request = self.requests.get(&state.request)?;
        let seq = self.scheduler.seq(seq_id)?;
        let stop = &request.request.stop;
        let mut suppress = Vec::new();
        if output.len() < stop.min_tokens {
            if !stop.ignore_eos {
                suppress.extend_from_slice(&self.eos_ids);
            }
            suppress.extend_from_slice(&stop.stop_token_ids);
        }
        let mut masked = None;
        if let Some(mask) = mask {
            // A stop token ends the output like an end token: only where the format may end.
            if !self.eos_ids.iter().any(|&e| mask.allows(e)) {
                suppress.extend_from_slice(&stop.stop_token_ids);
            }
            // A format that can only end (or only go on with suppressed tokens) wins over
            // `min_tokens`: nothing else could be chosen.
            suppress.sort_unstable();
            suppress.dedup();
            if suppress.iter().filter(|&&t| mask.allows(t)).count() >= mask.count() {
                suppress.clear();
            }
            let mut row = row.to_vec();
            mask.apply(&mut row);
            masked = Some(row);
        }
        let ctx = SampleContext {
            prompt: &seq.tokens()[..seq.num_prompt_tokens()],
            output,
            suppress: &suppress,
            seed: request.seed,
            index: state.index + index_offset,
        };
        let row = masked.as_deref().unwrap_or(row);
        Some(sample(row, &request.request.sampling, &ctx))
    }

    fn seq(&self, seq: SeqId) -> Result<&scheduler::Sequence> {
        self.scheduler.seq(seq).ok_or_else(|| missing(seq))
    }

    /// What `seq`'s request pools (`None`: it generates, or it has gone).
    fn pooling_of(&self, seq: SeqId) -> Option<&Pooling> {
        self.request_of(seq)?.request.pooling.as_ref()
    }

    fn request_of(&self, seq: SeqId) -> Option<&ActiveRequest> {
        self.requests.get(&self.records.get(&seq)?.request)
    }

    fn request_of_mut(&mut self, seq: SeqId) -> Option<&mut ActiveRequest> {
        let id = self.records.get(&seq)?.request;
        self.requests.get_mut(&id)
    }
}

fn missing(seq: SeqId) -> crate::Error {
    crate::Error::InvalidBatch(format!("engine state lost sequence {seq:?}"))
}
