//! The OpenAI API, an endpoint per folder: [`chat`] (`/v1/chat/completions`),
//! [`completions`] (`/v1/completions`) and [`responses`] (`/v1/responses`), each with its
//! handler in `mod.rs`, its wire types in `request.rs` / `response.rs` and its stream writer.
//! Chat and completions share their request fields and envelope ([`protocol`], [`body`]) and
//! their stream writer ([`stream`]); the Responses API is translated into a chat request and
//! shares the adapters' helpers (`server::adapter`).

pub mod body;
pub mod chat;
pub mod completions;
pub mod protocol;
pub mod responses;
pub mod stream;
