//! The Lark grammar of Gemma 4's calls (`tool_choice: required` or a named function): each
//! `<|tool_call>call:NAME{...}<tool_call|>`, the name one of the allowed functions', the
//! arguments valid against its parameter schema written in Gemma 4's value syntax, as its
//! chat template writes earlier calls: no blanks, keys unquoted and in the template's order
//! (sorted, ignoring case), strings between `<|"|>` quotes (the model's own token where it is
//! a special one). From the schema it follows `type` (one or several), `properties` (only those
//! declared, each once; the `required` ones always, the others where the model chooses),
//! `additionalProperties` (`false`, or the schema of the values of an object without declared
//! properties), `items`, `minItems` and `maxItems`, `minLength` and `maxLength`, `enum`,
//! `const`, `anyOf` and `oneOf`. A schema without a type, or with keywords it does not follow
//! (`$ref`, `allOf`, `not`, `pattern`, `format`, numeric bounds, `prefixItems`, ...), takes any
//! value in that syntax, or any value of its type.

use std::collections::BTreeMap;

use serde_json::Value;

use super::format::{lark_string, Markers};
use super::gemma4::{CALL, CALL_CLOSE, CALL_OPEN, QUOTE};
use super::Tool;

/// Schemas nested deeper than this take any value.
const MAX_DEPTH: usize = 24;

/// Text that does not hold a quote, as a Lark regular expression.
const NO_QUOTE: &str = r#"~/(?s:.*<\|"\|>.*)/"#;

/// A JSON number; an integer.
const NUMBER: &str = r"/-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/";
const INTEGER: &str = r"/-?(0|[1-9][0-9]*)/";

/// Rules and terminals written so far.
struct Builder<'a> {
    markers: &'a Markers<'a>,
    /// The quote as the grammar writes it.
    quote: String,
    /// Whether the quote is the model's token (a string is then a rule, not a terminal).
    quote_token: bool,
    rules: Vec<String>,
    /// Rules shared by every schema that uses them, by name.
    shared: BTreeMap<String, String>,
    next: usize,
}

/// The grammar of calls of `allowed`: one, or several one after another when `several`.
pub fn grammar(allowed: &[&Tool], several: bool, markers: &Markers<'_>) -> String {
    let mut b = Builder {
        markers,
        quote: markers.write(QUOTE),
        quote_token: markers.is_token(QUOTE),
        rules: Vec::new(),
        shared: BTreeMap::new(),
        next: 0,
    };
    let mut calls = Vec::new();
    for (i, tool) in allowed.iter().enumerate() {
        let arguments = b.object(&tool.parameters, 0);
        b.rules.push(format!(
            "call_{i}: {} {} {arguments} {}",
            b.markers.write(CALL_OPEN),
            lark_string(&format!("{CALL}{}", tool.name)),
            b.markers.write(CALL_CLOSE),
        ));
        calls.push(format!("call_{i}"));
    }
    let repeat = if several { "+" } else { "" };
    let mut out = format!("start: call{repeat}\ncall: {}\n", calls.join(" | "));
    for rule in b.rules.iter().chain(b.shared.values()) {
        out.push_str(rule);
        out.push('\n');
    }
    out
}

impl Builder<'_> {
    /// A fresh rule named from `kind` with `body`; its name.
    fn rule(&mut self, kind: &str, body: String) -> String {
        self.next += 1;
        let name = format!("{kind}{}", self.next);
        self.rules.push(format!("{name}: {body}"));
        name
    }

    /// A shared rule or terminal `name` (written once) with `body`; its name.
    fn shared(&mut self, name: &str, body: String) -> String {
        self.shared
            .entry(name.to_string())
            .or_insert_with(|| format!("{name}: {body}"));
        name.to_string()
    }

    /// A string of `min` to `max` characters (at most `max` where given), between quotes.
    fn string(&mut self, min: u64, max: Option<u64>) -> String {
        let max_text = max.map(|m| m.to_string()).unwrap_or_default();
        let name = format!("{min}_{max_text}");
        if self.quote_token {
            // The quotes are tokens of their own: text between them, none when it may be empty.
            let (low, optional) = if min == 0 { (1, "?") } else { (min, "") };
            if max == Some(0) {
                return format!("{q} {q}", q = self.quote);
            }
            let text = self.shared(
                &format!("TEXT_{name}"),
                format!(r"/(?s:.{{{low},{max_text}}})/ & {NO_QUOTE}"),
            );
            let rule = format!("{q} {text}{optional} {q}", q = self.quote);
            return self.shared(&format!("string_{name}"), rule);
        }
        // One terminal, quotes and all: it ends at the first closing quote.
        self.shared(
            &format!("STRING_{name}"),
            format!(
                r"{q} (/(?s:.{{{min},{max_text}}})/ & {NO_QUOTE}) {q}",
                q = self.quote
            ),
        )
    }

    /// Any value in Gemma 4's syntax.
    fn any(&mut self) -> String {
        let string = self.string(0, None);
        let number = self.shared("NUMBER", NUMBER.into());
        let key = self.shared("KEY", r#"/[^:{}\[\],<>"\s]+/"#.into());
        self.shared("any_member", format!("{key} \":\" any_value"));
        self.shared(
            "any_object",
            "\"{\" (any_member (\",\" any_member)*)? \"}\"".into(),
        );
        self.shared(
            "any_array",
            "\"[\" (any_value (\",\" any_value)*)? \"]\"".into(),
        );
        self.shared(
            "any_value",
            format!(
                "{string} | {number} | any_object | any_array | \"true\" | \"false\" | \"null\""
            ),
        )
    }

    /// A value valid against `schema`.
    fn value(&mut self, schema: &Value, depth: usize) -> String {
        if depth > MAX_DEPTH || !schema.is_object() {
            return self.any();
        }
        if let Some(value) = schema.get("const") {
            return self.literal(value);
        }
        if let Some(choices) = schema.get("enum").and_then(Value::as_array) {
            if !choices.is_empty() {
                let choices: Vec<String> = choices.iter().map(|c| self.literal(c)).collect();
                return format!("({})", choices.join(" | "));
            }
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(options) = schema.get(key).and_then(Value::as_array) {
                if !options.is_empty() {
                    let options: Vec<String> =
                        options.iter().map(|o| self.value(o, depth + 1)).collect();
                    return format!("({})", options.join(" | "));
                }
            }
        }
        match schema.get("type") {
            Some(Value::String(kind)) => self.typed(kind, schema, depth),
            Some(Value::Array(kinds)) if !kinds.is_empty() => {
                let kinds: Vec<String> = kinds
                    .iter()
                    .map(|k| self.typed(k.as_str().unwrap_or_default(), schema, depth))
                    .collect();
                format!("({})", kinds.join(" | "))
            }
            _ if schema.get("properties").is_some() => self.object(schema, depth),
            _ if schema.get("items").is_some() => self.array(schema, depth),
            _ => self.any(),
        }
    }

    /// A value of type `kind` valid against the rest of `schema`.
    fn typed(&mut self, kind: &str, schema: &Value, depth: usize) -> String {
        let bound = |key| schema.get(key).and_then(Value::as_u64);
        match kind {
            "string" => self.string(bound("minLength").unwrap_or(0), bound("maxLength")),
            "integer" => self.shared("INTEGER", INTEGER.into()),
            "number" => self.shared("NUMBER", NUMBER.into()),
            "boolean" => "(\"true\" | \"false\")".into(),
            "null" => "\"null\"".into(),
            "object" => self.object(schema, depth),
            "array" => self.array(schema, depth),
            _ => self.any(),
        }
    }

    /// An object valid against `schema`: its declared properties in the template's order,
    /// `,` between them.
    fn object(&mut self, schema: &Value, depth: usize) -> String {
        let declared = schema.get("properties").and_then(Value::as_object);
        let Some(declared) = declared.filter(|p| !p.is_empty()) else {
            return match schema.get("additionalProperties") {
                Some(Value::Bool(false)) => "\"{\" \"}\"".into(),
                Some(values @ Value::Object(_)) => {
                    let key = self.shared("KEY", r#"/[^:{}\[\],<>"\s]+/"#.into());
                    let value = self.value(values, depth + 1);
                    let member = self.rule("member", format!("{key} \":\" {value}"));
                    format!("\"{{\" ({member} (\",\" {member})*)? \"}}\"")
                }
                _ => {
                    self.any();
                    "any_object".into()
                }
            };
        };
        let required: Vec<&str> = schema
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let mut keys: Vec<&String> = declared.keys().collect();
        keys.sort_by_key(|k| (k.to_lowercase(), k.to_string()));
        let members: Vec<(String, bool)> = keys
            .iter()
            .map(|key| {
                let value = self.value(&declared[key.as_str()], depth + 1);
                let member = format!("{} {value}", lark_string(&format!("{key}:")));
                (
                    self.rule("member", member),
                    required.contains(&key.as_str()),
                )
            })
            .collect();
        // From the last member back: `tail` is the members from there on, each after a comma
        // (any that are optional left out or not); `first` the same with at least one written,
        // the first without its comma.
        let (mut tail, mut first) = (None::<String>, None::<String>);
        for (i, (member, needed)) in members.iter().enumerate().rev() {
            let after = tail.as_deref().map(|t| format!(" {t}")).unwrap_or_default();
            let this = if *needed {
                format!("\",\" {member}")
            } else {
                format!("(\",\" {member})?")
            };
            let mut body = format!("{member}{after}");
            if let (false, Some(later)) = (needed, &first) {
                body = format!("{body} | {later}");
            }
            first = Some(self.rule("first", body));
            if i > 0 {
                tail = Some(self.rule("tail", format!("{this}{after}")));
            }
        }
        let first = first.unwrap_or_default();
        let any_needed = members.iter().any(|(_, needed)| *needed);
        let optional = if any_needed { "" } else { "?" };
        format!("\"{{\" {first}{optional} \"}}\"")
    }

    /// An array valid against `schema`.
    fn array(&mut self, schema: &Value, depth: usize) -> String {
        let item = match schema.get("items") {
            Some(items @ Value::Object(_)) => self.value(items, depth + 1),
            _ => self.any(),
        };
        let min = schema.get("minItems").and_then(Value::as_u64).unwrap_or(0);
        let max = schema.get("maxItems").and_then(Value::as_u64);
        if max == Some(0) {
            return "\"[\" \"]\"".into();
        }
        let more_min = min.saturating_sub(1);
        let more = match max.map(|m| m - 1) {
            None if more_min == 0 => format!(" (\",\" {item})*"),
            None => format!(" (\",\" {item}){{{more_min},}}"),
            Some(0) => String::new(),
            Some(more_max) => format!(" (\",\" {item}){{{more_min},{more_max}}}"),
        };
        if min == 0 {
            format!("\"[\" ({item}{more})? \"]\"")
        } else {
            format!("\"[\" {item}{more} \"]\"")
        }
    }

    /// `value` written as the template writes it.
    fn literal(&mut self, value: &Value) -> String {
        match value {
            Value::String(s) if self.quote_token => {
                if s.is_empty() {
                    format!("{q} {q}", q = self.quote)
                } else {
                    format!("{q} {} {q}", lark_string(s), q = self.quote)
                }
            }
            Value::String(s) => lark_string(&format!("{QUOTE}{s}{QUOTE}")),
            Value::Array(items) => {
                let items: Vec<String> = items.iter().map(|i| self.literal(i)).collect();
                format!("\"[\" {} \"]\"", items.join(" \",\" "))
            }
            Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort_by_key(|k| (k.to_lowercase(), k.to_string()));
                let members: Vec<String> = keys
                    .iter()
                    .map(|k| {
                        let value = self.literal(&map[k.as_str()]);
                        format!("{} {value}", lark_string(&format!("{k}:")))
                    })
                    .collect();
                format!("\"{{\" {} \"}}\"", members.join(" \",\" "))
            }
            other => lark_string(&other.to_string()),
        }
    }
}
