//! The serving engine's thread, driven through its handle: requests on SmolLM2, on Gemma 3
//! 270M (a windowed model) and on the mock backend, speculation and Predicted Outputs, structured outputs, `cache_salt`
//! isolation, drafting methods defined outside the engine, and the state slots and
//! snapshots of the hybrids.

mod cache_salt;
mod complete_or_length;
mod framed_formats;
mod gemma3;
mod gemma4;
mod lfm2;
mod masked_sampling;
mod mock_backend;
mod pooling;
mod pooling_rerank;
mod prediction;
mod qwen35;
mod requests;
mod speculation;
mod speculator_seam;
mod states;
mod structured;
mod structured_limits;
mod thinking;
