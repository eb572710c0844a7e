//! thicket's engine: everything that touches candle. Models are fetched and loaded (from GGUF
//! or HF directories) with their tokenizer; the `Model` forward takes a `TreeBatch` of many
//! sequences, each with a cached prefix in the `PagedKvStore` and its own tree of new tokens,
//! and returns logits for the rows asked for. The engine thread (`handle::spawn`) serves many
//! requests at once through that forward: continuous batching with chunked prefill and
//! preemption (the `scheduler` crate), speculative drafting verified in the same forward,
//! sampling, stop conditions and streamed events. Token ids in, token ids (and their text) out.
//!
//! # Map
//!
//! ```text
//! cpu/          thicket's CPU kernels, no engine state: qgemm/ (quantized matmuls),
//!               attention/ (paged tree attention: driver, scores, values, slots,
//!               reference), kv_store, softmax, silu, reduce, team
//! model/        what a model is and how it is obtained: config, weights and `Model`,
//!               fused_pass (one pass over the layers on the CPU), linear, load, gguf, hf,
//!               fetch, tokenizer, detokenizer, testing (tiny random models)
//! backend/      the `Backend` trait and `for_model`: cpu (host KV, thicket's kernels),
//!               cuda/ (device KV, feature `cuda`), mock (no tensors)
//! spec/         speculation: the drafter and speculator traits, verify, stats,
//!               methods/ (a file or a folder per draft source) and the engine-side
//!               coordinator
//! constraint/   output formats (llguidance): JSON schema, grammars, tool calls
//! encoder/      encoders (BERT): embeddings and cross-encoder scores, on a thread of their
//!               own that packs every queued input into one bidirectional forward
//! engine_loop/  the one thread's step: intake -> schedule -> batch -> forward -> decide
//!               -> update -> emit (the diagram in engine_loop/mod.rs)
//! handle        spawning the engine thread; the channels in and out
//! request, sampler, metrics, error, calibration (the start-up measurement of the
//!               forward-cost curve)
//! tree, tree_batch   the shared data types: a token tree and its mask, the batch a
//!               forward takes (the CPU attention reads a TreeBatch)
//! ```
//!
//! Dependencies point one way, each layer using only those before it:
//! `tree, tree_batch <- cpu <- model <- backend <- spec <- engine_loop <- handle`. Beside that
//! line sit the request's own types, which the loop and `handle` use: `request` (which names
//! its speculation method and output format), `sampler` (whose draws `spec::verify` checks),
//! `constraint` (on the model's tokenizer) and `metrics`.

#![deny(missing_docs)]

pub mod backend;
pub mod calibration;
pub mod constraint;
pub mod cpu;
pub mod encoder;
mod engine_loop;
mod error;
pub mod handle;
pub mod metrics;
pub mod model;
pub mod request;
pub mod sampler;
pub mod spec;
pub mod tree;
pub(crate) mod tree_batch;
mod tree_batch_cut;
mod validation;

pub use backend::{Backend, CpuBackend, MockBackend};
pub use cpu::kv_store::PagedKvStore;
pub use error::{Error, Result};
pub use handle::{
    spawn, spawn_with_backend, EngineConfig, EngineHandle, RequestStream, SampleOutput,
    StateSnapshotConfig, StateStats, SubmitError,
};
pub use kvcache::{ManagerConfig, WindowConfig};
pub use model::config::{Architecture, ModelConfig};
pub use model::linear::{QuantKernel, WeightDType};
pub use model::load::{load_model, DeviceChoice, LoadOptions, LoadedModel};
pub use model::tokenizer::ModelTokenizer;
pub use model::Model;
pub use request::{
    Event, Failure, FinishReason, InvalidRequest, Pooling, Request, StopConditions, Usage,
    MAX_CACHE_SALT_BYTES,
};
pub use sampler::SamplingParams;
pub use scheduler::{CostCurve, SchedulerConfig};
pub use spec::coordinator::{DraftModelSetup, SourceTotals, SpeculationConfig};
pub use spec::{SpecMethod, SpecRequest};
pub use tree::{TokenTree, TreeMask};
pub use tree_batch::{LogitRows, SeqEntry, SeqState, StateSave, TreeBatch};
