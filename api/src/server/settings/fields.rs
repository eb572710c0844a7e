//! The fields every generation request reads, whatever API it came by ([`CommonFields`]:
//! OpenAI's sampling and stop fields, vLLM's extra ones, thicket's `speculation` object), read
//! from a body in a second pass ([`HasCommonFields`]). Unknown request fields are ignored, as
//! OpenAI-compatible servers do.

use std::collections::BTreeMap;

use serde::Deserialize;

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
