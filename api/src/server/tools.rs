//! Tool calling on `/v1/chat/completions`: the `tools` and `tool_choice` fields checked and
//! turned into what the template renders and, for `required` or a named function, a grammar
//! that makes the answer one or more `<tool_call>` blocks whose JSON is a call of an offered
//! function with arguments valid against its parameter schema; and the model's answer parsed
//! back into `tool_calls` (whole, or as stream deltas while it is generated).

use engine::constraint::{compact, ConstraintSpec};
use serde_json::{json, Value};

use super::error::{ApiError, ApiResult};
use super::openai::chat::response::{FunctionCallOut, ToolCallOut};
use crate::chat::{TOOL_CALL_CLOSE, TOOL_CALL_OPEN};

/// What `tool_choice` asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// Never call a tool: the tools are not shown and the answer is text.
    None,
    /// The model decides.
    Auto,
    /// At least one call, of any offered function.
    Required,
    /// A call of this function.
    Named(String),
}

/// One offered function.
#[derive(Debug, Clone)]
pub struct Tool {
    /// Its name.
    pub name: String,
    /// JSON schema of its arguments.
    pub parameters: Value,
    /// The tool object as given (what the template shows).
    pub declaration: Value,
}

/// A request's tools and how they may be used.
#[derive(Debug, Clone)]
pub struct ToolRequest {
    /// The offered functions.
    pub tools: Vec<Tool>,
    /// `tool_choice`.
    pub choice: ToolChoice,
    /// Whether one answer may hold several calls.
    pub parallel: bool,
}

/// Names OpenAI accepts for functions.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

impl ToolRequest {
    /// Checks `tools` and `tool_choice`; `None` when no tools are offered.
    pub fn parse(
        tools: Option<&Value>,
        choice: Option<&Value>,
        parallel: Option<bool>,
    ) -> ApiResult<Option<Self>> {
        let listed = match tools {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(list)) => list.clone(),
            Some(_) => return Err(ApiError::invalid("tools", "tools must be an array")),
        };
        let mut parsed: Vec<Tool> = Vec::with_capacity(listed.len());
        for (i, tool) in listed.into_iter().enumerate() {
            let field = format!("tools[{i}]");
            if tool.get("type").and_then(Value::as_str) != Some("function") {
                return Err(ApiError::invalid(
                    format!("{field}.type"),
                    "only tools of type \"function\" are supported",
                ));
            }
            let function = tool
                .get("function")
                .filter(|f| f.is_object())
                .ok_or_else(|| {
                    ApiError::invalid(format!("{field}.function"), "function must be an object")
                })?;
            let name = function.get("name").and_then(Value::as_str).unwrap_or("");
            if !valid_name(name) {
                return Err(ApiError::invalid(
                    format!("{field}.function.name"),
                    format!("invalid function name {name:?}: use 1 to 64 letters, digits, _ or -"),
                ));
            }
            if parsed.iter().any(|t| t.name == name) {
                return Err(ApiError::invalid(
                    format!("{field}.function.name"),
                    format!("two tools are named {name:?}"),
                ));
            }
            let parameters = match function.get("parameters") {
                None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
                Some(p @ Value::Object(_)) => p.clone(),
                Some(_) => {
                    return Err(ApiError::invalid(
                        format!("{field}.function.parameters"),
                        "parameters must be a JSON schema object",
                    ))
                }
            };
            parsed.push(Tool {
                name: name.to_string(),
                parameters,
                declaration: tool.clone(),
            });
        }
        let choice = match choice {
            None | Some(Value::Null) => ToolChoice::Auto,
            Some(Value::String(s)) => match s.as_str() {
                "none" => ToolChoice::None,
                "auto" => ToolChoice::Auto,
                "required" => ToolChoice::Required,
                other => {
                    return Err(ApiError::invalid(
                        "tool_choice",
                        format!(
                            "unknown tool_choice {other:?}: use none, auto, required or a function"
                        ),
                    ))
                }
            },
            Some(v) => {
                let name = (v.get("type").and_then(Value::as_str) == Some("function"))
                    .then(|| v.pointer("/function/name").and_then(Value::as_str))
                    .flatten()
                    .ok_or_else(|| {
                        ApiError::invalid(
                            "tool_choice",
                            "a named tool_choice is {\"type\": \"function\", \"function\": {\"name\": ...}}",
                        )
                    })?;
                if !parsed.iter().any(|t| t.name == name) {
                    return Err(ApiError::invalid(
                        "tool_choice",
                        format!("tool_choice names {name:?}, which is not among the tools"),
                    ));
                }
                ToolChoice::Named(name.to_string())
            }
        };
        if parsed.is_empty() {
            return match choice {
                ToolChoice::None | ToolChoice::Auto => Ok(None),
                _ => Err(ApiError::invalid(
                    "tool_choice",
                    "tool_choice required or a function needs tools",
                )),
            };
        }
        Ok(Some(Self {
            tools: parsed,
            choice,
            parallel: parallel.unwrap_or(true),
        }))
    }

    /// The offered functions' names.
    pub fn names(&self) -> Vec<String> {
        self.tools.iter().map(|t| t.name.clone()).collect()
    }

    /// The tool objects the template shows (none under `tool_choice: none`).
    pub fn shown(&self) -> Vec<Value> {
        if self.choice == ToolChoice::None {
            return Vec::new();
        }
        self.tools.iter().map(|t| t.declaration.clone()).collect()
    }

    /// Whether the answer is read for tool calls.
    pub fn parses_calls(&self) -> bool {
        self.choice != ToolChoice::None
    }

    /// For `required` or a named function: a grammar whose sentences are one call (several
    /// under `parallel_tool_calls`) of an allowed function, arguments valid against its
    /// schema.
    pub fn constraint(&self) -> Option<ConstraintSpec> {
        let allowed: Vec<&Tool> = match &self.choice {
            ToolChoice::None | ToolChoice::Auto => return None,
            ToolChoice::Required => self.tools.iter().collect(),
            ToolChoice::Named(name) => self.tools.iter().filter(|t| &t.name == name).collect(),
        };
        let calls: Vec<Value> = allowed
            .iter()
            .map(|t| {
                json!({
                    "type": "object",
                    "properties": {"name": {"const": t.name}, "arguments": t.parameters},
                    "required": ["name", "arguments"],
                    "additionalProperties": false,
                })
            })
            .collect();
        let call = match <[Value; 1]>::try_from(calls) {
            Ok([one]) => one,
            Err(many) => json!({"anyOf": many}),
        };
        // A named function is called once; `required` may call several unless told not to.
        let several = self.parallel && self.choice == ToolChoice::Required;
        let repeat = if several { " (\"\\n\" call)*" } else { "" };
        Some(ConstraintSpec::Lark(format!(
            "start: call{repeat}\ncall: {open} \"\\n\" body \"\\n\" {close}\nbody: %json {schema}\n",
            open = lark_string(TOOL_CALL_OPEN),
            close = lark_string(TOOL_CALL_CLOSE),
            schema = compact(call),
        )))
    }
}

/// `text` as a Lark string literal.
fn lark_string(text: &str) -> String {
    Value::String(text.to_string()).to_string()
}

/// One parsed call: `{"name": ..., "arguments": {...}}` (or `parameters`, which some models
/// write).
fn parse_call(body: &str) -> Option<(String, String)> {
    let value: Value = serde_json::from_str(body.trim()).ok()?;
    let name = value.get("name")?.as_str()?.to_string();
    let arguments = value
        .get("arguments")
        .or_else(|| value.get("parameters"))
        .cloned()
        .unwrap_or_else(|| json!({}));
    let arguments = match arguments {
        // Some models write the arguments as a JSON string already.
        Value::String(s) if serde_json::from_str::<Value>(&s).is_ok_and(|v| v.is_object()) => s,
        other => other.to_string(),
    };
    Some((name, arguments))
}

/// A fresh call id.
pub fn call_id() -> String {
    format!("call_{:024x}", rand::random::<u128>() >> 32)
}

fn call_out((name, arguments): (String, String)) -> ToolCallOut {
    ToolCallOut {
        id: call_id(),
        kind: "function",
        function: FunctionCallOut { name, arguments },
    }
}

/// `text` read for tool calls: the text before the first `<tool_call>` (if any is left) and
/// the calls, or `None` when it holds no well-formed call (then it is all content). A last
/// block cut off before `</tool_call>` counts if its JSON is whole and is dropped if not
/// (the answer ran out of tokens). An answer that is only `{"name": ..., "arguments": ...}`
/// naming one of `offered` is a call too: small models often leave out the tags.
pub fn parse_calls(text: &str, offered: &[String]) -> Option<(Option<String>, Vec<ToolCallOut>)> {
    let Some(start) = text.find(TOOL_CALL_OPEN) else {
        return bare_call(text, offered).map(|call| (None, vec![call_out(call)]));
    };
    let mut calls = Vec::new();
    let mut rest = &text[start..];
    while let Some(open) = rest.find(TOOL_CALL_OPEN) {
        let body_start = open + TOOL_CALL_OPEN.len();
        let (body, next, closed) = match rest[body_start..].find(TOOL_CALL_CLOSE) {
            Some(end) => (
                &rest[body_start..body_start + end],
                &rest[body_start + end + TOOL_CALL_CLOSE.len()..],
                true,
            ),
            None => (&rest[body_start..], "", false),
        };
        match parse_call(body) {
            Some(call) => calls.push(call_out(call)),
            None if !closed => {
                // Cut off by the token limit: what it holds of a call, as OpenAI returns a
                // call whose arguments ran out of tokens.
                if let Some(call) = partial_call(body, offered) {
                    calls.push(call_out(call));
                }
                if calls.is_empty() {
                    return None;
                }
                break;
            }
            None => return None,
        }
        rest = next;
    }
    let content = text[..start].trim();
    Some(((!content.is_empty()).then(|| content.to_string()), calls))
}

/// A call cut off inside its arguments (`{"name": "f", "arguments": {"a": "...`): the name,
/// if it is one of `offered`, and the arguments as far as they go.
fn partial_call(body: &str, offered: &[String]) -> Option<(String, String)> {
    let rest = body.trim_start().strip_prefix('{')?.trim_start();
    let rest = rest
        .strip_prefix("\"name\"")?
        .trim_start()
        .strip_prefix(':')?;
    let rest = rest.trim_start().strip_prefix('"')?;
    let (name, rest) = rest.split_once('"')?;
    let rest = rest.trim_start().strip_prefix(',')?.trim_start();
    let rest = rest
        .strip_prefix("\"arguments\"")?
        .trim_start()
        .strip_prefix(':')?;
    offered
        .iter()
        .any(|n| n == name)
        .then(|| (name.to_string(), rest.trim().to_string()))
}

/// `text` as one untagged call of an `offered` function.
fn bare_call(text: &str, offered: &[String]) -> Option<(String, String)> {
    let text = text.trim();
    if !text.starts_with('{') {
        return None;
    }
    let call = parse_call(text)?;
    offered.contains(&call.0).then_some(call)
}

/// What a streamed choice sends next while its text is read for calls.
#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    /// Plain text.
    Text(String),
    /// A whole call (sent as a delta naming it, then one with its arguments).
    Call(ToolCallOut),
}

/// Reads a streamed answer for tool calls: text passes through as it comes, except a tail
/// that may still become `<tool_call>`; a call is held until its `</tool_call>` and then
/// given whole. A block that does not parse goes out as text.
///
/// An answer whose first character is `{` is held to the end, where it may turn out to be an
/// untagged call (see [`parse_calls`]).
#[derive(Debug, Default)]
pub struct CallReader {
    held: String,
    in_call: bool,
    /// The answer so far is blank or started with `{`.
    maybe_bare: bool,
    offered: Vec<String>,
    /// Calls given so far.
    pub calls: usize,
}

impl CallReader {
    /// A reader for calls of the `offered` functions.
    pub fn new(offered: Vec<String>) -> Self {
        Self {
            offered,
            maybe_bare: true,
            ..Self::default()
        }
    }

    /// The pieces `text` completes.
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.held.push_str(text);
        if self.maybe_bare {
            match self.held.trim_start().chars().next() {
                None => return Vec::new(),
                Some('{') => return Vec::new(),
                Some(_) => self.maybe_bare = false,
            }
        }
        let mut out = Vec::new();
        loop {
            if self.in_call {
                let Some(end) = self.held.find(TOOL_CALL_CLOSE) else {
                    break;
                };
                let block: String = self.held.drain(..end + TOOL_CALL_CLOSE.len()).collect();
                out.push(self.block(block));
                self.in_call = false;
                continue;
            }
            match self.held.find(TOOL_CALL_OPEN) {
                Some(open) => {
                    let before: String = self.held.drain(..open).collect();
                    if !before.is_empty() {
                        out.push(Piece::Text(before));
                    }
                    self.in_call = true;
                }
                None => {
                    // Keep a tail that could be the start of the marker.
                    let keep = (1..TOOL_CALL_OPEN.len())
                        .rev()
                        .find(|&n| self.held.ends_with(&TOOL_CALL_OPEN[..n]))
                        .unwrap_or(0);
                    let cut = self.held.len() - keep;
                    if cut > 0 {
                        out.push(Piece::Text(self.held.drain(..cut).collect()));
                    }
                    break;
                }
            }
        }
        out
    }

    /// What is left once the answer ended: an unclosed call whose JSON is whole, or text.
    pub fn finish(&mut self) -> Vec<Piece> {
        let held = std::mem::take(&mut self.held);
        if held.is_empty() {
            return Vec::new();
        }
        if self.maybe_bare {
            self.maybe_bare = false;
            if let Some(call) = bare_call(&held, &self.offered) {
                self.calls += 1;
                return vec![Piece::Call(call_out(call))];
            }
            return vec![Piece::Text(held)];
        }
        if self.in_call {
            self.in_call = false;
            return vec![self.block(held)];
        }
        vec![Piece::Text(held)]
    }

    /// A `<tool_call>...` block (closed, or cut off at the end of the answer) read as
    /// [`parse_calls`] reads it: a call, or text if it holds none.
    fn block(&mut self, block: String) -> Piece {
        match parse_calls(&block, &self.offered).and_then(|(_, calls)| calls.into_iter().next()) {
            Some(call) => {
                self.calls += 1;
                Piece::Call(call)
            }
            None => Piece::Text(block),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> Value {
        json!({"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}})
    }

    fn refused(tools: Value, choice: Option<Value>) -> String {
        match ToolRequest::parse(Some(&tools), choice.as_ref(), None) {
            Err(e) => format!("{}: {}", e.param.unwrap_or_default(), e.message),
            Ok(_) => panic!("accepted {tools} with {choice:?}"),
        }
    }

    #[test]
    fn bad_tools_and_choices_are_refused_naming_the_field() {
        assert!(refused(json!({}), None).starts_with("tools:"));
        assert!(refused(json!([{"type": "retrieval"}]), None).starts_with("tools[0].type"));
        assert!(refused(json!([{"type": "function"}]), None).starts_with("tools[0].function"));
        let bad_name = json!([{"type": "function", "function": {"name": "a b"}}]);
        assert!(refused(bad_name, None).starts_with("tools[0].function.name"));
        let twice = json!([weather(), weather()]);
        assert!(refused(twice, None).contains("two tools are named"));
        let bad_params = json!([{"type": "function", "function": {"name": "f", "parameters": 3}}]);
        assert!(refused(bad_params, None).starts_with("tools[0].function.parameters"));
        assert!(refused(json!([weather()]), Some(json!("always"))).starts_with("tool_choice"));
        let other = json!({"type": "function", "function": {"name": "nope"}});
        assert!(refused(json!([weather()]), Some(other)).contains("not among the tools"));
        assert!(refused(json!([]), Some(json!("required"))).contains("needs tools"));
        // No tools and no demand for them: nothing to do.
        assert!(ToolRequest::parse(Some(&json!([])), None, None)
            .unwrap()
            .is_none());
    }

    #[test]
    fn only_required_and_named_choices_constrain_and_none_hides_the_tools() {
        let tools = json!([weather(), {"type": "function", "function": {"name": "now"}}]);
        let parse = |choice: Value| {
            ToolRequest::parse(Some(&tools), Some(&choice), Some(false))
                .unwrap()
                .unwrap()
        };
        assert!(parse(json!("auto")).constraint().is_none());
        let none = parse(json!("none"));
        assert!(none.constraint().is_none() && none.shown().is_empty() && !none.parses_calls());
        let Some(ConstraintSpec::Lark(named)) =
            parse(json!({"type": "function", "function": {"name": "now"}})).constraint()
        else {
            panic!("a named choice is a grammar");
        };
        assert!(named.contains(r#""const":"now""#) && !named.contains("get_weather"));
        assert!(!named.contains("call)*"), "parallel calls were turned off");
        let Some(ConstraintSpec::Lark(any)) = parse(json!("required")).constraint() else {
            panic!("required is a grammar");
        };
        assert!(any.contains("anyOf") && any.contains("get_weather") && any.contains("\"now\""));
    }

    #[test]
    fn calls_are_read_from_the_answer() {
        let text = "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
        let offered = ["get_weather".to_string(), "now".to_string()];
        let (content, calls) = parse_calls(text, &offered).unwrap();
        assert_eq!(content.as_deref(), Some("Let me look."));
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].function.name, "get_weather");
        assert_eq!(
            serde_json::from_str::<Value>(&calls[0].function.arguments).unwrap(),
            json!({"city": "Paris"})
        );
        assert_ne!(calls[0].id, calls[1].id);
        // Cut off after the JSON: still a call; broken JSON or no block: plain text.
        let cut = "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}";
        assert_eq!(parse_calls(cut, &offered).unwrap().1.len(), 1);
        assert!(parse_calls("<tool_call>\n{\"name\": \"now\", \"argu", &offered).is_none());
        // Cut off inside the arguments: the call, its arguments as far as they went.
        let short = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Pa";
        let (_, calls) = parse_calls(short, &offered).unwrap();
        assert_eq!(calls[0].function.name, "get_weather");
        assert_eq!(calls[0].function.arguments, "{\"city\": \"Pa");
        assert!(parse_calls(&short.replace("get_weather", "rm"), &offered).is_none());
        assert!(parse_calls("It is sunny.", &offered).is_none());
        // A whole call then one cut off by the token limit: the whole one.
        let ran_out = format!("{cut}\n</tool_call>\n<tool_call>\n{{\"name\": \"now\", \"arg");
        assert_eq!(parse_calls(&ran_out, &offered).unwrap().1.len(), 1);
        // Untagged: a call only if it names an offered function.
        let bare = " {\"name\": \"now\", \"arguments\": {}}";
        assert_eq!(
            parse_calls(bare, &offered).unwrap().1[0].function.name,
            "now"
        );
        assert!(parse_calls("{\"name\": \"rm\", \"arguments\": {}}", &offered).is_none());
    }

    #[test]
    fn a_streamed_answer_gives_the_same_calls_in_any_split() {
        let text = "Sure.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
        for step in [1, 2, 3, 7, 50, text.len()] {
            let mut reader = CallReader::new(Vec::new());
            let mut pieces = Vec::new();
            let chars: Vec<char> = text.chars().collect();
            for chunk in chars.chunks(step) {
                pieces.extend(reader.push(&chunk.iter().collect::<String>()));
            }
            pieces.extend(reader.finish());
            let texts: String = pieces
                .iter()
                .filter_map(|p| match p {
                    Piece::Text(t) => Some(t.as_str()),
                    Piece::Call(_) => None,
                })
                .collect();
            let names: Vec<&str> = pieces
                .iter()
                .filter_map(|p| match p {
                    Piece::Call(c) => Some(c.function.name.as_str()),
                    Piece::Text(_) => None,
                })
                .collect();
            assert_eq!(texts.trim(), "Sure.", "split every {step}");
            assert_eq!(names, ["get_weather", "now"], "split every {step}");
            assert_eq!(reader.calls, 2);
        }
        // Text that only looks like the start of a marker is given back in the end.
        let mut reader = CallReader::new(Vec::new());
        assert!(reader
            .push("a <tool")
            .iter()
            .all(|p| p == &Piece::Text("a ".into())));
        assert_eq!(reader.finish(), vec![Piece::Text("<tool".into())]);
        // An untagged call is held to the end; other JSON comes back as text.
        for (names, want_call) in [(vec!["now".to_string()], true), (Vec::new(), false)] {
            let mut reader = CallReader::new(names);
            assert!(reader.push(" {\"name\": \"now\",").is_empty());
            assert!(reader.push(" \"arguments\": {}}").is_empty());
            let end = reader.finish();
            assert_eq!(matches!(end[..], [Piece::Call(_)]), want_call, "{end:?}");
        }
    }
}
