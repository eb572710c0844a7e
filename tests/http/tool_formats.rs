//! Each tool-call format read by every API on a scripted "model" (`scripted`) that answers
//! in that format's syntax: chat completions' `tool_calls` (whole and streamed, a `hermes`
//! call's arguments in fragments that join to the whole call's), the
//! Responses API's `function_call` items and the Messages API's `tool_use` blocks all carry
//! the same call; with a reasoning parser, a call written inside the thinking is not one
//! while the call in the answer is; special tokens stay in the text on request, and for a
//! format marked by them.

use api::server::reasoning::ReasoningParser;
use axum::http::StatusCode;
use serde_json::{json, Value};

use super::mock_server::call;
use super::scripted::{scripted_with, streamed};

/// Each format's answer calling `get_weather` for Oslo, 2 days.
const ANSWERS: &[(&str, &str)] = &[
    ("hermes", "Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"days\": 2}}\n</tool_call>"),
    ("llama3_json", "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\", \"days\": 2}}"),
    ("mistral", "Checking.[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"days\": 2}}]"),
    ("qwen3_coder", "Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>"),
    // Gemma 4 hands control back after its calls: the answer ends there.
    ("gemma4", "Checking.<|tool_call>call:get_weather{city:<|\"|>Oslo<|\"|>,days:2}<tool_call|><|tool_response>"),
    // Read with the harmony reasoning parser, as it always is.
    ("openai", "<|channel|>analysis<|message|>Oslo, two days.<|end|><|start|>assistant<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Oslo\", \"days\": 2}<|call|>"),
];

/// The reasoning parser `format` is read with.
fn parser_of(format: &str) -> Option<ReasoningParser> {
    (format == "openai").then_some(ReasoningParser::Harmony)
}

fn weather() -> Value {
    json!({"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}}}})
}

fn chat_body() -> Value {
    json!({
        "messages": [{"role": "user", "content": "Weather in Oslo?"}],
        "max_tokens": 120,
        "temperature": 0,
        "tools": [{"type": "function", "function": weather()}],
    })
}

fn arguments(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_api_reads_each_format() {
    let want = json!({"city": "Oslo", "days": 2});
    for (format, answer) in ANSWERS {
        let server = scripted_with(answer, parser_of(format), Some(format));
        let app = &server.app;
        let (status, whole) = call(app, "POST", "/v1/chat/completions", Some(chat_body())).await;
        assert_eq!(status, StatusCode::OK, "{whole}");
        let choice = &whole["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls", "{format}: {whole}");
        let calls = choice["message"]["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 1, "{format}: {whole}");
        assert_eq!(calls[0]["function"]["name"], "get_weather");
        assert_eq!(
            arguments(calls[0]["function"]["arguments"].as_str().unwrap()),
            want
        );
        let content = choice["message"]["content"].as_str().unwrap_or("");
        assert!(
            content == "Checking." || content.is_empty(),
            "{format}: {whole}"
        );

        let whole_args = calls[0]["function"]["arguments"]
            .as_str()
            .unwrap()
            .to_string();
        let (mut name, mut args, mut text) = (String::new(), String::new(), String::new());
        let mut fragments = 0;
        for (_, data) in streamed(app, "/v1/chat/completions", chat_body()).await {
            let Some(delta) = data["choices"].get(0).map(|c| &c["delta"]) else {
                continue;
            };
            text.push_str(delta["content"].as_str().unwrap_or(""));
            for call in delta["tool_calls"].as_array().into_iter().flatten() {
                assert_eq!(call["index"], 0, "{format}: one call");
                name.push_str(call["function"]["name"].as_str().unwrap_or(""));
                let fragment = call["function"]["arguments"].as_str().unwrap_or("");
                args.push_str(fragment);
                fragments += usize::from(!fragment.is_empty());
            }
        }
        assert_eq!(name, "get_weather", "{format}");
        assert_eq!(
            args, whole_args,
            "{format}: the fragments join to the whole arguments"
        );
        assert!(
            fragments > 2,
            "{format}: arguments stream ({fragments} fragments)"
        );
        assert_eq!(arguments(&args), want, "{format}");
        assert_eq!(text.trim(), content, "{format}");

        let (status, r) = call(app, "POST", "/v1/responses", Some(responses_body())).await;
        assert_eq!(status, StatusCode::OK, "{r}");
        let item = r["output"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["type"] == "function_call")
            .unwrap_or_else(|| panic!("{format}: {r}"));
        assert_eq!(item["name"], "get_weather");
        assert_eq!(arguments(item["arguments"].as_str().unwrap()), want);
        let whole_item_args = item["arguments"].as_str().unwrap().to_string();
        let (mut deltas, mut fragments, mut done) = (String::new(), 0, Value::Null);
        for (kind, data) in streamed(app, "/v1/responses", responses_body()).await {
            match kind.as_deref() {
                Some("response.function_call_arguments.delta") => {
                    deltas.push_str(data["delta"].as_str().unwrap());
                    fragments += 1;
                }
                Some("response.output_item.done") if data["item"]["type"] == "function_call" => {
                    done = data["item"].clone()
                }
                _ => {}
            }
        }
        assert!(fragments > 2, "{format}: {fragments} fragments");
        assert_eq!(deltas, whole_item_args, "{format}: Responses deltas join");
        assert_eq!(done["arguments"], json!(whole_item_args), "{format}");
        assert_eq!(done["status"], "completed", "{format}");

        let (status, m) = call(app, "POST", "/v1/messages", Some(messages_body())).await;
        assert_eq!(status, StatusCode::OK, "{m}");
        assert_eq!(m["stop_reason"], "tool_use", "{format}: {m}");
        let block = m["content"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["type"] == "tool_use")
            .unwrap_or_else(|| panic!("{format}: {m}"));
        assert_eq!(
            (&block["name"], &block["input"]),
            (&json!("get_weather"), &want)
        );
        let (mut partial, mut fragments, mut stop) = (String::new(), 0, None);
        for (kind, data) in streamed(app, "/v1/messages", messages_body()).await {
            let delta = &data["delta"];
            if kind.as_deref() == Some("content_block_delta") && delta["type"] == "input_json_delta"
            {
                partial.push_str(delta["partial_json"].as_str().unwrap());
                fragments += 1;
            }
            if data["delta"]["stop_reason"].is_string() {
                stop = Some(data["delta"]["stop_reason"].clone());
            }
        }
        assert!(fragments > 2, "{format}: {fragments} fragments");
        assert_eq!(
            arguments(&partial),
            want,
            "{format}: input_json_delta joins"
        );
        assert_eq!(stop, Some(json!("tool_use")), "{format}");
    }
}

fn responses_body() -> Value {
    json!({"input": "Weather in Oslo?", "max_output_tokens": 120, "temperature": 0,
           "tools": [{"type": "function", "name": "get_weather",
                      "parameters": weather()["parameters"]}]})
}

fn messages_body() -> Value {
    json!({"max_tokens": 120, "temperature": 0,
           "messages": [{"role": "user", "content": "Weather in Oslo?"}],
           "tools": [{"name": "get_weather", "input_schema": weather()["parameters"]}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_inside_the_thinking_is_not_read_in_any_format() {
    // (Harmony's thinking is a channel of its own: `harmony` checks it.)
    for (format, answer) in ANSWERS.iter().filter(|(f, _)| parser_of(f).is_none()) {
        // (Gemma 4's `<|tool_response>` ends the answer: not written while thinking.)
        let thinking = answer
            .replace("Oslo", "Bergen")
            .replace("<|tool_response>", "");
        let script = format!("<think>Maybe {thinking}</think>{answer}");
        let server = scripted_with(&script, Some(ReasoningParser::DeepSeekR1), Some(format));
        let (status, whole) = call(
            &server.app,
            "POST",
            "/v1/chat/completions",
            Some(chat_body()),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{whole}");
        let message = &whole["choices"][0]["message"];
        let calls = message["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 1, "{format}: {whole}");
        assert!(calls[0]["function"]["arguments"]
            .as_str()
            .unwrap()
            .contains("Oslo"));
        assert!(
            message["reasoning_content"]
                .as_str()
                .unwrap()
                .contains("Bergen"),
            "{format}: {whole}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn special_tokens_stay_in_the_text_where_a_format_is_marked_by_them() {
    // `<|im_start|>` is a special token of SmolLM2's: left out of text by default, kept on
    // request, and kept for a format whose markers are special tokens (Mistral's).
    let mistral = "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}]";
    let script = format!("Hi<|im_start|>there {mistral}");
    for (format, skip, want) in [
        ("hermes", None, "Hithere "),
        ("hermes", Some(false), "Hi<|im_start|>there "),
        ("mistral", None, "Hi<|im_start|>there"),
        ("mistral", Some(true), "Hithere"),
    ] {
        let server = scripted_with(&script, None, Some(format));
        let mut body = chat_body();
        if let Some(skip) = skip {
            body["skip_special_tokens"] = json!(skip);
        }
        let (status, whole) = call(&server.app, "POST", "/v1/chat/completions", Some(body)).await;
        assert_eq!(status, StatusCode::OK, "{whole}");
        let content = whole["choices"][0]["message"]["content"].as_str().unwrap();
        assert!(content.starts_with(want), "{format} {skip:?}: {whole}");
        let calls = whole["choices"][0]["message"]["tool_calls"].as_array();
        assert_eq!(
            calls.map_or(0, Vec::len),
            usize::from(format == "mistral"),
            "{whole}"
        );
    }
}
