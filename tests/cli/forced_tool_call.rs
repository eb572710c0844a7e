//! The forced tool call that once ended in text: Qwen2.5-Coder-0.5B asked, with
//! `tool_choice: "required"`, to write a 30-line module through `write_file`. The model
//! tries to close the call and end its turn while still inside the JSON string `content`;
//! the format does not let it, so the answer is either the whole call (`tool_calls`, its
//! arguments valid) or, once `max_tokens` runs out, `length` with the call as far as its
//! arguments got. Never `stop` with the call left in `content`. Whole and streamed, with
//! speculation at its default and off; and on the Responses and Messages APIs.

use serde_json::{json, Value};

use crate::support::chat_stream::ChatStream;
use crate::support::fixtures::qwen_path;
use crate::support::processes::ServerProcess;

const SYSTEM: &str = "You are a coding assistant. To create a file, call the write_file tool with the file's path and its whole content.";
const USER: &str = "Create the file stats.py. Its content is the Python source code of a module with five functions, mean, median, mode, variance and stdev, each with a docstring, and an if __name__ == '__main__' block that prints each of them for a sample list. About 30 lines of code.";

fn parameters() -> Value {
    json!({"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
           "required": ["path", "content"]})
}

/// Checks a `write_file` call's arguments: valid and whole when the answer is done, the
/// start of them when it was cut.
fn check_arguments(arguments: &str, cut: bool, case: &str) {
    if cut {
        assert!(arguments.starts_with("{\"path\""), "{case}: {arguments}");
        return;
    }
    let parsed: Value =
        serde_json::from_str(arguments).unwrap_or_else(|e| panic!("{case}: {e}: {arguments}"));
    assert!(
        parsed["path"].is_string() && parsed["content"].is_string(),
        "{case}: {arguments}"
    );
}

#[test]
fn a_forced_write_file_call_is_complete_or_says_length() {
    let model = qwen_path();
    let server = ServerProcess::start(
        &[
            "--kv-cache-mib",
            "256",
            "--max-model-len",
            "2048",
            "--model",
            model.to_str().unwrap(),
        ],
        &[],
    );
    for method in ["auto", "none"] {
        let body = json!({
            "temperature": 0, "max_tokens": 900,
            "tool_choice": "required", "parallel_tool_calls": false,
            "tools": [{"type": "function", "function": {"name": "write_file",
                       "description": "Write a file", "parameters": parameters()}}],
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}],
            "speculation": {"method": method},
        });
        let case = format!("speculation {method}");
        let (status, whole) = server.post("/v1/chat/completions", &body);
        assert_eq!(status, 200, "{case}: {whole}");
        let choice = &whole["choices"][0];
        let finish = choice["finish_reason"].as_str().unwrap().to_string();
        assert!(
            finish == "tool_calls" || finish == "length",
            "{case}: {whole}"
        );
        let cut = finish == "length";
        if cut {
            assert_eq!(whole["usage"]["completion_tokens"], 900, "{case}");
        }
        assert!(choice["message"]["content"].is_null(), "{case}: {whole}");
        let calls = choice["message"]["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 1, "{case}: {whole}");
        assert_eq!(calls[0]["function"]["name"], "write_file");
        let arguments = calls[0]["function"]["arguments"].as_str().unwrap();
        check_arguments(arguments, cut, &case);

        let mut stream = body.clone();
        stream["stream"] = json!(true);
        let (status, _, sse) = server.request(
            "POST",
            "/v1/chat/completions",
            stream.to_string().as_bytes(),
        );
        assert_eq!(status, 200, "{case}: {sse}");
        let streamed = ChatStream::of_sse(&sse);
        assert_eq!(streamed.finish, finish, "{case}");
        assert_eq!(streamed.content, "", "{case}: no call text as content");
        assert_eq!(
            streamed.calls,
            vec![("write_file".to_string(), arguments.to_string())],
            "{case}"
        );
    }

    let responses = json!({
        "temperature": 0, "max_output_tokens": 300, "tool_choice": "required",
        "instructions": SYSTEM, "input": USER,
        "tools": [{"type": "function", "name": "write_file", "parameters": parameters()}],
    });
    let (status, r) = server.post("/v1/responses", &responses);
    assert_eq!(status, 200, "{r}");
    let cut = r["status"] == "incomplete";
    assert!(cut || r["status"] == "completed", "{r}");
    let items = r["output"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{r}");
    assert_eq!(items[0]["type"], "function_call", "{r}");
    check_arguments(items[0]["arguments"].as_str().unwrap(), cut, "responses");

    let messages = json!({
        "temperature": 0, "max_tokens": 300, "tool_choice": {"type": "any"}, "system": SYSTEM,
        "messages": [{"role": "user", "content": USER}],
        "tools": [{"name": "write_file", "description": "Write a file", "input_schema": parameters()}],
    });
    let (status, m) = server.post("/v1/messages", &messages);
    assert_eq!(status, 200, "{m}");
    let stop = m["stop_reason"].as_str().unwrap();
    assert!(stop == "tool_use" || stop == "max_tokens", "{m}");
    let blocks = m["content"].as_array().unwrap();
    assert_eq!(blocks.len(), 1, "{m}");
    assert_eq!(blocks[0]["type"], "tool_use", "{m}");
    assert_eq!(blocks[0]["name"], "write_file", "{m}");
    if stop == "tool_use" {
        check_arguments(&blocks[0]["input"].to_string(), false, "messages");
    }
}
