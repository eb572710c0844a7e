//! A forced tool call is complete or says `length`, in every API, whole and streamed: a
//! scripted "model" writes a `write_file` call whose `content` holds the format's own close
//! marker and a stop string, and tries to end its answer right after that marker, inside the
//! string (what Qwen2.5-Coder does on a long file). The end is masked there, so the answer
//! goes on to the whole call: chat completions (`required` and a named function, with `stop`),
//! the Responses API (`required`) and the Messages API (`any` and `tool`, with
//! `stop_sequences`) all return that call. Cut by the token limit inside the string, every
//! format's answer says `length` and reports the call as far as its arguments got, streamed
//! or not, with no markup leaking into the content (the Messages API's `input`: those
//! arguments closed where they were cut). Gemma 4's grammar, its strings between `<|"|>`
//! quotes, is held to the same. A forced call that cannot be made (no
//! tools, a function not offered, a schema the grammar engine cannot compile) is a 400
//! naming the field, in one line, in every API.

use axum::http::StatusCode;
use serde_json::{json, Value};

use super::mock_server::call;
use super::scripted::{scripted_ending_at, streamed};
use crate::support::chat_stream::ChatStream;

/// The call's `content`, holding the close marker and the stop string.
const CONTENT: &str = "x = 1 STOP\n</tool_call> y";

/// Its JSON text, up to and including the close marker the model tries to end after.
const INNER: &str =
    r#"{"name": "write_file", "arguments": {"path": "a.py", "content": "x = 1 STOP\n</tool_call>"#;

fn hermes_answer() -> String {
    format!("<tool_call>\n{INNER} y\"}}}}\n</tool_call>")
}

fn want() -> Value {
    json!({"path": "a.py", "content": CONTENT})
}

fn parameters() -> Value {
    json!({"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
           "required": ["path", "content"], "additionalProperties": false})
}

fn chat(choice: Value) -> Value {
    json!({
        "messages": [{"role": "user", "content": "Write a.py."}],
        "max_tokens": 200, "temperature": 0, "stop": ["STOP"],
        "tool_choice": choice, "parallel_tool_calls": false,
        "tools": [{"type": "function", "function": {"name": "write_file", "parameters": parameters()}}],
    })
}

fn arguments(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// A streamed chat answer: its content, its calls' names and arguments, its finish reason.
async fn chat_streamed(app: &axum::Router, body: Value) -> (String, Vec<(String, String)>, Value) {
    let events = streamed(app, "/v1/chat/completions", body).await;
    let answer = ChatStream::of(events.iter().map(|(_, data)| data));
    (answer.content, answer.calls, json!(answer.finish))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_call_that_tries_to_end_inside_a_string_is_completed_in_every_api() {
    let answer = hermes_answer();
    let at = "<tool_call>\n".len() + INNER.len();
    let server = scripted_ending_at(&answer, at, Some("hermes"));
    let app = &server.app;

    for choice in [
        json!("required"),
        json!({"type": "function", "function": {"name": "write_file"}}),
    ] {
        let (status, whole) = call(
            app,
            "POST",
            "/v1/chat/completions",
            Some(chat(choice.clone())),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{whole}");
        let c = &whole["choices"][0];
        assert_eq!(c["finish_reason"], "tool_calls", "{choice}: {whole}");
        assert_eq!(c["message"]["content"], Value::Null, "{whole}");
        let calls = c["message"]["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 1, "{whole}");
        assert_eq!(calls[0]["function"]["name"], "write_file");
        assert_eq!(
            arguments(calls[0]["function"]["arguments"].as_str().unwrap()),
            want()
        );

        let (content, calls, finish) = chat_streamed(app, chat(choice.clone())).await;
        assert_eq!(finish, "tool_calls", "{choice}");
        assert_eq!(content, "", "{choice}");
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].0, "write_file");
        assert_eq!(arguments(&calls[0].1), want());
    }

    let tools = json!([{"type": "function", "name": "write_file", "parameters": parameters()}]);
    let responses = json!({"input": "Write a.py.", "max_output_tokens": 200, "temperature": 0,
                           "tools": tools, "tool_choice": "required"});
    let (status, r) = call(app, "POST", "/v1/responses", Some(responses.clone())).await;
    assert_eq!(status, StatusCode::OK, "{r}");
    assert_eq!(r["status"], "completed", "{r}");
    let items: Vec<&Value> = r["output"].as_array().unwrap().iter().collect();
    assert!(items.iter().all(|i| i["type"] == "function_call"), "{r}");
    assert_eq!(items.len(), 1, "{r}");
    assert_eq!(arguments(items[0]["arguments"].as_str().unwrap()), want());
    let mut deltas = String::new();
    let mut done = None;
    for (name, data) in streamed(app, "/v1/responses", responses).await {
        match name.as_deref() {
            Some("response.function_call_arguments.delta") => {
                deltas += data["delta"].as_str().unwrap()
            }
            Some("response.function_call_arguments.done") => {
                done = Some(data["arguments"].as_str().unwrap().to_string())
            }
            Some("response.output_text.delta") => panic!("text in a forced call: {data}"),
            _ => {}
        }
    }
    assert_eq!(arguments(&deltas), want());
    assert_eq!(done.as_deref(), Some(deltas.as_str()));

    for choice in [
        json!({"type": "any"}),
        json!({"type": "tool", "name": "write_file"}),
    ] {
        let messages = json!({"max_tokens": 200, "temperature": 0, "stop_sequences": ["STOP"],
                              "messages": [{"role": "user", "content": "Write a.py."}],
                              "tools": [{"name": "write_file", "input_schema": parameters()}],
                              "tool_choice": choice});
        let (status, m) = call(app, "POST", "/v1/messages", Some(messages.clone())).await;
        assert_eq!(status, StatusCode::OK, "{m}");
        assert_eq!(m["stop_reason"], "tool_use", "{choice}: {m}");
        let blocks = m["content"].as_array().unwrap();
        assert_eq!(blocks.len(), 1, "{m}");
        assert_eq!(
            (&blocks[0]["type"], &blocks[0]["input"]),
            (&json!("tool_use"), &want())
        );
        let mut input = String::new();
        let mut stop = Value::Null;
        for (name, data) in streamed(app, "/v1/messages", messages).await {
            match name.as_deref() {
                Some("content_block_delta") => match data["delta"]["type"].as_str() {
                    Some("input_json_delta") => {
                        input += data["delta"]["partial_json"].as_str().unwrap()
                    }
                    other => panic!("{other:?} in a forced call: {data}"),
                },
                Some("message_delta") => stop = data["delta"]["stop_reason"].clone(),
                _ => {}
            }
        }
        assert_eq!(stop, "tool_use", "{choice}");
        assert_eq!(arguments(&input), want());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_gemma4_call_that_tries_to_end_inside_a_string_is_completed() {
    // Gemma 4's grammar writes the keys in its template's order (`content` before `path`),
    // strings between `<|"|>` quotes, which here hold its close marker and the stop string.
    let inner = "<|tool_call>call:write_file{content:<|\"|>x = 1 STOP\n<tool_call|>";
    let answer = format!("{inner} y<|\"|>,path:<|\"|>a.py<|\"|>}}<tool_call|>");
    let server = scripted_ending_at(&answer, inner.len(), Some("gemma4"));
    let app = &server.app;
    let want = json!({"path": "a.py", "content": "x = 1 STOP\n<tool_call|> y"});
    for choice in [
        json!("required"),
        json!({"type": "function", "function": {"name": "write_file"}}),
    ] {
        let (status, whole) = call(
            app,
            "POST",
            "/v1/chat/completions",
            Some(chat(choice.clone())),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{whole}");
        let c = &whole["choices"][0];
        assert_eq!(c["finish_reason"], "tool_calls", "{choice}: {whole}");
        assert_eq!(c["message"]["content"], Value::Null, "{whole}");
        let calls = c["message"]["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 1, "{whole}");
        let arguments_text = calls[0]["function"]["arguments"].as_str().unwrap();
        assert_eq!(arguments(arguments_text), want);
        let (content, calls, finish) = chat_streamed(app, chat(choice.clone())).await;
        assert_eq!(
            (content.as_str(), finish),
            ("", json!("tool_calls")),
            "{choice}"
        );
        assert_eq!(
            calls,
            vec![("write_file".to_string(), arguments_text.to_string())]
        );
    }
}

/// Each format's forced call, and how many of its bytes come before the model runs out of
/// tokens inside the call's `content` string.
fn cut_answers() -> Vec<(&'static str, String, usize)> {
    let hermes = hermes_answer();
    let llama =
        r#"{"name": "write_file", "parameters": {"path": "a.py", "content": "x = 1 and more"}}"#;
    let mistral = r#"[TOOL_CALLS][{"name": "write_file", "arguments": {"path": "a.py", "content": "x = 1 and more"}}]"#;
    let coder = "<tool_call>\n<function=write_file>\n<parameter=path>\na.py\n</parameter>\n<parameter=content>\nx = 1 and more\n</parameter>\n</function>\n</tool_call>";
    let cut_after = |text: &str, marker: &str| text.find(marker).unwrap() + marker.len();
    vec![
        ("hermes", hermes.clone(), cut_after(&hermes, "STOP")),
        ("llama3_json", llama.into(), cut_after(llama, "x = 1")),
        ("mistral", mistral.into(), cut_after(mistral, "x = 1")),
        ("qwen3_coder", coder.into(), cut_after(coder, "x = 1")),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_call_cut_by_the_token_limit_says_length_in_every_format() {
    let tokenizer = &crate::support::fixtures::smollm2().tokenizer;
    for (format, answer, cut) in cut_answers() {
        // The model tries to end at every position; `max_tokens` cuts it first.
        let server = scripted_ending_at(&answer, 0, Some(format));
        let app = &server.app;
        let tokens = tokenizer.encode_plain(&answer[..cut]).unwrap().len();
        let mut body = chat(json!("required"));
        body["max_tokens"] = json!(tokens);
        body["stop"] = json!([]);
        let (status, whole) = call(app, "POST", "/v1/chat/completions", Some(body.clone())).await;
        assert_eq!(status, StatusCode::OK, "{whole}");
        let c = &whole["choices"][0];
        assert_eq!(c["finish_reason"], "length", "{format}: {whole}");
        assert_eq!(c["message"]["content"], Value::Null, "{format}: {whole}");
        let calls = c["message"]["tool_calls"]
            .as_array()
            .unwrap_or_else(|| panic!("{format}: {whole}"));
        assert_eq!(calls.len(), 1, "{format}: {whole}");
        assert_eq!(calls[0]["function"]["name"], "write_file");
        let partial = calls[0]["function"]["arguments"].as_str().unwrap();
        match format {
            // Typed parameters: those that closed, and a string as far as it got, closed.
            "qwen3_coder" => assert_eq!(
                arguments(partial),
                json!({"path": "a.py", "content": "x = 1"})
            ),
            // JSON: the arguments' text as far as it got, without the blanks between tokens.
            _ => assert!(
                partial.starts_with(r#"{"path":"a.py","content":"x = 1"#),
                "{format}: {partial}"
            ),
        }

        let (content, streamed_calls, finish) = chat_streamed(app, body.clone()).await;
        assert_eq!(finish, "length", "{format}");
        assert_eq!(content, "", "{format}: no markup as content");
        assert_eq!(
            streamed_calls,
            vec![("write_file".to_string(), partial.to_string())],
            "{format}"
        );

        // The Messages API's `input` is an object: the arguments closed where they were
        // cut, whole and streamed alike.
        let messages = json!({"max_tokens": tokens, "temperature": 0,
                              "messages": [{"role": "user", "content": "Write a.py."}],
                              "tools": [{"name": "write_file", "input_schema": parameters()}],
                              "tool_choice": {"type": "any"}});
        let (status, m) = call(app, "POST", "/v1/messages", Some(messages.clone())).await;
        assert_eq!(status, StatusCode::OK, "{m}");
        assert_eq!(m["stop_reason"], "max_tokens", "{format}: {m}");
        let input = &m["content"][0]["input"];
        assert_eq!(input["path"], "a.py", "{format}: {m}");
        assert!(
            input["content"].as_str().unwrap().starts_with("x = 1"),
            "{format}: {m}"
        );
        let mut joined = String::new();
        for (name, data) in streamed(app, "/v1/messages", messages).await {
            if name.as_deref() == Some("content_block_delta") {
                joined += data["delta"]["partial_json"].as_str().unwrap_or("");
            }
        }
        assert_eq!(&arguments(&joined), input, "{format}");

        // Cut before the call's name is out: no call, no content.
        body["max_tokens"] = json!(2);
        let (_, whole) = call(app, "POST", "/v1/chat/completions", Some(body.clone())).await;
        let c = &whole["choices"][0];
        assert_eq!(c["finish_reason"], "length", "{format}: {whole}");
        assert_eq!(c["message"]["content"], Value::Null, "{format}: {whole}");
        let (content, _, _) = chat_streamed(app, body).await;
        assert_eq!(content, "", "{format}: no markup as content");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_call_that_cannot_be_made_is_a_400_naming_the_field_in_every_api() {
    let server = scripted_ending_at("x", 0, Some("hermes"));
    let app = &server.app;
    let user = json!([{"role": "user", "content": "Hi"}]);
    let function = |parameters: Value| json!({"name": "f", "parameters": parameters});
    let dangling = json!({"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}});
    let lookaround =
        json!({"type": "object", "properties": {"a": {"type": "string", "pattern": "(?<=x)y"}}});
    let chat_tools =
        |parameters: Value| json!([{"type": "function", "function": function(parameters)}]);
    let cases = [
        (
            json!({"messages": user, "tool_choice": "required"}),
            "tool_choice",
        ),
        (
            json!({"messages": user, "tools": chat_tools(json!({"type": "object"})),
                   "tool_choice": {"type": "function", "function": {"name": "g"}}}),
            "tool_choice",
        ),
        (
            json!({"messages": user, "tools": chat_tools(dangling.clone()), "tool_choice": "required"}),
            "tools",
        ),
        (
            json!({"messages": user, "tools": chat_tools(lookaround.clone()), "tool_choice": "required"}),
            "tools",
        ),
    ];
    for (body, field) in cases {
        let (status, answer) = call(app, "POST", "/v1/chat/completions", Some(body.clone())).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
        assert_eq!(answer["error"]["param"], field, "{body}: {answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(
            !message.contains('\n'),
            "one line, no grammar listing: {message}"
        );
    }
    let responses_tool = json!([{"type": "function", "name": "f", "parameters": dangling}]);
    for (body, field) in [
        (
            json!({"input": "Hi", "tool_choice": "required"}),
            "tool_choice",
        ),
        (
            json!({"input": "Hi", "tools": responses_tool, "tool_choice": "required"}),
            "tools",
        ),
    ] {
        let (status, answer) = call(app, "POST", "/v1/responses", Some(body.clone())).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
        assert_eq!(answer["error"]["param"], field, "{body}: {answer}");
    }
    for (body, field) in [
        (
            json!({"max_tokens": 8, "messages": user, "tool_choice": {"type": "any"}}),
            "tool_choice",
        ),
        (
            json!({"max_tokens": 8, "messages": user, "tool_choice": {"type": "tool", "name": "g"},
                   "tools": [{"name": "f", "input_schema": {"type": "object"}}]}),
            "tool_choice",
        ),
        (
            json!({"max_tokens": 8, "messages": user, "tool_choice": {"type": "any"},
                   "tools": [{"name": "f", "input_schema": lookaround}]}),
            "tools",
        ),
    ] {
        let (status, answer) = call(app, "POST", "/v1/messages", Some(body.clone())).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
        assert_eq!(answer["type"], "error", "{answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.starts_with(field), "{body}: {message}");
    }
}
