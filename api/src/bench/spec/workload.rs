//! The questions `thicket bench spec` measures, read from a JSON-lines file in one of four
//! shapes, so that one bench times chat, tool calling, batch-like documents and code alike:
//! - Spec-Bench (`question_id`, `category`, `turns`): the first turn as a user message in the
//!   chat template, submitted as tokens;
//! - an agent with one fixed tool set (`id`, `classes`, `turns`; BFCL's multi-turn entries as
//!   `benches/bfcl_requests.py` writes them): every turn is its own chat completion with the
//!   union of the classes' tools from `--tool-sets`, so the tool list is a prefix the turns
//!   share;
//! - a chat completion (`messages`, optional `tools`, `tool_choice`; BFCL's live questions);
//! - a completion (`prompt`; HumanEval's first 100 problems).
//!
//! Bodies go through the server's own request path (`start_chat` / `start_completion`):
//! the same template, tool grammar and validation as `/v1/chat/completions`, greedy, with
//! `--tool-choice` where a line offers tools and names no choice. A line's category is its
//! `category`, else its classes joined by `+`, else its id without the last `_` part.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context};
use engine::LoadedModel;
use serde_json::{json, Value};

use crate::chat::user_prompt;
use crate::server::body::generation_body;
use crate::server::openai::body::Endpoint;
use crate::server::openai::completions::request::CompletionRequest;
use crate::server::openai::completions::start_completion;
use crate::server::pipeline::start_chat;
use crate::server::request::ChatRequest;
use crate::server::AppState;

/// What one question submits.
#[derive(Debug, Clone)]
pub(crate) enum Work {
    /// A prompt already rendered and tokenized.
    Tokens(Vec<u32>),
    /// A request body for one endpoint, without the bench's own fields.
    Body(Endpoint, Value),
}

/// One measured (or warm-up) request.
#[derive(Debug, Clone)]
pub(crate) struct Question {
    pub id: Value,
    pub category: String,
    pub work: Work,
}

/// How the lines of a file are chosen and turned into questions.
pub(crate) struct Selection<'a> {
    /// At most this many lines of each category.
    pub per_category: Option<usize>,
    /// Only lines of these categories (none: all).
    pub categories: &'a [String],
    /// Keep each category's lines whose index modulo `.0` is `.1` (`(1, 0)`: all).
    pub split: (usize, usize),
    /// `tool_choice` for lines that offer tools and give none.
    pub tool_choice: &'a str,
    /// Where the tool sets of lines with `classes` are.
    pub tool_sets: &'a Path,
}

/// The questions of `path` under `selection`.
pub(crate) fn load_questions(
    path: &Path,
    selection: &Selection,
    loaded: &LoadedModel,
) -> anyhow::Result<Vec<Question>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let (every, keep) = selection.split;
    let mut tool_sets: Option<BTreeMap<String, Vec<Value>>> = None;
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut taken: BTreeMap<String, usize> = BTreeMap::new();
    let mut questions = Vec::new();
    for (n, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let at = || format!("{} line {}", path.display(), n + 1);
        let value: Value = serde_json::from_str(line).with_context(at)?;
        let category = category(&value);
        if !selection.categories.is_empty() && !selection.categories.contains(&category) {
            continue;
        }
        let nth = seen.entry(category.clone()).or_default();
        *nth += 1;
        if (*nth - 1) % every != keep {
            continue;
        }
        let count = taken.entry(category.clone()).or_default();
        if selection.per_category.is_some_and(|limit| *count >= limit) {
            continue;
        }
        *count += 1;
        let id = value
            .get("question_id")
            .or_else(|| value.get("id"))
            .cloned()
            .unwrap_or_else(|| json!(n + 1));
        let works = if value.get("classes").is_some() {
            if tool_sets.is_none() {
                tool_sets = Some(read_tool_sets(selection.tool_sets)?);
            }
            let sets = tool_sets.as_ref().context("tool sets")?;
            agent_turns(&value, sets, selection.tool_choice).with_context(at)?
        } else if let Some(turns) = value.get("turns") {
            let Some(turn) = turns.get(0).and_then(Value::as_str) else {
                bail!("{}: no turns", at());
            };
            let prompt = loaded
                .tokenizer
                .encode(&user_prompt(&loaded.tokenizer, turn)?)?;
            vec![Work::Tokens(prompt)]
        } else if value.get("messages").is_some() {
            vec![chat_body(&value, selection.tool_choice)]
        } else if let Some(prompt) = value.get("prompt") {
            vec![Work::Body(
                Endpoint::Completion,
                json!({ "prompt": prompt }),
            )]
        } else {
            bail!("{}: neither turns, messages nor a prompt", at());
        };
        let many = works.len() > 1;
        questions.extend(works.into_iter().enumerate().map(|(turn, work)| Question {
            id: if many {
                json!(format!(
                    "{}#{turn}",
                    id.as_str().map_or(id.to_string(), str::to_string)
                ))
            } else {
                id.clone()
            },
            category: category.clone(),
            work,
        }));
    }
    if questions.is_empty() {
        bail!("{} holds no question", path.display());
    }
    Ok(questions)
}

/// A line's category (see the module's header).
fn category(value: &Value) -> String {
    if let Some(c) = value.get("category").and_then(Value::as_str) {
        return c.to_string();
    }
    if let Some(classes) = value.get("classes").and_then(Value::as_array) {
        let names: Vec<&str> = classes.iter().filter_map(Value::as_str).collect();
        return names.join("+");
    }
    match value.get("id").and_then(Value::as_str) {
        Some(id) => id.rsplit_once('_').map_or(id, |(head, _)| head).to_string(),
        None => "uncategorized".to_string(),
    }
}

/// The tool sets file: class name to its OpenAI function tools.
fn read_tool_sets(path: &Path) -> anyhow::Result<BTreeMap<String, Vec<Value>>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text)
        .with_context(|| format!("{}: not a map of tool lists", path.display()))
}

/// Every user turn of an agent line, each one request with the union of its classes' tools.
fn agent_turns(
    value: &Value,
    sets: &BTreeMap<String, Vec<Value>>,
    tool_choice: &str,
) -> anyhow::Result<Vec<Work>> {
    let mut tools = Vec::new();
    for class in value["classes"]
        .as_array()
        .context("classes is not a list")?
    {
        let name = class.as_str().context("a class is not a string")?;
        let set = sets
            .get(name)
            .with_context(|| format!("no tool set for class {name}"))?;
        tools.extend(set.iter().cloned());
    }
    let turns = value["turns"].as_array().context("turns is not a list")?;
    if turns.is_empty() {
        bail!("no turns");
    }
    turns
        .iter()
        .map(|turn| {
            let text = turn.as_str().context("a turn is not a string")?;
            Ok(Work::Body(
                Endpoint::Chat,
                json!({
                    "messages": [{"role": "user", "content": text}],
                    "tools": tools,
                    "tool_choice": tool_choice,
                }),
            ))
        })
        .collect()
}

/// A chat line's body: its `messages`, `tools` and `tool_choice` (`tool_choice` where it
/// offers tools and names none).
fn chat_body(value: &Value, tool_choice: &str) -> Work {
    let mut body = json!({ "messages": value["messages"] });
    if let Some(tools) = value.get("tools") {
        body["tools"] = tools.clone();
        body["tool_choice"] = value
            .get("tool_choice")
            .cloned()
            .unwrap_or_else(|| json!(tool_choice));
    }
    Work::Body(Endpoint::Chat, body)
}

/// Submits `work` to the engine behind `state`, greedy, drafting with `method`, and returns
/// its stream.
pub(crate) fn submit(
    state: &AppState,
    work: &Work,
    max_tokens: usize,
    method: engine::SpecMethod,
) -> anyhow::Result<engine::RequestStream> {
    let (endpoint, body) = match work {
        Work::Tokens(prompt) => {
            let request = engine::Request::greedy(prompt.clone(), max_tokens, Some(method));
            let engine = state.engine().map_err(|e| anyhow::anyhow!(e.message))?;
            return Ok(engine.submit(request)?);
        }
        Work::Body(endpoint, body) => (endpoint, body),
    };
    let mut body = body.clone();
    body["max_tokens"] = json!(max_tokens);
    body["temperature"] = json!(0.0);
    body["speculation"] = json!({ "method": method.as_str() });
    let started = match endpoint {
        Endpoint::Chat => generation_body::<ChatRequest>(&body).and_then(|b| start_chat(state, b)),
        Endpoint::Completion => {
            generation_body::<CompletionRequest>(&body).and_then(|b| start_completion(state, b))
        }
    }
    .map_err(|e| anyhow::anyhow!("{} ({})", e.message, e.status))?;
    started
        .into_streams()
        .into_iter()
        .next()
        .context("the request started no stream")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn categories_come_from_the_field_the_classes_or_the_id() {
        assert_eq!(category(&json!({"category": "qa", "id": "x_1"})), "qa");
        assert_eq!(
            category(&json!({"classes": ["TradingBot", "MathAPI"], "id": "m_1"})),
            "TradingBot+MathAPI"
        );
        assert_eq!(category(&json!({"id": "live_simple_0-0-0"})), "live_simple");
        assert_eq!(category(&json!({"prompt": "x"})), "uncategorized");
    }

    #[test]
    fn agent_turns_share_one_tool_list_and_the_choice() {
        let sets: BTreeMap<String, Vec<Value>> = [
            (
                "A".to_string(),
                vec![json!({"type": "function", "function": {"name": "a"}})],
            ),
            (
                "B".to_string(),
                vec![json!({"type": "function", "function": {"name": "b"}})],
            ),
        ]
        .into();
        let line = json!({"id": "e", "classes": ["A", "B"], "turns": ["one", "two"]});
        let works = agent_turns(&line, &sets, "required").expect("turns");
        assert_eq!(works.len(), 2);
        let bodies: Vec<&Value> = works
            .iter()
            .map(|w| match w {
                Work::Body(Endpoint::Chat, body) => body,
                other => panic!("not a chat body: {other:?}"),
            })
            .collect();
        assert_eq!(bodies[0]["tools"], bodies[1]["tools"]);
        assert_eq!(bodies[0]["tools"].as_array().map(Vec::len), Some(2));
        assert_eq!(bodies[1]["messages"][0]["content"], "two");
        assert_eq!(bodies[0]["tool_choice"], "required");
        let unknown = json!({"classes": ["C"], "turns": ["x"]});
        assert!(agent_turns(&unknown, &sets, "auto").is_err());
    }

    #[test]
    fn chat_lines_keep_their_own_choice() {
        let offered = json!({"messages": [], "tools": [], "tool_choice": "auto"});
        let Work::Body(_, body) = chat_body(&offered, "required") else {
            panic!("a body")
        };
        assert_eq!(body["tool_choice"], "auto");
        let Work::Body(_, body) = chat_body(&json!({"messages": [], "tools": []}), "required")
        else {
            panic!("a body")
        };
        assert_eq!(body["tool_choice"], "required");
        let Work::Body(_, body) = chat_body(&json!({"messages": []}), "required") else {
            panic!("a body")
        };
        assert!(body.get("tool_choice").is_none());
    }
}
