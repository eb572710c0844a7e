//! Encoders: models that read a whole input at once and give one vector for it (embeddings)
//! or a score for a pair (cross-encoders), served beside or instead of generation. `config`
//! reads what a Hugging Face checkpoint declares (BERT geometry, sentence-transformers
//! pooling) and `gguf` what a `bert` GGUF does (with its WordPiece tokenizer), `weights` reads
//! either's tensors, `bert` is the weights and the packed bidirectional forward, `pooling`
//! turns token states into one vector, `model` is a loaded checkpoint with its tokenizer, and
//! `serve` is the thread that owns it and batches every queued input into one forward per
//! step. `decoder` serves a generating model's pooling (embeddings, reranking) through the
//! engine's own scheduler instead, behind the same handle.

pub mod bert;
pub mod config;
pub mod decoder;
pub mod gguf;
pub mod model;
pub mod pooling;
pub mod serve;
pub mod weights;

pub use bert::{BertEncoder, EncoderInput};
pub use config::{is_encoder_dir, EncoderConfig, EncoderTask, Pooling, PoolingMode};
pub use decoder::{decoder_pooler, DecoderTask};
pub use gguf::is_encoder_gguf;
pub use model::{Encoder, EncoderTokenizer};
pub use serve::{spawn_encoder, EncodeError, EncoderHandle, EncoderServeConfig};
