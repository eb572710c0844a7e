//! How the engine refuses a request before queueing it: [`InvalidRequest`] names the field (as
//! the OpenAI API names it) and what is wrong with it; the request's and the sampler's
//! validations build it with [`invalid`].

/// A request the engine refuses before queueing it; the message names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct InvalidRequest {
    /// The offending field, as the OpenAI API names it.
    pub field: &'static str,
    /// What is wrong with it.
    pub message: String,
}

/// A refusal of `field`, saying `message`.
pub(crate) fn invalid(field: &'static str, message: impl Into<String>) -> InvalidRequest {
    InvalidRequest {
        field,
        message: message.into(),
    }
}
