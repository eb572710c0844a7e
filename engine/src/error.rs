//! The engine's one error type. Every failure a user can cause (a missing or corrupt model
//! file, an unsupported architecture, an empty prompt, a batch that does not fit) has its own
//! variant with a message that says what to do; candle's errors are wrapped, never unwrapped.

use std::path::PathBuf;

/// Errors from fetching, loading and running models.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A model argument that is neither a known alias, a GGUF file nor an HF directory.
    #[error("model '{0}' not found: pass an alias ({aliases}), a .gguf file, or a directory with config.json + *.safetensors + tokenizer.json", aliases = crate::model::fetch::alias_names().join(", "))]
    ModelNotFound(String),
    /// A file the loader needs is missing.
    #[error("missing file {0}")]
    MissingFile(PathBuf),
    /// The GGUF header or metadata could not be read.
    #[error("invalid GGUF file {path}: {reason}")]
    InvalidGguf {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
    /// A GGUF file with a tensor of a type thicket does not read (the message names the
    /// tensor, its type, and the types thicket reads).
    #[error("cannot load {path}: {reason}")]
    UnreadableTensor {
        /// The file.
        path: PathBuf,
        /// Which tensor, and its type.
        reason: String,
    },
    /// An architecture this engine does not implement.
    #[error(
        "unsupported model architecture '{0}' (supported: {supported})",
        supported = crate::model::arch::Architecture::supported().join(", ")
    )]
    UnsupportedArchitecture(String),
    /// A required metadata key or config field is absent or has the wrong type.
    #[error("model metadata: {0}")]
    Metadata(String),
    /// An output format (schema, regex, grammar, choice) that cannot compile, or that uses a
    /// feature the grammar engine does not implement (named in the message).
    #[error("the output format cannot be used: {0}")]
    Format(String),
    /// The tokenizer could not be built or failed on an input.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// Fetching a model package failed.
    #[error("fetch {alias}: {reason}")]
    Fetch {
        /// The model alias.
        alias: String,
        /// What went wrong.
        reason: String,
    },
    /// A prompt with no tokens.
    #[error("prompt is empty: at least one token is needed")]
    EmptyPrompt,
    /// A request's output format, compiled and followed so far, could not be followed
    /// further (llguidance's limits on one token's mask).
    #[error("the output format could not be followed: {0}")]
    FormatFailed(String),
    /// An engine setting that cannot work (the message names the flag to change).
    #[error("engine configuration: {0}")]
    Config(String),
    /// A batch that breaks the `TreeBatch` invariants (a programming error upstream).
    #[error("invalid batch: {0}")]
    InvalidBatch(String),
    /// The GPU or its driver failed a call (allocation, copy, kernel launch).
    #[error("device: {0}")]
    Device(String),
    /// The KV store has no room for the request.
    #[error("out of KV blocks: {0}")]
    OutOfBlocks(String),
    /// The block manager refused a call (an engine bookkeeping error).
    #[error("kv cache: {0}")]
    KvCache(#[from] kvcache::KvError),
    /// The scheduler refused a call (an engine bookkeeping error).
    #[error("scheduler: {0}")]
    Scheduler(#[from] scheduler::SchedulerError),
    /// A tensor operation failed.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
    /// An I/O failure.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        source: std::io::Error,
    },
}

impl Error {
    /// Wraps an I/O error with what was being done.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            context: context.into(),
            source,
        }
    }
}

/// Result with the engine's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
