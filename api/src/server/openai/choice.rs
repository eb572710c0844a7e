//! One choice of an OpenAI response as it is built from engine events: its accumulator
//! ([`ChoiceState`]: text, logprobs, finish, usage), its `finish_reason` and `stop_reason`,
//! the parts of its next stream chunk ([`ChunkParts`], with chat's tool-call deltas), and the
//! usage and `thicket` speculation totals over a request's choices ([`totals`]) or over one
//! answer read as parts ([`ending_totals`]).

use engine::request::TokenLogprob;
use engine::{FinishReason, ModelTokenizer, Usage};
use serde::Serialize;

use super::protocol::{SpeculationStats, ThicketBody, UsageBody};
use crate::server::answer::Ending;
use crate::server::reasoning::Reasoning;

/// Everything one choice produced so far.
#[derive(Debug, Clone, Default)]
pub struct ChoiceState {
    /// Text (after the echoed prompt, if any).
    pub text: String,
    /// Log-probabilities of its tokens.
    pub logprobs: Vec<TokenLogprob>,
    /// Set once it ended.
    pub finish: Option<FinishReason>,
    /// Token counts, once it ended.
    pub usage: Usage,
    /// Its tokens so far (kept where its thinking tokens are to be counted).
    pub token_ids: Vec<u32>,
    /// Its thinking tokens, once it ended (with a reasoning parser).
    pub reasoning_tokens: usize,
}

impl ChoiceState {
    /// Records the end of the choice: why, its counts, and (with a reasoning parser) how
    /// many of its tokens were thinking.
    pub fn finish(
        &mut self,
        reason: FinishReason,
        usage: Usage,
        reasoning: Option<(Reasoning, &ModelTokenizer)>,
    ) {
        self.finish = Some(reason);
        self.usage = usage;
        if let Some((reasoning, tokenizer)) = reasoning {
            self.reasoning_tokens = reasoning.reasoning_tokens(tokenizer, &self.token_ids);
        }
    }
}

/// `finish_reason` and `stop_reason` of a finished choice.
pub fn finish_fields(
    finish: Option<&FinishReason>,
) -> (Option<&'static str>, Option<serde_json::Value>) {
    match finish {
        None => (None, None),
        Some(reason) => {
            let stop_reason = match reason {
                FinishReason::StopString(s) => Some(serde_json::Value::from(s.clone())),
                FinishReason::StopToken(t) => Some(serde_json::Value::from(*t)),
                _ => None,
            };
            (Some(reason.as_openai()), stop_reason)
        }
    }
}

/// Usage and speculation totals over `choices`, with `n` choices per prompt (each prompt's
/// tokens are counted once).
pub fn totals(choices: &[ChoiceState], n: usize) -> (UsageBody, ThicketBody) {
    let mut usage = UsageBody::default();
    let mut spec = SpeculationStats::default();
    for (i, c) in choices.iter().enumerate() {
        if i % n.max(1) == 0 {
            usage.prompt_tokens += c.usage.prompt_tokens;
            usage.prompt_tokens_details.cached_tokens += c.usage.cached_tokens;
        }
        usage.completion_tokens += c.usage.completion_tokens;
        spec.verify_steps += c.usage.spec_steps;
        spec.draft_tokens += c.usage.draft_tokens;
        spec.accepted_tokens += c.usage.accepted_tokens;
        let details = &mut usage.completion_tokens_details;
        details.accepted_prediction_tokens += c.usage.accepted_prediction_tokens();
        details.rejected_prediction_tokens += c.usage.rejected_prediction_tokens();
        details.reasoning_tokens += c.reasoning_tokens;
        for source in &c.usage.sources {
            let totals = spec.sources.entry(source.method.as_str()).or_default();
            totals.verify_steps += source.steps;
            totals.draft_tokens += source.drafted;
            totals.accepted_tokens += source.accepted;
        }
    }
    usage.total_tokens = usage.prompt_tokens + usage.completion_tokens;
    // Every step yields one token plus the accepted drafts.
    let steps = usage.completion_tokens.saturating_sub(spec.accepted_tokens);
    spec.mean_accepted_tokens = if steps == 0 {
        0.0
    } else {
        usage.completion_tokens as f64 / steps as f64
    };
    (usage, ThicketBody { speculation: spec })
}

/// Text of one token (as the model would print it alone).
pub(crate) fn token_text(tokenizer: &ModelTokenizer, id: u32) -> String {
    tokenizer.decode(&[id]).unwrap_or_default()
}

/// Usage and speculation totals of one answer read as parts, in the chat-completions shape
/// (the Responses and Messages APIs rename its fields).
pub fn ending_totals(ending: &Ending) -> (UsageBody, ThicketBody) {
    let choice = ChoiceState {
        usage: ending.usage.clone(),
        reasoning_tokens: ending.reasoning_tokens,
        ..ChoiceState::default()
    };
    totals(&[choice], 1)
}

/// One stream chunk for choice `index`: new `text` (and its tokens' log-probabilities), the
/// chat role on a choice's first chunk, and the finish reason on its last.
pub struct ChunkParts<'a> {
    /// The choice.
    pub index: usize,
    /// New text.
    pub text: String,
    /// Log-probabilities of the new tokens, when asked for.
    pub logprobs: Option<&'a [TokenLogprob]>,
    /// Characters of this choice already sent (completions' text offsets).
    pub offset: usize,
    /// Send the assistant role (a chat choice's first chunk).
    pub role: bool,
    /// Set on the choice's last chunk.
    pub finish: Option<&'a FinishReason>,
    /// Tool-call pieces (chat).
    pub tool_calls: Option<Vec<ToolCallDelta>>,
    /// The choice called tools: a `stop` finish is reported as `tool_calls`.
    pub called: bool,
    /// New thinking text (chat with a reasoning parser).
    pub reasoning: Option<String>,
}

/// A tool call's piece of a streamed delta: the first names the call, later ones add
/// argument text.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ToolCallDelta {
    /// Which call of the choice (0, 1, ...).
    pub index: usize,
    /// The call's id (first piece).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `function` (first piece).
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    /// Name (first piece) and argument text.
    pub function: FunctionDelta,
}

/// The function part of a [`ToolCallDelta`].
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct FunctionDelta {
    /// Function name (first piece).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// More argument text.
    pub arguments: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn choice(prompt: usize, completion: usize, accepted: usize) -> ChoiceState {
        ChoiceState {
            usage: Usage {
                prompt_tokens: prompt,
                completion_tokens: completion,
                accepted_tokens: accepted,
                ..Usage::default()
            },
            ..ChoiceState::default()
        }
    }

    #[test]
    fn usage_counts_each_prompt_once_and_every_completion() {
        // Two prompts (5 and 7 tokens), two choices each.
        let choices = [
            choice(5, 4, 0),
            choice(5, 6, 3),
            choice(7, 2, 0),
            choice(7, 8, 0),
        ];
        let (usage, thicket) = totals(&choices, 2);
        assert_eq!(usage.prompt_tokens, 12);
        assert_eq!(usage.completion_tokens, 20);
        assert_eq!(usage.total_tokens, 32);
        // 20 tokens in 17 steps.
        assert!((thicket.speculation.mean_accepted_tokens - 20.0 / 17.0).abs() < 1e-9);
    }

    #[test]
    fn stop_reasons_are_reported() {
        let s = FinishReason::StopString("END".into());
        assert_eq!(finish_fields(Some(&s)), (Some("stop"), Some("END".into())));
        assert_eq!(
            finish_fields(Some(&FinishReason::Length)),
            (Some("length"), None)
        );
        assert_eq!(finish_fields(None), (None, None));
    }
}
