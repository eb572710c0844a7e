//! Third-party clients and tools, pinned and installed under `target/`, against the real
//! `thicket serve`: the `openai` package (on a chat model and on an encoder), the agent SDKs, aiperf, schemathesis, and
//! vllm-router with the Kubernetes example.

mod agent_sdks;
mod aiperf;
pub(crate) mod openai_client;
mod openai_embeddings;
mod reasoning_clients;
mod schemathesis;
mod vllm_router;
