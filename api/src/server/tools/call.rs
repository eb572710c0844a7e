//! A tool call, as every API's answer carries it: read from the model's text
//! ([`ParsedCall`]: a function's name and its arguments as JSON text) and given out under a
//! fresh id ([`ToolCallOut`], in the chat shape the Responses and Messages APIs rename).

use serde::Serialize;

/// One call read from an answer: the function's name and its arguments (JSON text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedCall {
    /// The function's name.
    pub name: String,
    /// Its arguments, as JSON text.
    pub arguments: String,
}

/// A fresh call id.
pub fn call_id() -> String {
    format!("call_{:024x}", rand::random::<u128>() >> 32)
}

pub(super) fn call_out(call: ParsedCall) -> ToolCallOut {
    ToolCallOut {
        id: call_id(),
        kind: "function",
        function: FunctionCallOut {
            name: call.name,
            arguments: call.arguments,
        },
    }
}

/// A tool call in a response.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ToolCallOut {
    /// `call_...`, unique per call.
    pub id: String,
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The function and its arguments.
    pub function: FunctionCallOut,
}

/// The function of a tool call in a response.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct FunctionCallOut {
    /// Function name.
    pub name: String,
    /// Arguments, a JSON object as a string.
    pub arguments: String,
}
