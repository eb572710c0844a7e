//! thicket's engine: everything that touches candle. Models are fetched (`fetch`) and loaded
//! (`load`, from GGUF or HF directories) with their tokenizer; the `Model` forward takes a
//! `TreeBatch` of many sequences, each with a cached prefix in the `PagedKvStore` and its own
//! tree of new tokens, and returns logits for the rows asked for. Token ids in, token ids out.

#![deny(missing_docs)]

pub mod attention;
pub mod batch;
pub mod bench;
pub mod config;
mod error;
pub mod fetch;
pub mod generate;
pub mod gguf;
pub mod hf;
pub mod kv_cache;
pub mod kv_store;
pub mod linear;
pub mod load;
pub mod model;
pub mod testing;
pub mod tokenizer;
pub mod tree;

pub use batch::{LogitRows, TreeBatch};
pub use config::{Architecture, ModelConfig};
pub use error::{Error, Result};
pub use kv_cache::KvCache;
pub use kv_store::PagedKvStore;
pub use linear::WeightDType;
pub use load::{load_model, LoadOptions, LoadedModel};
pub use model::Model;
pub use tokenizer::ModelTokenizer;
pub use tree::{TokenTree, TreeMask};
