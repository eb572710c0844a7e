//! thicket's user-facing layer; tokenization for users happens here, the engine sees token
//! ids. A map:
//!
//! - [`commands`]: the `thicket` command line, one file per command (`fetch`, `generate`,
//!   `serve`, `batch`, `bench`), each turning its flags into a call into the modules below;
//! - [`args`]: the model and engine flag groups those commands share, and the engine started
//!   from them;
//! - [`server`]: the OpenAI- and Anthropic-compatible HTTP server;
//! - [`batch`]: the offline batch runner, through the server's request path without HTTP;
//! - [`bench`]: the benchmarks, in-process on a loaded model and as a client of any server;
//! - [`chat`]: chat prompt rendering.

#![deny(missing_docs)]

pub mod args;
pub mod batch;
pub mod bench;
pub mod chat;
pub mod chat_functions;
pub mod commands;
pub mod server;
