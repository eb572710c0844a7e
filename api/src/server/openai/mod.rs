//! The OpenAI API, an endpoint per folder: [`chat`] (`/v1/chat/completions`),
//! [`completions`] (`/v1/completions`) and [`responses`] (`/v1/responses`), each with its
//! handler in `mod.rs`, its wire types in `request.rs` / `response.rs` and its stream writer.
//! Chat and completions share their envelope ([`protocol`], [`body`]), their choices'
//! accumulators ([`choice`]), how a started request is answered ([`respond`]) and their stream
//! writer ([`stream`]); the chat body is the shared path's own request (`server::request`).
//! The Responses API is translated into a chat request and shares the adapters' helpers
//! (`server::adapter`).

pub mod body;
pub mod chat;
pub mod choice;
pub mod completions;
pub mod protocol;
pub mod respond;
pub mod responses;
pub mod stream;
