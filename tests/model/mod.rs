//! A model alone, below the engine: the paged tree-attention forward's properties, its
//! agreement with candle-transformers on the same weights (every family, mixtures of experts
//! among them), the tokenizers (gpt-oss's against openai-harmony), the KV cache under
//! the plain greedy decoder, load and input errors, and the CUDA backend.

mod candle_oracle;
mod cuda;
pub(crate) mod encoder;
mod encoder_gguf;
mod encoder_hf;
pub(crate) mod families;
pub(crate) mod families_gguf;
pub(crate) mod forward;
mod gemma3_real;
mod gemma4;
mod gemma4_hf;
mod gemma4_tokenizer;
mod gptoss;
mod gptoss_hf;
pub(crate) mod granite;
mod granite_hf;
mod hybrid_checks;
mod kv_cache;
pub(crate) mod lfm2;
pub(crate) mod llamacpp_reference;
mod load_and_input_errors;
pub(crate) mod longrope;
pub(crate) mod moe;
mod mxfp4_experts;
pub(crate) mod o200k;
mod prepared_experts;
pub(crate) mod qwen35;
pub(crate) mod qwen35_forward;
mod qwen35_hf;
pub(crate) mod qwen3next;
mod qwen3next_hf;
mod tokenizer;
mod unreadable_tensors;
mod yarn;
