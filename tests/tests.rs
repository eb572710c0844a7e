//! thicket's integration tests, one binary, a module per layer from the bottom up:
//!
//! - `support`: no tests; the shared fixtures (models loaded once, tiny random models), the
//!   plain greedy decoder the engine is checked against, and the real `thicket` binary run
//!   as a child process.
//! - `model`: a model alone: the paged tree-attention forward, agreement with
//!   candle-transformers' reference implementations, the tokenizer, the KV cache under plain
//!   greedy decoding, load and input errors, and the CUDA backend.
//! - `engine`: the serving engine's thread: requests, speculation, Predicted Outputs,
//!   structured outputs, `cache_salt` isolation, and the speculator seam.
//! - `http`: the HTTP router in process, over an engine with the mock backend.
//! - `cli`: the real `thicket` binary's commands (`serve`, `batch`, `bench`) as processes.
//! - `interop`: third-party clients and tools (SDKs, aiperf, schemathesis, vllm-router)
//!   against the real `thicket serve`.

mod cli;
mod engine;
mod http;
mod interop;
mod model;
mod support;
