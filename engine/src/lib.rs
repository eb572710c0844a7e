//! thicket's engine: everything that touches candle. Models are fetched (`fetch`) and loaded
//! (`load`, from GGUF or HF directories) with their tokenizer; the `Model` forward takes a
//! `TreeBatch` of many sequences, each with a cached prefix in the `PagedKvStore` and its own
//! tree of new tokens, and returns logits for the rows asked for. The engine thread
//! (`handle::spawn`) serves many requests at once through that forward: continuous batching
//! with chunked prefill and preemption (the `scheduler` crate), sampling, stop conditions and
//! streamed events. Token ids in, token ids (and their text) out.

#![deny(missing_docs)]

pub mod attention;
mod attention_kernels;
pub mod backend;
pub mod batch;
pub mod bench;
pub mod config;
pub mod constraint;
pub mod detokenizer;
mod engine_loop;
mod error;
pub mod fetch;
pub mod fused;
pub mod gguf;
pub mod handle;
pub mod hf;
pub mod kv_store;
pub mod linear;
pub mod load;
pub mod metrics;
pub mod model;
pub mod qgemm;
mod reduce;
pub mod request;
pub mod sampler;
pub mod silu;
pub mod softmax;
pub mod spec;
pub mod speculation;
pub mod team;
pub mod testing;
pub mod tokenizer;
pub mod tree;

pub use backend::{Backend, CandleBackend, MockBackend};
pub use batch::{LogitRows, TreeBatch};
pub use config::{Architecture, ModelConfig};
pub use error::{Error, Result};
pub use handle::{
    spawn, spawn_with_backend, EngineConfig, EngineHandle, RequestStream, SampleOutput, SubmitError,
};
pub use kv_store::PagedKvStore;
pub use kvcache::ManagerConfig;
pub use linear::{QuantKernel, WeightDType};
pub use load::{load_model, DeviceChoice, LoadOptions, LoadedModel};
pub use model::Model;
pub use request::{Event, Failure, FinishReason, InvalidRequest, Request, StopConditions, Usage};
pub use sampler::SamplingParams;
pub use scheduler::{CostCurve, SchedulerConfig};
pub use spec::{SpecMethod, SpecRequest};
pub use speculation::{DraftModelSetup, SpeculationConfig};
pub use tokenizer::ModelTokenizer;
pub use tree::{TokenTree, TreeMask};
