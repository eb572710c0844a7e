//! The HTTP router in process, over an engine with the mock backend, driven with
//! `tower::ServiceExt::oneshot`: its endpoints, its error responses, engine faults as each
//! route reports them, and a model without a chat template; `mock_server` builds the server
//! they share.

mod endpoints;
mod engine_faults;
mod error_responses;
mod mock_server;
mod no_chat_template;
