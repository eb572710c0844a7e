//! Tool calling on `/v1/chat/completions` (and the APIs that go through it): the `tools` and
//! `tool_choice` fields checked and turned into what the template renders and, for
//! `required` or a named function, a grammar that makes the answer one or more calls of an
//! offered function with arguments valid against its parameter schema, written in the
//! model's tool-call format ([`format`]); and the model's answer read back into `tool_calls`
//! (whole, or as stream deltas while it is generated: [`reader`]).

pub mod call;
pub mod call_json;
pub mod format;
#[cfg(test)]
mod format_tests;
pub mod formats;
pub mod gemma4;
pub mod gemma4_grammar;
#[cfg(test)]
mod gemma4_tests;
pub mod hermes;
pub mod llama3;
pub mod mistral;
pub mod openai;
pub mod partial_json;
pub mod qwen3_coder;
pub mod reader;

use std::sync::Arc;

use engine::constraint::ConstraintSpec;
use serde_json::{json, Value};

use self::call::call_out;
pub use self::call::{call_id, FunctionCallOut, ParsedCall, ToolCallOut};
pub use self::format::ToolFormat;
pub use self::formats::{default_for_template, tool_format, TOOL_CALL_PARSERS};
pub use self::reader::{parse_calls, CallReader, Calls, Piece};
use super::error::{ApiError, ApiResult};

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

    /// For `required` or a named function: a grammar, in `format`'s syntax, whose sentences
    /// are one call (several under `parallel_tool_calls`) of an allowed function, arguments
    /// valid against its schema.
    pub fn constraint(
        &self,
        format: &dyn ToolFormat,
        markers: &format::Markers<'_>,
    ) -> Option<ConstraintSpec> {
        let allowed: Vec<&Tool> = match &self.choice {
            ToolChoice::None | ToolChoice::Auto => return None,
            ToolChoice::Required => self.tools.iter().collect(),
            ToolChoice::Named(name) => self.tools.iter().filter(|t| &t.name == name).collect(),
        };
        // A named function is called once; `required` may call several unless told not to.
        let several = self.parallel && self.choice == ToolChoice::Required;
        Some(ConstraintSpec::Lark(
            format.grammar(&allowed, several, markers),
        ))
    }

    /// How answers are read for calls of these tools in `format`.
    pub fn calls(&self, format: Arc<dyn ToolFormat>) -> Calls {
        let forced = matches!(self.choice, ToolChoice::Required | ToolChoice::Named(_));
        Calls::new(format, self.tools.clone()).forced(forced)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> Value {
        json!({"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}})
    }

    fn text() -> format::Markers<'static> {
        format::Markers::new(&format::as_text)
    }

    /// Hermes calls of functions named `names`.
    pub(super) fn calls(names: &[&str]) -> Calls {
        let tools = names
            .iter()
            .map(|n| Tool {
                name: n.to_string(),
                parameters: json!({"type": "object"}),
                declaration: json!({}),
            })
            .collect();
        Calls::new(Arc::new(hermes::Hermes), tools)
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
        assert!(parse(json!("auto"))
            .constraint(&hermes::Hermes, &text())
            .is_none());
        let none = parse(json!("none"));
        assert!(
            none.constraint(&hermes::Hermes, &text()).is_none()
                && none.shown().is_empty()
                && !none.parses_calls()
        );
        let Some(ConstraintSpec::Lark(named)) =
            parse(json!({"type": "function", "function": {"name": "now"}}))
                .constraint(&hermes::Hermes, &text())
        else {
            panic!("a named choice is a grammar");
        };
        assert!(named.contains(r#""const":"now""#) && !named.contains("get_weather"));
        assert!(!named.contains("call)*"), "parallel calls were turned off");
        let Some(ConstraintSpec::Lark(any)) =
            parse(json!("required")).constraint(&hermes::Hermes, &text())
        else {
            panic!("required is a grammar");
        };
        assert!(any.contains("anyOf") && any.contains("get_weather") && any.contains("\"now\""));
    }

    #[test]
    fn calls_are_read_from_the_answer() {
        let text = "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
        let offered = calls(&["get_weather", "now"]);
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
        assert_eq!(calls[0].function.arguments, "{\"city\":\"Pa");
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
            let mut reader = CallReader::new(calls(&[]));
            let mut pieces = Vec::new();
            let chars: Vec<char> = text.chars().collect();
            for chunk in chars.chunks(step) {
                pieces.extend(reader.push(&chunk.iter().collect::<String>()));
            }
            pieces.extend(reader.finish());
            let texts = super::format_tests::text_of(&pieces);
            let names: Vec<&str> = pieces
                .iter()
                .filter_map(|p| match p {
                    Piece::Call { call, .. } | Piece::CallEnd { call, .. } => {
                        Some(call.function.name.as_str())
                    }
                    _ => None,
                })
                .collect();
            assert_eq!(texts.trim(), "Sure.", "split every {step}");
            assert_eq!(names, ["get_weather", "now"], "split every {step}");
            assert_eq!(reader.calls, 2);
        }
        // Text that only looks like the start of a marker is given back in the end.
        let mut reader = CallReader::new(calls(&[]));
        assert!(reader
            .push("a <tool")
            .iter()
            .all(|p| p == &Piece::Text("a ".into())));
        assert_eq!(reader.finish(), vec![Piece::Text("<tool".into())]);
        // An untagged call is held to the end; other JSON comes back as text.
        for (names, want_call) in [(vec!["now"], true), (Vec::new(), false)] {
            let mut reader = CallReader::new(calls(&names));
            assert!(reader.push(" {\"name\": \"now\",").is_empty());
            assert!(reader.push(" \"arguments\": {}}").is_empty());
            let end = reader.finish();
            assert_eq!(
                matches!(end[..], [Piece::Call { .. }]),
                want_call,
                "{end:?}"
            );
        }
    }
}
