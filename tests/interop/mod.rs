//! Third-party clients and tools, pinned and installed under `target/`, against the real
//! `thicket serve`: the `openai` package, the agent SDKs, aiperf, schemathesis, and
//! vllm-router with the Kubernetes example.

mod agent_sdks;
mod aiperf;
mod openai_client;
mod reasoning_clients;
mod schemathesis;
mod vllm_router;
