//! thicket's user-facing layer: the command line (`fetch`, `generate`, `serve`, `batch`, `bench
//! forward`, `bench engine`, `bench spec`), the OpenAI-compatible HTTP server, engine flags,
//! and chat prompt rendering. Tokenization for users happens here; the engine sees token ids.

#![deny(missing_docs)]

pub mod batch;
pub mod bench;
pub mod chat;
pub mod cli;
pub mod engine_args;
pub mod generate_cmd;
pub mod server;
