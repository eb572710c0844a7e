//! What the front ends that speak another API through the shared path share (the Responses
//! API, Anthropic's Messages API), as they turn their requests into its typed one: reading
//! a request's text parts ([`text_of`]), required string fields ([`string_field`]) and tools
//! ([`chat_tools`]) and template variables ([`template_kwargs`]); starting the chat request off the runtime ([`start_answer`],
//! [`count_tokens`]) with its errors' fields renamed as the API names them ([`renamed`]);
//! fresh ids ([`new_id`]); the answer (read as parts by `server::answer`) written as the API's
//! server-sent events ([`events`]).

pub mod events;

use serde::de::DeserializeOwned;
use serde_json::{json, Map, Value};

use super::answer::Answer;
use super::error::{ApiError, ApiResult};
use super::pipeline::{count_chat_tokens, off_runtime, start_chat};
use super::request::ChatRequest;
use super::AppState;

/// The typed request's `chat_template_kwargs`: the request's own (`given`, passed on as it is
/// when it is not an object, for the chat path to refuse), with `implied` variables (from the
/// API's own fields, e.g. a thinking switch) added where the request does not set them.
pub fn template_kwargs(given: Option<&Value>, implied: Vec<(&str, Value)>) -> Option<Value> {
    let given = given.filter(|g| !g.is_null());
    if implied.is_empty() {
        return given.cloned();
    }
    let mut kwargs = match given {
        Some(Value::Object(map)) => map.clone(),
        Some(other) => return Some(other.clone()),
        None => Map::new(),
    };
    for (key, value) in implied {
        kwargs.entry(key.to_string()).or_insert(value);
    }
    Some(Value::Object(kwargs))
}

/// How an API's content holds text: a string, or a list of typed parts.
pub struct TextParts {
    /// Part types whose `text` is taken.
    pub kinds: &'static [&'static str],
    /// Whether a `refusal` part counts, by its `refusal` text.
    pub refusal: bool,
    /// What the list is called in errors (`content must be a string or a list of ...`).
    pub list: &'static str,
    /// The error message for a part of an unsupported type.
    pub unsupported: fn(&str) -> String,
}

/// The text of `content` (a string, null, or a list of parts read as `parts` says); errors
/// name `param` or the part at fault.
pub fn text_of(content: &Value, param: &str, parts: &TextParts) -> ApiResult<String> {
    match content {
        Value::String(s) => Ok(s.clone()),
        Value::Null => Ok(String::new()),
        Value::Array(list) => {
            let mut text = String::new();
            for (j, part) in list.iter().enumerate() {
                let kind = part.get("type").and_then(Value::as_str).unwrap_or("");
                match (kind, part.get("text").and_then(Value::as_str)) {
                    (kind, Some(t)) if parts.kinds.contains(&kind) => text.push_str(t),
                    ("refusal", _) if parts.refusal => {
                        text.push_str(part.get("refusal").and_then(Value::as_str).unwrap_or(""))
                    }
                    _ => {
                        return Err(ApiError::invalid(
                            format!("{param}[{j}]"),
                            (parts.unsupported)(kind),
                        ))
                    }
                }
            }
            Ok(text)
        }
        _ => Err(ApiError::invalid(
            param,
            format!("content must be a string or a list of {}", parts.list),
        )),
    }
}

/// `value`'s string `field`; a 400 naming `{param}.{field}` (the message says `what` needs
/// it) when it is missing or not a string.
pub fn string_field<'a>(
    value: &'a Value,
    field: &str,
    param: &str,
    what: &str,
) -> ApiResult<&'a str> {
    value.get(field).and_then(Value::as_str).ok_or_else(|| {
        ApiError::invalid(
            format!("{param}.{field}"),
            format!("{what} needs a string `{field}`"),
        )
    })
}

/// A field given as JSON (`null` for none) read as a `T`; a 400 naming `field` when it is
/// not one.
pub fn typed<T: DeserializeOwned>(value: Option<&Value>, field: &str) -> ApiResult<Option<T>> {
    match value.filter(|v| !v.is_null()) {
        None => Ok(None),
        Some(v) => serde_json::from_value(v.clone())
            .map(Some)
            .map_err(|e| ApiError::invalid(field, format!("{field}: {e}"))),
    }
}

/// `tools` in the chat shape: each tool (with its index, for errors) read into the
/// `function` object of a chat function tool by `function_of`.
pub fn chat_tools(
    tools: &[Value],
    function_of: impl Fn(usize, &Value) -> ApiResult<Map<String, Value>>,
) -> ApiResult<Value> {
    let mut out = Vec::with_capacity(tools.len());
    for (i, tool) in tools.iter().enumerate() {
        out.push(json!({"type": "function", "function": function_of(i, tool)?}));
    }
    Ok(Value::Array(out))
}

/// How a field of the chat path is named in another API.
pub enum Rename {
    /// The field named exactly the first, as the second.
    Field(&'static str, &'static str),
    /// Every field whose path starts with the first, as the second.
    Under(&'static str, &'static str),
    /// In a `tools[..]` path holding the first, the first replaced by the second.
    InTools(&'static str, &'static str),
}

/// An error of the chat path with its field named as `names` say (the first that applies).
pub fn renamed(mut e: ApiError, names: &[Rename]) -> ApiError {
    let Some(param) = e.param.as_deref() else {
        return e;
    };
    let renamed = names.iter().find_map(|rename| match *rename {
        Rename::Field(from, to) if param == from => Some(to.to_string()),
        Rename::Under(from, to) if param.starts_with(from) => Some(to.to_string()),
        Rename::InTools(from, to) if param.starts_with("tools[") && param.contains(from) => {
            Some(param.replace(from, to))
        }
        _ => None,
    });
    if let Some(param) = renamed {
        e.param = Some(param);
    }
    e
}

/// A fresh id: `prefix`, `_` and `digits` random hex digits (at most 32).
pub fn new_id(prefix: &str, digits: usize) -> String {
    let bits = rand::random::<u128>() >> (128 - 4 * digits.clamp(1, 32));
    format!("{prefix}_{bits:0digits$x}")
}

/// Starts `chat` down the shared path, off the runtime (its errors' fields renamed by
/// `names`), and returns its one answer.
pub async fn start_answer(
    state: &AppState,
    chat: ChatRequest,
    names: &'static [Rename],
) -> ApiResult<Answer> {
    let started = off_runtime(state.clone(), move |state| start_chat(state, chat))
        .await
        .map_err(|e| renamed(e, names))?;
    started.into_answer()
}

/// The prompt tokens of `chat` (its errors' fields renamed by `names`), counted off the
/// runtime without submitting it.
pub async fn count_tokens(
    state: AppState,
    chat: ChatRequest,
    names: &'static [Rename],
) -> ApiResult<usize> {
    off_runtime(state, move |state| count_chat_tokens(state, &chat))
        .await
        .map_err(|e| renamed(e, names))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn implied_template_variables_give_way_to_the_requests_own() {
        let implied = || vec![("enable_thinking", json!(false)), ("x", json!(1))];
        let given = json!({"enable_thinking": true});
        assert_eq!(
            template_kwargs(Some(&given), implied()),
            Some(json!({"enable_thinking": true, "x": 1}))
        );
        assert_eq!(
            template_kwargs(None, implied()),
            Some(json!({"enable_thinking": false, "x": 1}))
        );
        assert_eq!(template_kwargs(Some(&json!(3)), implied()), Some(json!(3)));
        assert_eq!(template_kwargs(Some(&given), vec![]), Some(given.clone()));
        assert_eq!(template_kwargs(Some(&Value::Null), vec![]), None);
    }

    #[test]
    fn typed_fields_are_read_or_refused_by_their_own_name() {
        assert_eq!(
            typed::<f32>(Some(&json!(0.5)), "temperature").ok(),
            Some(Some(0.5))
        );
        assert_eq!(
            typed::<f32>(Some(&Value::Null), "temperature").ok(),
            Some(None)
        );
        assert_eq!(typed::<f32>(None, "temperature").ok(), Some(None));
        let e = typed::<f32>(Some(&json!("hot")), "top_p").expect_err("refused");
        assert_eq!(e.param.as_deref(), Some("top_p"));
        assert!(
            e.message.starts_with("top_p: invalid type"),
            "{}",
            e.message
        );
    }

    #[test]
    fn ids_have_their_prefix_and_digits() {
        for digits in [24, 32] {
            let id = new_id("msg", digits);
            let hex = id.strip_prefix("msg_").expect("the prefix");
            assert_eq!(hex.len(), digits, "{id}");
            assert!(hex.chars().all(|c| c.is_ascii_hexdigit()), "{id}");
        }
    }

    #[test]
    fn the_first_rename_that_applies_wins() {
        let names = [
            Rename::Field("stop", "stop_sequences"),
            Rename::Under("messages", "input"),
            Rename::InTools(".function.parameters", ".input_schema"),
            Rename::InTools(".function", ""),
        ];
        let param = |p: &str| renamed(ApiError::invalid(p, "bad"), &names).param;
        assert_eq!(param("stop").as_deref(), Some("stop_sequences"));
        assert_eq!(param("messages[2].content").as_deref(), Some("input"));
        assert_eq!(
            param("tools[1].function.parameters").as_deref(),
            Some("tools[1].input_schema")
        );
        assert_eq!(
            param("tools[0].function.name").as_deref(),
            Some("tools[0].name")
        );
        assert_eq!(param("n").as_deref(), Some("n"));
    }

    #[test]
    fn text_comes_from_the_part_kinds_given() {
        let parts = TextParts {
            kinds: &["text"],
            refusal: false,
            list: "blocks",
            unsupported: |kind| format!("no {kind}"),
        };
        let content = json!([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]);
        assert_eq!(text_of(&content, "c", &parts).ok().as_deref(), Some("ab"));
        assert_eq!(text_of(&Value::Null, "c", &parts).ok().as_deref(), Some(""));
        let image = json!([{"type": "text", "text": "a"}, {"type": "image"}]);
        let e = text_of(&image, "c", &parts).expect_err("refused");
        assert_eq!(e.param.as_deref(), Some("c[1]"));
        assert_eq!(e.message, "no image");
        let e = text_of(&json!(3), "c", &parts).expect_err("refused");
        assert_eq!(e.message, "content must be a string or a list of blocks");
        let refusal = json!([{"type": "refusal", "refusal": "no"}]);
        assert!(text_of(&refusal, "c", &parts).is_err());
        let with_refusals = TextParts {
            refusal: true,
            ..parts
        };
        assert_eq!(
            text_of(&refusal, "c", &with_refusals).ok().as_deref(),
            Some("no")
        );
    }
}
