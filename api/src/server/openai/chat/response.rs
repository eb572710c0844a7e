//! What `/v1/chat/completions` answers with when it does not stream: each choice's assistant
//! message (its text, or the tool calls read from it, a `stop` finish then reported as
//! `tool_calls`) and its `logprobs` in the chat shape.

use engine::request::TokenLogprob;
use engine::ModelTokenizer;
use serde::Serialize;

use crate::server::openai::choice::{finish_fields, token_text, ChoiceState};
use crate::server::reasoning::{split_whole, Reasoning};
use crate::server::tools::{parse_calls, Calls, ToolCallOut};

/// One token's log-probability in the chat shape.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ChatTokenLogprob {
    /// The token's text.
    pub token: String,
    /// Its log-probability.
    pub logprob: f32,
    /// Its UTF-8 bytes.
    pub bytes: Vec<u8>,
    /// The most likely alternatives (empty inside alternatives).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_logprobs: Option<Vec<ChatTokenLogprob>>,
}

/// A chat choice's `logprobs`.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct ChatLogprobs {
    /// One entry per generated token.
    pub content: Vec<ChatTokenLogprob>,
    /// Always null (required by the OpenAI schema).
    pub refusal: Option<Vec<ChatTokenLogprob>>,
}

/// An assistant message.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ChatMessageOut {
    /// Always `assistant`.
    pub role: &'static str,
    /// The generated text (null when the answer is only tool calls).
    pub content: Option<String>,
    /// Always null: thicket never refuses (the field is required by the OpenAI schema).
    pub refusal: Option<String>,
    /// The functions the model called.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallOut>,
    /// What the model thought before answering (with a reasoning parser; vLLM's name).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// The same thinking under vLLM's newer name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
}

/// A chat choice.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ChatChoice {
    /// Position among the choices.
    pub index: usize,
    /// The answer.
    pub message: ChatMessageOut,
    /// Log-probabilities, when asked for.
    pub logprobs: Option<ChatLogprobs>,
    /// `stop` or `length`.
    pub finish_reason: Option<&'static str>,
    /// The stop string or token id that ended the choice.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<serde_json::Value>,
}

/// Log-probabilities in the chat shape.
pub fn chat_logprobs(tokenizer: &ModelTokenizer, logprobs: &[TokenLogprob]) -> ChatLogprobs {
    let entry = |id: u32, logprob: f32, top: Option<Vec<ChatTokenLogprob>>| {
        let token = token_text(tokenizer, id);
        ChatTokenLogprob {
            bytes: token.as_bytes().to_vec(),
            token,
            logprob,
            top_logprobs: top,
        }
    };
    ChatLogprobs {
        content: logprobs
            .iter()
            .map(|lp| {
                let top = lp.top.iter().map(|&(id, l)| entry(id, l, None)).collect();
                entry(lp.token_id, lp.logprob, Some(top))
            })
            .collect(),
        refusal: None,
    }
}

/// Choice `index` of a whole response: with `tool_calls` (the offered functions, when the
/// answer is read for calls) its calls apart from its text.
pub fn choice(
    index: usize,
    c: &ChoiceState,
    tokenizer: &ModelTokenizer,
    want_logprobs: bool,
    tool_calls: Option<&Calls>,
    reasoning: Option<Reasoning>,
) -> ChatChoice {
    let (mut finish_reason, stop_reason) = finish_fields(c.finish.as_ref());
    // With a reasoning parser only the answer after the thinking is read for calls.
    let (thinking, answer) = match reasoning {
        Some(r) => split_whole(r, &c.text),
        None => (None, c.text.clone()),
    };
    let (content, calls) = match tool_calls.map(|calls| parse_calls(&answer, calls)) {
        Some(Some((content, calls))) => {
            if finish_reason == Some("stop") && !calls.is_empty() {
                finish_reason = Some("tool_calls");
            }
            (content, calls)
        }
        _ if reasoning.is_some() && answer.is_empty() => (None, Vec::new()),
        _ => (Some(answer), Vec::new()),
    };
    ChatChoice {
        index,
        message: ChatMessageOut {
            role: "assistant",
            content,
            refusal: None,
            tool_calls: calls,
            reasoning_content: thinking.clone(),
            reasoning: thinking,
        },
        logprobs: want_logprobs.then(|| chat_logprobs(tokenizer, &c.logprobs)),
        finish_reason,
        stop_reason,
    }
}
