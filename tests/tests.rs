//! thicket's integration tests, one binary: correctness of the paged tree-attention forward
//! on the real default model (SmolLM2-135M, fetched on first use) and on tiny random models
//! built in code, against candle-transformers' reference implementations; the KV cache and
//! the serving engine end to end.

mod agent_apis;
mod aiperf;
mod batch;
mod bench_serve;
mod cache_salt;
mod common;
mod conformance;
mod cuda;
mod errors;
mod faults;
mod forward;
mod greedy;
mod hostile;
mod kv_cache;
mod load;
mod masked_sampling;
mod mock_backend;
mod openai_e2e;
mod oracle;
mod prediction;
mod processes;
mod router;
mod security;
mod server;
mod server_errors;
mod serving;
mod speculation;
mod speculator_seam;
mod structured;
mod structured_limits;
mod tokenizer;
mod tools;
