//! A streamed chat completion put back together from its chunks, as a client accumulates
//! one: the first choice's content, its tool calls (name and arguments, by index) and its
//! finish reason.

use serde_json::Value;

/// What a streamed chat answer's first choice said.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ChatStream {
    /// Its content deltas, joined.
    pub content: String,
    /// Its calls, by index: the name and the arguments, each joined from their deltas.
    pub calls: Vec<(String, String)>,
    /// Its finish reason (empty when none came).
    pub finish: String,
}

impl ChatStream {
    /// The answer the chunks `chunks` (JSON bodies of `data:` lines) carry.
    pub fn of<'a>(chunks: impl IntoIterator<Item = &'a Value>) -> Self {
        let mut out = Self::default();
        for chunk in chunks {
            let Some(choice) = chunk["choices"].get(0) else {
                continue;
            };
            if let Some(reason) = choice["finish_reason"].as_str() {
                out.finish = reason.to_string();
            }
            out.content
                .push_str(choice["delta"]["content"].as_str().unwrap_or(""));
            for call in choice["delta"]["tool_calls"]
                .as_array()
                .into_iter()
                .flatten()
            {
                let index = call["index"].as_u64().expect("a call index") as usize;
                if out.calls.len() <= index {
                    out.calls.resize(index + 1, Default::default());
                }
                let (name, arguments) = &mut out.calls[index];
                name.push_str(call["function"]["name"].as_str().unwrap_or(""));
                arguments.push_str(call["function"]["arguments"].as_str().unwrap_or(""));
            }
        }
        out
    }

    /// The answer an SSE body carries (`[DONE]` and other non-JSON data skipped).
    pub fn of_sse(sse: &str) -> Self {
        let chunks: Vec<Value> = sse
            .lines()
            .filter_map(|line| line.strip_prefix("data: "))
            .filter_map(|data| serde_json::from_str(data).ok())
            .collect();
        Self::of(&chunks)
    }
}
