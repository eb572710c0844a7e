//! What `/v1/chat/completions` streams: each chunk's choice (the assistant role on a choice's
//! first chunk, new text, tool-call pieces, the finish reason on its last) and how a tool
//! call goes out: a delta naming it, then its arguments, in one delta when it was read whole
//! or in one per fragment as it is written, as OpenAI sends them.
//! The stream itself (merging prompts, usage, `[DONE]`) is `openai::stream`'s.

use engine::ModelTokenizer;
use serde::Serialize;

use super::response::{chat_logprobs, ChatLogprobs};
use crate::server::openai::choice::{ChunkParts, FunctionDelta, ToolCallDelta};
use crate::server::tools::Piece;

/// The delta of a streamed chat choice.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct ChatDelta {
    /// `assistant` in the first chunk of a choice.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    /// New text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// Tool-call pieces.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
    /// New thinking text (with a reasoning parser; vLLM's name).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// The same under vLLM's newer name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
}

/// A streamed chat choice.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ChatChunkChoice {
    /// Position among the choices.
    pub index: usize,
    /// What is new.
    pub delta: ChatDelta,
    /// Log-probabilities of the new tokens, when asked for.
    pub logprobs: Option<ChatLogprobs>,
    /// Set in the choice's last chunk.
    pub finish_reason: Option<&'static str>,
    /// The stop string or token id that ended the choice.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<serde_json::Value>,
}

/// The choice of one stream chunk, with its `finish_reason` and `stop_reason`.
pub fn chunk_choice(
    tokenizer: &ModelTokenizer,
    parts: ChunkParts<'_>,
    (finish_reason, stop_reason): (Option<&'static str>, Option<serde_json::Value>),
) -> ChatChunkChoice {
    let content = (parts.role || !parts.text.is_empty()).then_some(parts.text);
    ChatChunkChoice {
        index: parts.index,
        delta: ChatDelta {
            role: parts.role.then_some("assistant"),
            content,
            tool_calls: parts.tool_calls,
            reasoning_content: parts.reasoning.clone(),
            reasoning: parts.reasoning,
        },
        logprobs: parts.logprobs.map(|l| chat_logprobs(tokenizer, l)),
        finish_reason,
        stop_reason,
    }
}

/// The deltas (text, tool-call pieces) of pieces of a choice's answer: text as content, each
/// whole call as a delta naming it and one with its arguments, a streamed call as a delta
/// naming it when it starts and one per fragment of its arguments.
pub fn deltas(pieces: Vec<Piece>) -> Vec<(String, Option<Vec<ToolCallDelta>>)> {
    let mut out = Vec::new();
    for piece in pieces {
        match piece {
            Piece::Text(text) => out.push((text, None)),
            Piece::Call { index, call } => {
                out.push(named(index, call.id, call.function.name));
                out.push(arguments(index, call.function.arguments));
            }
            Piece::CallStart { index, id, name } => out.push(named(index, id, name)),
            Piece::Arguments { index, text } => out.push(arguments(index, text)),
            Piece::CallEnd { .. } => {}
        }
    }
    out
}

/// The delta that opens call `index`: its id, type and name.
fn named(index: usize, id: String, name: String) -> (String, Option<Vec<ToolCallDelta>>) {
    let delta = ToolCallDelta {
        index,
        id: Some(id),
        kind: Some("function"),
        function: FunctionDelta {
            name: Some(name),
            arguments: String::new(),
        },
    };
    (String::new(), Some(vec![delta]))
}

/// A delta of call `index`'s arguments.
fn arguments(index: usize, text: String) -> (String, Option<Vec<ToolCallDelta>>) {
    let delta = ToolCallDelta {
        index,
        id: None,
        kind: None,
        function: FunctionDelta {
            name: None,
            arguments: text,
        },
    };
    (String::new(), Some(vec![delta]))
}
