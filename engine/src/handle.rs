//! The engine's front door. [`spawn`] starts the engine thread, which owns the model, the
//! scheduler and the KV store; [`EngineHandle`] (cheap to clone, shared by every caller)
//! validates a request in the caller's thread and queues it on a bounded channel;
//! [`RequestStream`] yields that request's events. Dropping a stream cancels its request:
//! the engine notices at its next step and frees the request's blocks.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use kvcache::WindowConfig;
use scheduler::{Scheduler, SchedulerConfig};

use crate::backend::{self, Backend};
use crate::constraint::Grammars;
use crate::engine_loop::{Command, Engine, EngineParts, Submission};
pub use crate::engine_loop::{EngineStats, StateSnapshotConfig, StateStats};
use crate::model::tokenizer::ModelTokenizer;
use crate::model::Model;
use crate::request::Usage;
use crate::request::{Event, FinishReason, InvalidRequest, Request, RequestLimits, TokenLogprob};
use crate::spec::coordinator::{Speculation, SpeculationConfig};
use crate::validation::invalid;
use crate::{Error, Result};

/// How the engine is set up.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Step limits and the KV pool.
    pub scheduler: SchedulerConfig,
    /// Requests accepted but not finished, beyond which `submit` answers `Overloaded`.
    pub max_pending: usize,
    /// Speculative decoding.
    pub speculation: SpeculationConfig,
    /// Whether the KV pool's memory is written at start ([`Backend::prefault_kv`]), and a
    /// draft model's pool with it, and a hybrid model's recurrent state slots (its running
    /// sequences' and its snapshots' at most), so that no request pays the OS's first touch
    /// of their pages (start-up takes longer, and all of it is resident from the start).
    pub kv_prefault: bool,
    /// Where and how many snapshots of recurrent states are kept for the prefix cache (a
    /// model with recurrent layers: Gated DeltaNet, Mamba-2).
    pub state_snapshots: StateSnapshotConfig,
}

impl EngineConfig {
    /// Blocks of `block_size` positions that fit in `bytes` of KV for `model`.
    pub fn kv_blocks_for(model: &Model, bytes: usize, block_size: usize) -> usize {
        bytes / (model.kv_bytes_per_position() * block_size).max(1)
    }

    /// The KV pools `bytes` buy for `model` on the host: blocks for the full-attention
    /// layers, and for a model with sliding-window layers their own space, sized so that
    /// every running sequence's window and one step's rows fit
    /// ([`WindowConfig::blocks_for`]) but never larger than one shared pool would be; the
    /// full layers get the rest. A model the CUDA backend runs keeps one space.
    pub fn kv_pool_for(
        model: &Model,
        bytes: usize,
        block_size: usize,
        max_num_seqs: usize,
        max_num_batched_tokens: usize,
    ) -> (usize, Option<WindowConfig>) {
        // Recurrent states are fixed bytes per running sequence, taken off the top.
        let bytes = bytes.saturating_sub(model.state_bytes_per_sequence() * max_num_seqs);
        let shared = Self::kv_blocks_for(model, bytes, block_size);
        let Some(window) = model.kv_window() else {
            return (shared, None);
        };
        if crate::backend::keeps_one_kv_space(model) {
            return (shared, None);
        }
        let (full, windowed) = model.kv_bytes_per_position_split();
        let need =
            WindowConfig::blocks_for(window, block_size, max_num_seqs, max_num_batched_tokens);
        let window_blocks = need.min(shared);
        let full_blocks = match full {
            // No full layer: the full space holds no rows, only positions; every sequence
            // can reach the model's length.
            0 => max_num_seqs * (model.config().max_position_embeddings.div_ceil(block_size) + 1),
            _ => bytes.saturating_sub(window_blocks * windowed * block_size) / (full * block_size),
        };
        (
            full_blocks,
            Some(WindowConfig {
                window,
                num_blocks: window_blocks,
            }),
        )
    }
}

/// Why a request was not queued.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    /// A field is invalid (a client error).
    #[error(transparent)]
    Invalid(#[from] InvalidRequest),
    /// Too many requests are pending; retry later.
    #[error("the engine is overloaded: {0} requests pending")]
    Overloaded(usize),
    /// The engine has stopped.
    #[error("the engine has stopped")]
    Stopped,
}

/// Submits requests to the engine thread. Clone freely.
#[derive(Debug, Clone)]
pub struct EngineHandle {
    commands: flume::Sender<Command>,
    pending: Arc<AtomicUsize>,
    next_request: Arc<AtomicU64>,
    max_pending: usize,
    limits: RequestLimits,
    tokenizer: Arc<ModelTokenizer>,
    grammars: Arc<Grammars>,
    /// Whether the backend returns final-normed states (`Backend::returns_states`).
    returns_states: bool,
}

/// Starts the engine thread for `model`. Errors on a configuration that cannot work.
pub fn spawn(
    model: Model,
    tokenizer: Arc<ModelTokenizer>,
    eos_ids: Vec<u32>,
    config: EngineConfig,
) -> Result<(EngineHandle, JoinHandle<()>)> {
    config.state_snapshots.validate()?;
    // The longest sequence this engine serves decides a LongRoPE model's factors.
    let model = model.for_context(config.scheduler.max_model_len)?;
    let kv = config.scheduler.kv;
    let num_slots = kv.num_blocks * kv.block_size;
    let window_slots = kv.window.map(|w| w.num_blocks * kv.block_size);
    let (full, windowed) = model.kv_bytes_per_position_split();
    match kv.window {
        Some(w) => tracing::info!(
            "KV pools: {} blocks of {} positions for the full-attention layers ({} KiB a position), {} for the windowed layers (window {}, {} KiB a position: a sequence holds at most {} KiB there)",
            kv.num_blocks,
            kv.block_size,
            full / 1024,
            w.num_blocks,
            w.window,
            windowed / 1024,
            windowed * kv.block_size * (w.window.div_ceil(kv.block_size) + 1) / 1024
        ),
        None => tracing::info!("KV pool: {} blocks of {} positions", kv.num_blocks, kv.block_size),
    }
    let state = model.state_bytes_per_sequence();
    if state > 0 {
        tracing::info!(
            "recurrent state: {} KiB a running sequence, whatever its length ({} MiB for {} \
             sequences); snapshots at block boundaries for the prefix cache: up to {} MiB",
            state / 1024,
            state * config.scheduler.max_num_seqs / (1 << 20),
            config.scheduler.max_num_seqs,
            config.state_snapshots.max_bytes >> 20
        );
    }
    let backend = backend::for_model_spaces(model, num_slots, window_slots)?;
    tracing::info!("backend: {}", backend.describe());
    spawn_with_backend(backend, tokenizer, eos_ids, config)
}

/// Starts the engine thread over any [`Backend`] (a real model, or a mock in tests).
pub fn spawn_with_backend(
    mut backend: Box<dyn Backend>,
    tokenizer: Arc<ModelTokenizer>,
    eos_ids: Vec<u32>,
    mut config: EngineConfig,
) -> Result<(EngineHandle, JoinHandle<()>)> {
    config.state_snapshots.validate()?;
    let unfolded = crate::model::config::UNFOLDED_POSITIONS - 1;
    if backend.recurrent() && config.speculation.max_draft_tokens > unfolded {
        // An accepted path is folded into the recurrent state from the inputs the store
        // keeps for that many positions.
        tracing::info!(
            "drafts are capped at {unfolded} tokens: a recurrent layer folds an accepted path \
             into its state from the last {} positions' inputs",
            crate::model::config::UNFOLDED_POSITIONS
        );
        config.speculation.max_draft_tokens = unfolded;
    }
    if let Some(draft) = &config.speculation.draft_model {
        if draft.model.is_recurrent() {
            return Err(Error::Metadata(
                "the draft model has recurrent layers (Gated DeltaNet), which a draft model \
                 cannot have yet: use a draft model whose layers all attend or convolve"
                    .into(),
            ));
        }
    }
    let scheduler = Scheduler::new(config.scheduler).map_err(|e| Error::Config(e.to_string()))?;
    let vocab_size = backend.vocab_size();
    let returns_states = backend.returns_states();
    if let Some(draft) = &config.speculation.draft_model {
        if draft.model.config().vocab_size != vocab_size {
            return Err(Error::Metadata(format!(
                "the draft model's vocabulary ({}) differs from the target's ({vocab_size}): they must share a tokenizer",
                draft.model.config().vocab_size,
            )));
        }
    }
    // Outputs under a format may end with any end token: the model's own turn end
    // (`<|im_end|>`) is often not the first of them.
    let grammar_ends: Vec<u32> = if eos_ids.is_empty() {
        tokenizer.eos_ids().to_vec()
    } else {
        eos_ids.clone()
    };
    let (commands, inbox) = flume::bounded(config.max_pending.max(1));
    let pending = Arc::new(AtomicUsize::new(0));
    let mut spec = Speculation::new(config.speculation.clone(), vocab_size)?;
    let limits = RequestLimits {
        vocab_size,
        max_model_len: config.scheduler.max_model_len,
        max_n: config.scheduler.max_num_seqs,
        methods: spec.methods(),
    };
    if config.kv_prefault {
        backend.prefault_kv();
        if backend.recurrent() {
            // Every running sequence's state, and every snapshot the prefix cache may keep.
            let snapshots = match config.scheduler.kv.prefix_caching {
                true => config
                    .state_snapshots
                    .capacity(backend.state_bytes_per_sequence()),
                false => 0,
            };
            backend.prefault_states(config.scheduler.max_num_seqs + snapshots);
        }
        spec.prefault_kv();
    }
    let engine = Engine::new(EngineParts {
        backend,
        tokenizer: Arc::clone(&tokenizer),
        eos_ids,
        scheduler,
        spec,
        inbox,
        pending: Arc::clone(&pending),
        state_snapshots: config.state_snapshots,
    });
    let thread = std::thread::Builder::new()
        .name("thicket-engine".into())
        .spawn(move || engine.run())
        .map_err(|e| Error::io("starting the engine thread", e))?;
    crate::metrics::describe();
    let handle = EngineHandle {
        commands,
        pending,
        next_request: Arc::new(AtomicU64::new(0)),
        max_pending: config.max_pending,
        limits,
        grammars: Arc::new(Grammars::new(
            Arc::clone(&tokenizer),
            vocab_size,
            grammar_ends,
        )),
        tokenizer,
        returns_states,
    };
    Ok((handle, thread))
}

impl EngineHandle {
    /// Validates `request` and queues it. The returned stream yields its events.
    pub fn submit(&self, request: Request) -> std::result::Result<RequestStream, SubmitError> {
        let (submission, stream) = self.prepare(request)?;
        self.send(Command::Submit(Box::new(submission)), 1)?;
        Ok(stream)
    }

    /// Validates every request and queues them as one: the engine takes them all in before
    /// its next step, so they are scheduled together (a batch job's requests, or a test that
    /// needs them to share a pool). All or none: one invalid request fails the call.
    pub fn submit_all(
        &self,
        requests: Vec<Request>,
    ) -> std::result::Result<Vec<RequestStream>, SubmitError> {
        let (submissions, streams): (Vec<_>, Vec<_>) = requests
            .into_iter()
            .map(|r| self.prepare(r))
            .collect::<std::result::Result<Vec<_>, _>>()?
            .into_iter()
            .unzip();
        let count = submissions.len();
        if count > 0 {
            self.send(Command::SubmitAll(submissions), count)?;
        }
        Ok(streams)
    }

    /// Validates `request` and compiles its constraint, in the caller's thread: a bad format
    /// is the caller's error.
    fn prepare(
        &self,
        mut request: Request,
    ) -> std::result::Result<(Submission, RequestStream), SubmitError> {
        request.validate(&self.limits)?;
        let mut constraint = match &request.constraint {
            Some(spec) => Some(
                self.grammars
                    .compile(spec)
                    .map_err(|e| invalid("response_format", e.to_string()))?,
            ),
            None => None,
        };
        if let Some(thinking) = &request.thinking {
            constraint = Some(
                self.grammars
                    .thinking(thinking, constraint)
                    .map_err(|e| invalid("thinking", e.to_string()))?,
            );
        }
        if request.sampling.seed.is_none() {
            request.sampling.seed = Some(rand::random());
        }
        let (events, stream) = flume::unbounded();
        let submission = Submission {
            id: self.next_request.fetch_add(1, Ordering::Relaxed),
            request,
            constraint,
            events,
            submitted: Instant::now(),
        };
        Ok((submission, RequestStream { events: stream }))
    }

    /// Queues `command`, which carries `count` requests, unless that many more would pass
    /// `max_pending`.
    fn send(&self, command: Command, count: usize) -> std::result::Result<(), SubmitError> {
        let before = self.pending.fetch_add(count, Ordering::SeqCst);
        if before + count > self.max_pending {
            self.pending.fetch_sub(count, Ordering::SeqCst);
            return Err(SubmitError::Overloaded(before));
        }
        self.commands.try_send(command).map_err(|e| {
            self.pending.fetch_sub(count, Ordering::SeqCst);
            match e {
                flume::TrySendError::Full(_) => SubmitError::Overloaded(before),
                flume::TrySendError::Disconnected(_) => SubmitError::Stopped,
            }
        })
    }

    /// Whether pooling requests may ask for final-normed states (`Pooling::State`): the
    /// backend returns them (not the CUDA one, which returns logits only).
    pub fn returns_states(&self) -> bool {
        self.returns_states
    }

    /// Asks the engine to stop: pending requests get an error event.
    pub fn shutdown(&self) {
        let _ = self.commands.send(Command::Shutdown);
    }

    /// A snapshot of the engine's queues and KV use (waits for the current step), or
    /// `None` when the engine has stopped.
    pub fn stats(&self) -> Option<EngineStats> {
        let (reply, answer) = flume::bounded(1);
        self.commands.send(Command::Stats(reply)).ok()?;
        answer.recv().ok()
    }

    /// Whether the engine thread is still taking commands (false once it stopped, or
    /// died from a panic).
    pub fn is_running(&self) -> bool {
        !self.commands.is_disconnected()
    }

    /// Requests accepted and not yet finished.
    pub fn pending(&self) -> usize {
        self.pending.load(Ordering::SeqCst)
    }

    /// The limits requests are validated against.
    pub fn limits(&self) -> &RequestLimits {
        &self.limits
    }

    /// The model's tokenizer.
    pub fn tokenizer(&self) -> &Arc<ModelTokenizer> {
        &self.tokenizer
    }
}

/// One request's events; dropping it cancels the request.
#[derive(Debug)]
pub struct RequestStream {
    events: flume::Receiver<Event>,
}

/// One sample's complete output, gathered by [`RequestStream::wait`].
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SampleOutput {
    /// Generated token ids.
    pub token_ids: Vec<u32>,
    /// Generated text (stop strings excluded).
    pub text: String,
    /// Log-probabilities, when asked for.
    pub logprobs: Vec<TokenLogprob>,
    /// Why it ended.
    pub finish: Option<FinishReason>,
    /// Token counts.
    pub usage: Usage,
    /// A pooling request's answer (`Event::Pooled`).
    pub pooled: Option<Vec<f32>>,
}

impl RequestStream {
    /// The next event, or `None` when the request is over.
    pub fn recv(&self) -> Option<Event> {
        self.events.recv().ok()
    }

    /// The next event, awaiting it.
    pub async fn recv_async(&self) -> Option<Event> {
        self.events.recv_async().await.ok()
    }

    /// Blocks until the request ends and returns every sample's output, or the error the
    /// request failed with.
    pub fn wait(self) -> std::result::Result<Vec<SampleOutput>, String> {
        let mut samples: Vec<SampleOutput> = Vec::new();
        let slot = |samples: &mut Vec<SampleOutput>, index: usize| {
            if samples.len() <= index {
                samples.resize(index + 1, SampleOutput::default());
            }
        };
        while let Some(event) = self.recv() {
            match event {
                Event::Output {
                    index,
                    token_ids,
                    text,
                    logprobs,
                } => {
                    slot(&mut samples, index);
                    let s = &mut samples[index];
                    s.token_ids.extend(token_ids);
                    s.text.push_str(&text);
                    s.logprobs.extend(logprobs);
                }
                Event::Finished {
                    index,
                    reason,
                    usage,
                } => {
                    slot(&mut samples, index);
                    samples[index].finish = Some(reason);
                    samples[index].usage = usage;
                }
                Event::Pooled { values, usage } => {
                    return Ok(vec![SampleOutput {
                        pooled: Some(values),
                        usage,
                        ..SampleOutput::default()
                    }]);
                }
                Event::Error(failure) => return Err(failure.message),
            }
        }
        if samples.is_empty() || samples.iter().any(|s| s.finish.is_none()) {
            return Err("the engine stopped before the request finished".into());
        }
        Ok(samples)
    }
}
