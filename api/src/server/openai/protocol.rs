//! The OpenAI wire format that `/v1/chat/completions` and `/v1/completions` share: the
//! request fields both read ([`CommonFields`], with vLLM's extra sampling fields and
//! thicket's `speculation` object), and the envelope both answer in ([`ResponseBody`]) with
//! its usage and `thicket` speculation objects. Each endpoint's own fields and choices are in
//! its folder (`chat::request`, `completions::response`, ...). Unknown request fields are
//! ignored, as OpenAI-compatible servers do.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A string or a list of them.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    /// One string.
    One(String),
    /// Several strings.
    Many(Vec<String>),
}

impl OneOrMany {
    /// The strings.
    pub fn into_vec(self) -> Vec<String> {
        match self {
            OneOrMany::One(s) => vec![s],
            OneOrMany::Many(v) => v,
        }
    }
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a final chunk with the request's usage.
    pub include_usage: Option<bool>,
}

/// The `speculation` extension object.
#[derive(Debug, Clone, Deserialize)]
pub struct SpeculationField {
    /// `suffix`, `recycling`, `ngram_trie`, `prompt_lookup`, `draft_model`, `none` or `auto`.
    pub method: Option<String>,
    /// Most draft nodes per step.
    pub max_draft_tokens: Option<usize>,
}

/// Fields shared by both generation endpoints.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct CommonFields {
    /// The served model's name.
    pub model: Option<String>,
    /// Choices per prompt.
    pub n: Option<usize>,
    /// Output tokens at most.
    pub max_tokens: Option<usize>,
    /// Strings that end a choice.
    pub stop: Option<OneOrMany>,
    /// Sampling temperature, 0 = greedy.
    pub temperature: Option<f32>,
    /// Nucleus sampling.
    pub top_p: Option<f32>,
    /// Keep the k most likely tokens (-1 or 0 = all).
    pub top_k: Option<i64>,
    /// Drop tokens below this fraction of the most likely one.
    pub min_p: Option<f32>,
    /// Seed of the random choices.
    pub seed: Option<i64>,
    /// OpenAI presence penalty.
    pub presence_penalty: Option<f32>,
    /// OpenAI frequency penalty.
    pub frequency_penalty: Option<f32>,
    /// Repetition penalty over prompt and output (1 = off).
    pub repetition_penalty: Option<f32>,
    /// Token id (as a string) to bias added to its logit.
    pub logit_bias: Option<BTreeMap<String, f32>>,
    /// Stream server-sent events.
    pub stream: Option<bool>,
    /// Options of the stream.
    pub stream_options: Option<StreamOptions>,
    /// Keep going past end-of-sequence tokens.
    pub ignore_eos: Option<bool>,
    /// Leave special tokens out of the text (default true; vLLM's field).
    pub skip_special_tokens: Option<bool>,
    /// Token ids that end a choice.
    pub stop_token_ids: Option<Vec<u32>>,
    /// Output tokens before a stop condition may apply.
    pub min_tokens: Option<usize>,
    /// The end user (logged only).
    pub user: Option<String>,
    /// Speculation for this request.
    pub speculation: Option<SpeculationField>,
    /// A format the output must follow, in vLLM's shape: one of `json` (a schema),
    /// `json_object`, `regex`, `choice` or `grammar` (Lark).
    pub structured_outputs: Option<serde_json::Value>,
    /// What the client expects the output to be (OpenAI's Predicted Outputs: `{"type":
    /// "content", "content": text or text parts}`), read by [`crate::server::settings::prediction`].
    pub prediction: Option<serde_json::Value>,
    /// vLLM's `cache_salt`: a non-empty string; the request shares cached prompt blocks only
    /// with requests that give the same one (or none, for none).
    pub cache_salt: Option<serde_json::Value>,
}

/// A request body that embeds [`CommonFields`]. They are parsed from the same JSON object
/// in a second pass rather than with `#[serde(flatten)]`, which would lose the path of a
/// field with a bad value.
pub trait HasCommonFields {
    /// Where the shared fields go.
    fn common_mut(&mut self) -> &mut CommonFields;
}

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
