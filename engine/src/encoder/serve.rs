//! The encoder's own thread and its front door. [`spawn_encoder`] moves the model onto one
//! thread that owns it; [`EncoderHandle`] (cheap to clone) tokenizes in the caller's thread
//! and queues jobs on a bounded channel. Each step the thread takes the queued inputs in
//! arrival order, as many as `max_batch_tokens` allows (at least one), runs one packed forward
//! for all of them (prefill-only work: no KV kept), pools each, and answers every job whose
//! last input was in the step. A job whose caller went away is dropped before its next step.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use super::bert::{spans, EncoderInput};
use super::config::EncoderTask;
use super::decoder::EnginePooling;
use super::model::{Encoder, EncoderTokenizer};
use super::pooling::pool;
use crate::{Error, Result};

/// How the encoder thread batches.
#[derive(Debug, Clone, Copy)]
pub struct EncoderServeConfig {
    /// Tokens one forward takes at most (an input longer than this runs alone).
    pub max_batch_tokens: usize,
    /// Jobs accepted but not answered, beyond which new ones are refused.
    pub max_pending: usize,
    /// The cores are shared with a generating engine: the forward's loops run on rayon's
    /// pool without recruiting the pool's workers as a team, so the engine's team keeps them
    /// (generation slows less under an embedding load; the encoder alone runs slower).
    pub sharing_cores: bool,
}

impl Default for EncoderServeConfig {
    fn default() -> Self {
        Self {
            max_batch_tokens: 8192,
            max_pending: 1024,
            sharing_cores: false,
        }
    }
}

/// Why a job was not answered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// An input is invalid (a client error).
    #[error("{0}")]
    Invalid(String),
    /// Too many jobs are pending.
    #[error("the encoder is overloaded: {0} jobs pending")]
    Overloaded(usize),
    /// The encoder thread has stopped or failed.
    #[error("the encoder has stopped: {0}")]
    Stopped(String),
}

struct Job {
    inputs: Vec<EncoderInput>,
    reply: flume::Sender<std::result::Result<Vec<Vec<f32>>, String>>,
}

enum Command {
    Job(Job),
    Shutdown,
}

/// Submits encoding jobs to the encoder thread. Clone freely.
#[derive(Debug, Clone)]
pub struct EncoderHandle {
    route: Route,
    tokenizer: Arc<EncoderTokenizer>,
    task: EncoderTask,
    hidden_size: usize,
    matryoshka: Option<Vec<usize>>,
    pending: Arc<AtomicUsize>,
    running: Arc<AtomicBool>,
    max_pending: usize,
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Job(job) => write!(f, "Job({} inputs)", job.inputs.len()),
            Self::Shutdown => write!(f, "Shutdown"),
        }
    }
}

/// Where a handle's jobs run.
#[derive(Debug, Clone)]
enum Route {
    /// The encoder's own thread.
    Thread(flume::Sender<Command>),
    /// The generating engine, as prefill-only requests (a decoder served for pooling).
    Engine(EnginePooling),
}

/// Starts the encoder thread.
pub fn spawn_encoder(
    encoder: Encoder,
    config: EncoderServeConfig,
) -> Result<(EncoderHandle, JoinHandle<()>)> {
    if config.max_batch_tokens == 0 || config.max_pending == 0 {
        return Err(Error::Config(
            "the encoder needs max_batch_tokens and max_pending of at least 1".into(),
        ));
    }
    let (commands, receiver) = flume::bounded(config.max_pending);
    let handle = EncoderHandle {
        route: Route::Thread(commands),
        tokenizer: Arc::clone(&encoder.tokenizer),
        task: encoder.task,
        hidden_size: encoder.model.config().hidden_size,
        matryoshka: encoder.model.config().matryoshka.clone(),
        pending: Arc::new(AtomicUsize::new(0)),
        running: Arc::new(AtomicBool::new(true)),
        max_pending: config.max_pending,
    };
    let running = Arc::clone(&handle.running);
    let thread = std::thread::Builder::new()
        .name("thicket-encoder".into())
        .spawn(move || {
            let outcome = run(&encoder, &config, &receiver);
            running.store(false, Ordering::SeqCst);
            if let Err(e) = outcome {
                tracing::error!("the encoder stopped: {e}");
            }
        })
        .map_err(|e| Error::io("spawn the encoder thread", e))?;
    Ok((handle, thread))
}

impl EncoderHandle {
    /// A handle whose jobs run on a generating engine (`decoder::decoder_pooler`).
    pub(super) fn on_engine(
        pooling: EnginePooling,
        tokenizer: Arc<EncoderTokenizer>,
        task: EncoderTask,
        hidden_size: usize,
    ) -> Self {
        Self {
            route: Route::Engine(pooling),
            tokenizer,
            task,
            hidden_size,
            matryoshka: None,
            pending: Arc::new(AtomicUsize::new(0)),
            running: Arc::new(AtomicBool::new(true)),
            max_pending: usize::MAX,
        }
    }

    /// Whether its jobs run on the generating engine (a decoder served for pooling) rather
    /// than on an encoder thread of their own.
    pub fn on_the_engine(&self) -> bool {
        matches!(self.route, Route::Engine(_))
    }

    /// The tokenizer inputs are prepared with.
    pub fn tokenizer(&self) -> &Arc<EncoderTokenizer> {
        &self.tokenizer
    }

    /// What the model computes.
    pub fn task(&self) -> EncoderTask {
        self.task
    }

    /// Width of the model's token states (an embedding's width).
    pub fn hidden_size(&self) -> usize {
        self.hidden_size
    }

    /// Whether embeddings may be cut to `dimensions` components: only for a model trained
    /// for it (Matryoshka), at a width it lists where it lists them.
    pub fn matryoshka(&self, dimensions: usize) -> std::result::Result<(), String> {
        match &self.matryoshka {
            None => Err(format!(
                "the model was not trained to be cut (Matryoshka); it gives {} dimensions",
                self.hidden_size
            )),
            Some(list) if !list.is_empty() && !list.contains(&dimensions) => Err(format!(
                "the model can be cut to {list:?} dimensions, not {dimensions}"
            )),
            Some(_) => Ok(()),
        }
    }

    /// Jobs queued or running.
    pub fn pending(&self) -> usize {
        match &self.route {
            Route::Thread(_) => self.pending.load(Ordering::SeqCst),
            // The engine's count is the server's already.
            Route::Engine(_) => 0,
        }
    }

    /// Whether the thread still runs.
    pub fn is_running(&self) -> bool {
        match &self.route {
            Route::Thread(_) => self.running.load(Ordering::SeqCst),
            Route::Engine(engine) => engine.is_running(),
        }
    }

    /// Asks the thread to stop once the jobs already queued are answered.
    pub fn shutdown(&self) {
        if let Route::Thread(commands) = &self.route {
            let _ = commands.try_send(Command::Shutdown);
        }
    }

    /// Encodes `inputs` (one vector each: a pooled embedding, or a classifier's logits).
    pub async fn encode(
        &self,
        inputs: Vec<EncoderInput>,
    ) -> std::result::Result<Vec<Vec<f32>>, EncodeError> {
        if inputs.is_empty() {
            return Ok(Vec::new());
        }
        let commands = match &self.route {
            Route::Thread(commands) => commands,
            Route::Engine(engine) => return engine.pool(inputs).await,
        };
        let pending = self.pending.fetch_add(1, Ordering::SeqCst);
        let guard = PendingGuard(&self.pending);
        if pending >= self.max_pending {
            return Err(EncodeError::Overloaded(pending));
        }
        let (reply, answer) = flume::bounded(1);
        commands
            .try_send(Command::Job(Job { inputs, reply }))
            .map_err(|e| match e {
                flume::TrySendError::Full(_) => EncodeError::Overloaded(pending),
                flume::TrySendError::Disconnected(_) => {
                    EncodeError::Stopped("the thread has exited".into())
                }
            })?;
        let result = answer
            .recv_async()
            .await
            .map_err(|_| EncodeError::Stopped("the job was dropped".into()))?
            .map_err(EncodeError::Stopped);
        drop(guard);
        result
    }
}

struct PendingGuard<'a>(&'a AtomicUsize);

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A job being answered: its inputs, how many have gone into a step, and the outputs so far.
struct Running {
    job: Job,
    next: usize,
    outputs: Vec<Vec<f32>>,
}

fn run(
    encoder: &Encoder,
    config: &EncoderServeConfig,
    receiver: &flume::Receiver<Command>,
) -> Result<()> {
    let mut queue: VecDeque<Running> = VecDeque::new();
    let mut stopping = false;
    loop {
        if queue.is_empty() {
            if stopping {
                return Ok(());
            }
            match receiver.recv() {
                Ok(command) => take(command, &mut queue, &mut stopping),
                Err(_) => return Ok(()),
            }
        }
        while let Ok(command) = receiver.try_recv() {
            take(command, &mut queue, &mut stopping);
        }
        queue.retain(|r| !r.job.reply.is_disconnected());
        if queue.is_empty() {
            continue;
        }
        // This step's inputs, in arrival order: (job in the queue, input in the job).
        let mut picked = Vec::new();
        let mut tokens = 0;
        'fill: for (j, running) in queue.iter().enumerate() {
            for (i, input) in running.job.inputs.iter().enumerate().skip(running.next) {
                if !picked.is_empty() && tokens + input.ids.len() > config.max_batch_tokens {
                    break 'fill;
                }
                tokens += input.ids.len();
                picked.push((j, i));
            }
        }
        let inputs: Vec<EncoderInput> = picked
            .iter()
            .map(|&(j, i)| queue[j].job.inputs[i].clone())
            .collect();
        let started = std::time::Instant::now();
        let outcome = step(encoder, &inputs, config.sharing_cores);
        metrics::histogram!(crate::metrics::ENCODER_STEP_DURATION)
            .record(started.elapsed().as_secs_f64());
        match outcome {
            Ok(outputs) => {
                for (&(j, _), output) in picked.iter().zip(outputs) {
                    queue[j].outputs.push(output);
                    queue[j].next += 1;
                }
            }
            Err(e) => {
                // A failed forward fails the jobs it held, not the thread.
                tracing::error!("an encoder step failed: {e}");
                for &(j, _) in &picked {
                    let running = &mut queue[j];
                    running.next = running.job.inputs.len();
                    running.outputs.clear();
                    let _ = running.job.reply.try_send(Err(e.to_string()));
                }
            }
        }
        metrics::counter!(crate::metrics::ENCODER_TOKENS).increment(tokens as u64);
        while queue.front().is_some_and(|r| r.next == r.job.inputs.len()) {
            if let Some(done) = queue.pop_front() {
                if done.outputs.len() == done.job.inputs.len() {
                    let _ = done.job.reply.try_send(Ok(done.outputs));
                }
            }
        }
        // A step takes inputs in order, so the jobs it finishes are a prefix of the queue.
    }
}

fn take(command: Command, queue: &mut VecDeque<Running>, stopping: &mut bool) {
    match command {
        Command::Job(job) => queue.push_back(Running {
            next: 0,
            outputs: Vec::with_capacity(job.inputs.len()),
            job,
        }),
        Command::Shutdown => *stopping = true,
    }
}

/// One forward over `inputs`, then each input's vector.
fn step(encoder: &Encoder, inputs: &[EncoderInput], sharing_cores: bool) -> Result<Vec<Vec<f32>>> {
    for input in inputs {
        encoder.model.check(input).map_err(Error::InvalidBatch)?;
    }
    let states = match sharing_cores {
        true => encoder.model.forward_sharing_cores(inputs)?,
        false => encoder.model.forward(inputs)?,
    };
    match encoder.task {
        EncoderTask::Embed(pooling) => {
            let hidden = encoder.model.config().hidden_size;
            Ok(spans(inputs)
                .into_iter()
                .map(|span| pool(&states, hidden, span, pooling))
                .collect())
        }
        EncoderTask::Classify { .. } => encoder
            .model
            .classify(&states, inputs)?
            .ok_or_else(|| Error::Config("the model has no classifier".into())),
    }
}
