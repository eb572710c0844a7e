//! The HTTP router in process, over an engine with the mock backend, driven with
//! `tower::ServiceExt::oneshot`: its endpoints, its error responses, engine faults as each
//! route reports them, a model without a chat template, reasoning output (gpt-oss's harmony
//! channels among it) and each tool-call format on a scripted model; `mock_server` builds the
//! server they share, `scripted` one that writes a given text.

mod endpoints;
mod engine_faults;
mod error_responses;
mod forced_calls;
mod gemma4_template;
mod harmony;
mod harmony_reference;
pub(crate) mod mock_server;
mod no_chat_template;
pub(crate) mod pooling;
mod pooling_beside;
mod pooling_decoder;
mod pooling_fuzz;
mod reasoning;
mod scripted;
mod tool_formats;
