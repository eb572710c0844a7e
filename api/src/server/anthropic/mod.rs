//! Anthropic's Messages API: `POST /v1/messages` ([`messages`]) and
//! `POST /v1/messages/count_tokens` ([`count_tokens`]). A request becomes the shared path's
//! typed request (`server::request`) and goes through the one generation path every front end shares (by way of
//! `server::adapter`). Every error here is in Anthropic's shape ([`error`]). The `x-api-key`
//! header is accepted as the API key (see the router's key check); `anthropic-version` is
//! accepted and not needed.

pub mod count_tokens;
pub mod error;
pub mod messages;
