//! A `POST /v1/completions` body: the prompt (text, token ids, or a batch of either), `echo`,
//! `logprobs`, `suffix`, `best_of`, and the fields it shares with chat ([`CommonFields`]).

use serde::Deserialize;

use crate::server::settings::fields::{CommonFields, HasCommonFields};

/// A completion prompt: text, token ids, or a batch of either.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum PromptInput {
    /// One text prompt.
    Text(String),
    /// Several text prompts.
    Texts(Vec<String>),
    /// One prompt as token ids.
    Tokens(Vec<u32>),
    /// Several prompts as token ids.
    TokenLists(Vec<Vec<u32>>),
}

/// `POST /v1/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    /// The prompt(s).
    pub prompt: Option<PromptInput>,
    /// Fields shared with chat (read in a second pass, see [`HasCommonFields`]).
    #[serde(skip)]
    pub common: CommonFields,
    /// Return the prompt before the completion.
    pub echo: Option<bool>,
    /// Log-probabilities of the chosen token and this many alternatives.
    pub logprobs: Option<usize>,
    /// Text after the completion (not supported).
    pub suffix: Option<String>,
    /// Candidates to pick the best from (only `best_of == n` is supported).
    pub best_of: Option<usize>,
}

impl HasCommonFields for CompletionRequest {
    fn common_mut(&mut self) -> &mut CommonFields {
        &mut self.common
    }
}
