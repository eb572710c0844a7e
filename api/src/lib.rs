//! thicket's user-facing layer: the command line (`fetch`, `generate`, `bench forward`) and
//! chat prompt rendering. Tokenization for users happens here; the engine sees token ids.

#![deny(missing_docs)]

pub mod chat;
pub mod cli;
