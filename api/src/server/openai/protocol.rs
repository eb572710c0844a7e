//! The OpenAI wire format that `/v1/chat/completions` and `/v1/completions` answer in: the
//! envelope ([`ResponseBody`]) with its usage and `thicket` speculation objects. The request
//! fields both read are `settings::fields`'; each endpoint's own fields and choices are in its
//! folder (`completions::request`, `chat::response`, ...).

use std::collections::BTreeMap;

use serde::Serialize;

/// `usage` of a response.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct UsageBody {
    /// Prompt tokens (each prompt counted once, whatever `n`).
    pub prompt_tokens: usize,
    /// Generated tokens over every choice.
    pub completion_tokens: usize,
    /// Their sum.
    pub total_tokens: usize,
    /// Prompt tokens served from the prefix cache.
    pub prompt_tokens_details: PromptTokensDetails,
    /// What became of the prediction's tokens.
    pub completion_tokens_details: CompletionTokensDetails,
}

/// `usage.completion_tokens_details`: of the tokens drafted from the request's `prediction`,
/// how many verification accepted (they are in the output) and rejected (drafted, then
/// found not to be what the model generates there). Both are 0 without a prediction.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct CompletionTokensDetails {
    /// Thinking tokens (with a reasoning parser; 0 otherwise).
    pub reasoning_tokens: usize,
    /// Prediction tokens drafted and accepted.
    pub accepted_prediction_tokens: usize,
    /// Prediction tokens drafted and rejected.
    pub rejected_prediction_tokens: usize,
}

/// `usage.prompt_tokens_details`.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct PromptTokensDetails {
    /// Tokens read from the prefix cache.
    pub cached_tokens: usize,
}

/// The `thicket` extension object of a response: speculation statistics.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct ThicketBody {
    /// Totals over every choice.
    pub speculation: SpeculationStats,
}

/// Speculation totals.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct SpeculationStats {
    /// Verification steps that had draft tokens.
    pub verify_steps: usize,
    /// Draft tokens verified.
    pub draft_tokens: usize,
    /// Draft tokens accepted.
    pub accepted_tokens: usize,
    /// Tokens per verification step (the papers' MAT); 1 without speculation.
    pub mean_accepted_tokens: f64,
    /// The same per draft source that drafted (`prediction`, and `auto`'s sources apart).
    pub sources: BTreeMap<&'static str, SourceStats>,
}

/// One draft source's speculation totals.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct SourceStats {
    /// Verification steps of its trees.
    pub verify_steps: usize,
    /// Its draft tokens verified.
    pub draft_tokens: usize,
    /// Its draft tokens accepted.
    pub accepted_tokens: usize,
}

/// A whole response or one stream chunk: `object` tells which.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ResponseBody<C> {
    /// `cmpl-...` or `chatcmpl-...`, the same in every chunk of a stream.
    pub id: String,
    /// `text_completion`, `chat.completion` or `chat.completion.chunk`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// The served model's name.
    pub model: String,
    /// The choices.
    pub choices: Vec<C>,
    /// Token counts (in a stream: null, then the last chunk under `include_usage`).
    #[serde(skip_serializing_if = "Skip::skip")]
    pub usage: Skip<UsageBody>,
    /// Speculation statistics (whole responses and the usage chunk).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thicket: Option<ThicketBody>,
}

/// A field that is left out, sent as null, or sent with a value.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Skip<T> {
    /// Not in the JSON.
    #[default]
    Absent,
    /// `null`.
    Null,
    /// A value.
    Value(T),
}

impl<T> Skip<T> {
    fn skip(&self) -> bool {
        matches!(self, Skip::Absent)
    }
}

impl<T: Serialize> Serialize for Skip<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Skip::Value(v) => v.serialize(s),
            _ => s.serialize_none(),
        }
    }
}
