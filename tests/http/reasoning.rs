//! Reasoning output on a scripted "model" (`scripted`): the model's thinking, a tool call
//! written inside it and `</think>` inside the answer. Chat completions return the thinking
//! as `reasoning_content` / `reasoning` and count it in
//! `usage.completion_tokens_details.reasoning_tokens`; the Responses API as a `reasoning`
//! item (streamed as `response.reasoning_text.delta`s); the Messages API as a `thinking`
//! block (streamed as `thinking_delta`s); whole and streamed alike, and never reading the
//! call inside the thinking as a call. A thinking budget ends the thinking after that many
//! tokens; `reasoning.effort` and the Messages API's `thinking` reach the chat template; bad
//! budgets, efforts and thinking settings are a 400 naming the field.

use api::server::reasoning::ReasoningParser;
use axum::http::StatusCode;
use serde_json::{json, Value};

use super::mock_server::{assert_error, call};
use super::scripted::{scripted_full, scripted_server, streamed};
use crate::support::fixtures::smollm2;

const THINKING: &str = "\nThe user asks for 2+2. I could call <tool_call>{\"name\": \"calc\", \"arguments\": {\"x\": 2}}</tool_call> but no need.\n";
const ANSWER: &str = "The answer is 4. Write </think> to close a thought.";

fn script() -> String {
    format!("<think>{THINKING}</think>\n\n{ANSWER}")
}

fn tools() -> Value {
    json!([{"type": "function", "function": {
        "name": "calc", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}
    }}])
}

fn chat_body(extra: Value) -> Value {
    let mut body = json!({
        "messages": [{"role": "user", "content": "What is 2+2?"}],
        "max_tokens": 200,
        "temperature": 0,
        "tools": tools(),
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

/// Tokens of the script before its end of thinking (the tokens whose text is
/// `<think>` and the thinking).
fn thinking_tokens() -> usize {
    let tokenizer = &smollm2().tokenizer;
    let all = tokenizer.encode_plain(&script()).unwrap();
    let end = tokenizer.encode_plain("</think>").unwrap();
    let at = all
        .windows(end.len())
        .position(|w| w == end)
        .expect("the script's end of thinking, in its own tokens");
    assert_eq!(
        tokenizer.decode(&all[..at]).unwrap(),
        format!("<think>{THINKING}")
    );
    at
}

/// The thinking and the answer of the server's whole chat answer to `chat_body({})`.
async fn split(server: &super::mock_server::Server) -> (Value, Value) {
    let body = Some(chat_body(json!({})));
    let (status, whole) = call(&server.app, "POST", "/v1/chat/completions", body).await;
    assert_eq!(status, StatusCode::OK, "{whole}");
    let message = &whole["choices"][0]["message"];
    (
        message["reasoning_content"].clone(),
        message["content"].clone(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_answers_come_apart_from_their_thinking_whole_and_streamed() {
    let server = scripted_server(&script(), Some(ReasoningParser::DeepSeekR1));
    let (status, whole) = call(
        &server.app,
        "POST",
        "/v1/chat/completions",
        Some(chat_body(json!({}))),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{whole}");
    let choice = &whole["choices"][0];
    let message = &choice["message"];
    assert_eq!(message["reasoning_content"], THINKING, "{whole}");
    assert_eq!(message["reasoning"], THINKING);
    assert_eq!(message["content"], ANSWER, "`</think>` in the answer stays");
    assert!(
        message.get("tool_calls").is_none(),
        "a call inside thinking: {whole}"
    );
    assert_eq!(choice["finish_reason"], "stop");
    let usage = &whole["usage"];
    assert_eq!(
        usage["completion_tokens_details"]["reasoning_tokens"],
        thinking_tokens(),
        "{usage}"
    );

    let body = chat_body(json!({"stream_options": {"include_usage": true}}));
    let (mut thinking, mut content, mut calls) = (String::new(), String::new(), 0);
    let mut finish = None;
    let mut reasoning_tokens = None;
    for (_, data) in streamed(&server.app, "/v1/chat/completions", body).await {
        if data == "[DONE]" {
            break;
        }
        if let Some(choice) = data["choices"].get(0) {
            let delta = &choice["delta"];
            assert_eq!(delta["reasoning"], delta["reasoning_content"], "{data}");
            thinking.push_str(delta["reasoning_content"].as_str().unwrap_or(""));
            content.push_str(delta["content"].as_str().unwrap_or(""));
            calls += delta["tool_calls"].as_array().map_or(0, Vec::len);
            if choice["finish_reason"].is_string() {
                finish = choice["finish_reason"].as_str().map(str::to_string);
            }
        }
        if data["usage"].is_object() {
            reasoning_tokens =
                data["usage"]["completion_tokens_details"]["reasoning_tokens"].as_u64();
        }
    }
    assert_eq!((thinking.as_str(), content.as_str()), (THINKING, ANSWER));
    assert_eq!((calls, finish.as_deref()), (0, Some("stop")));
    assert_eq!(reasoning_tokens, Some(thinking_tokens() as u64));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thinking_cut_off_is_all_thinking_and_a_budget_ends_it() {
    let server = scripted_server(&script(), Some(ReasoningParser::Qwen3));
    let body = chat_body(json!({"max_tokens": 8}));
    let (status, whole) = call(&server.app, "POST", "/v1/chat/completions", Some(body)).await;
    assert_eq!(status, StatusCode::OK, "{whole}");
    let choice = &whole["choices"][0];
    assert_eq!(choice["finish_reason"], "length");
    assert!(choice["message"]["content"].is_null(), "{whole}");
    let thought = choice["message"]["reasoning_content"].as_str().unwrap();
    assert!(
        THINKING.starts_with(thought) && !thought.is_empty(),
        "{whole}"
    );
    assert_eq!(
        whole["usage"]["completion_tokens_details"]["reasoning_tokens"],
        8
    );

    // A budget of 4 tokens: the `<think>` the output opens with, then 4 thinking tokens,
    // then the end of thinking the server forces; the scripted model then starts over,
    // as its answer.
    let tokenizer = &smollm2().tokenizer;
    let all = tokenizer.encode_plain(&script()).unwrap();
    let start = tokenizer.encode_plain("<think>").unwrap().len();
    let expected = tokenizer.decode(&all[start..start + 4]).unwrap();
    let body = chat_body(json!({"thinking_token_budget": 4}));
    let (status, whole) = call(&server.app, "POST", "/v1/chat/completions", Some(body)).await;
    assert_eq!(status, StatusCode::OK, "{whole}");
    let message = &whole["choices"][0]["message"];
    assert_eq!(message["reasoning_content"], expected.as_str(), "{whole}");
    assert_eq!(
        whole["usage"]["completion_tokens_details"]["reasoning_tokens"],
        4 + start
    );
    assert!(
        message["content"].as_str().unwrap().starts_with("<think>"),
        "{whole}"
    );

    // A budget of 0 ends it before any thinking token.
    let body = chat_body(json!({"thinking_token_budget": 0}));
    let (_, whole) = call(&server.app, "POST", "/v1/chat/completions", Some(body)).await;
    let message = &whole["choices"][0]["message"];
    assert!(message["reasoning_content"].is_null(), "{whole}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_give_a_reasoning_item_whole_and_streamed() {
    let server = scripted_server(&script(), Some(ReasoningParser::DeepSeekR1));
    let body = json!({
        "input": "What is 2+2?",
        "max_output_tokens": 200,
        "temperature": 0,
        "reasoning": {"effort": "low"},
        "tools": [{"type": "function", "name": "calc",
                   "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}],
    });
    let (status, whole) = call(&server.app, "POST", "/v1/responses", Some(body.clone())).await;
    assert_eq!(status, StatusCode::OK, "{whole}");
    let output = whole["output"].as_array().unwrap();
    assert_eq!(output.len(), 2, "{whole}");
    assert_eq!(output[0]["type"], "reasoning");
    assert_eq!(output[0]["content"][0]["type"], "reasoning_text");
    assert_eq!(output[0]["content"][0]["text"], THINKING);
    assert_eq!(output[1]["type"], "message");
    assert_eq!(output[1]["content"][0]["text"], ANSWER);
    assert_eq!(whole["reasoning"]["effort"], "low");
    assert_eq!(
        whole["usage"]["output_tokens_details"]["reasoning_tokens"],
        thinking_tokens()
    );

    let (mut thinking, mut text) = (String::new(), String::new());
    let mut done = None;
    for (name, data) in streamed(&server.app, "/v1/responses", body).await {
        match name.as_deref() {
            Some("response.reasoning_text.delta") => {
                assert_eq!(data["output_index"], 0);
                thinking.push_str(data["delta"].as_str().unwrap());
            }
            Some("response.reasoning_text.done") => assert_eq!(data["text"], THINKING),
            Some("response.output_text.delta") => {
                assert_eq!(data["output_index"], 1);
                text.push_str(data["delta"].as_str().unwrap());
            }
            Some("response.completed") => done = Some(data["response"].clone()),
            _ => {}
        }
    }
    assert_eq!((thinking.as_str(), text.as_str()), (THINKING, ANSWER));
    let done = done.expect("response.completed");
    assert_eq!(done["output"][0]["content"][0]["text"], THINKING);
    assert_eq!(done["output"][1]["content"][0]["text"], ANSWER);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_give_a_thinking_block_whole_and_streamed() {
    let server = scripted_server(&script(), Some(ReasoningParser::DeepSeekR1));
    let body = json!({
        "model": "scripted",
        "max_tokens": 200,
        "temperature": 0,
        "messages": [{"role": "user", "content": "What is 2+2?"}],
        "thinking": {"type": "enabled", "budget_tokens": 150},
    });
    let (status, whole) = call(&server.app, "POST", "/v1/messages", Some(body.clone())).await;
    assert_eq!(status, StatusCode::OK, "{whole}");
    let content = whole["content"].as_array().unwrap();
    assert_eq!(content[0]["type"], "thinking", "{whole}");
    assert_eq!(content[0]["thinking"], THINKING);
    assert!(content[0]["signature"].is_string());
    assert_eq!(content[1], json!({"type": "text", "text": ANSWER}));
    assert_eq!(whole["stop_reason"], "end_turn");

    let (mut thinking, mut text) = (String::new(), String::new());
    let mut starts = Vec::new();
    for (name, data) in streamed(&server.app, "/v1/messages", body).await {
        match name.as_deref() {
            Some("content_block_start") => starts.push(data["content_block"]["type"].clone()),
            Some("content_block_delta") => match data["delta"]["type"].as_str() {
                Some("thinking_delta") => {
                    assert_eq!(data["index"], 0);
                    thinking.push_str(data["delta"]["thinking"].as_str().unwrap());
                }
                Some("text_delta") => {
                    assert_eq!(data["index"], 1);
                    text.push_str(data["delta"]["text"].as_str().unwrap());
                }
                other => panic!("unexpected delta {other:?}"),
            },
            _ => {}
        }
    }
    assert_eq!(starts, vec![json!("thinking"), json!("text")]);
    assert_eq!((thinking.as_str(), text.as_str()), (THINKING, ANSWER));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_thinking_settings_are_a_400_naming_the_field() {
    let server = scripted_server(&script(), Some(ReasoningParser::DeepSeekR1));
    for budget in [json!(-1), json!("many"), json!(1.5)] {
        let body = chat_body(json!({"thinking_token_budget": budget}));
        let (status, e) = call(&server.app, "POST", "/v1/chat/completions", Some(body)).await;
        assert_eq!(
            assert_error(status, &e, StatusCode::BAD_REQUEST),
            "thinking_token_budget"
        );
    }
    let messages = |thinking: Value| {
        json!({"max_tokens": 100, "messages": [{"role": "user", "content": "hi"}],
               "thinking": thinking})
    };
    for (thinking, param) in [
        (
            json!({"type": "enabled", "budget_tokens": 100}),
            "thinking.budget_tokens",
        ),
        (
            json!({"type": "enabled", "budget_tokens": -3}),
            "thinking.budget_tokens",
        ),
        (json!({"type": "enabled"}), "thinking.budget_tokens"),
        (json!({"type": "sometimes"}), "thinking.type"),
    ] {
        let (status, e) = call(
            &server.app,
            "POST",
            "/v1/messages",
            Some(messages(thinking)),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{e}");
        assert_eq!(e["error"]["type"], "invalid_request_error", "{e}");
        assert!(
            e["error"]["message"].as_str().unwrap().contains(param),
            "{e}"
        );
    }
    let body = json!({"input": "hi", "reasoning": {"effort": 3}});
    let (status, e) = call(&server.app, "POST", "/v1/responses", Some(body)).await;
    assert_eq!(
        assert_error(status, &e, StatusCode::BAD_REQUEST),
        "reasoning.effort"
    );

    // Without a reasoning parser there is no thinking to budget.
    let plain = scripted_server(&script(), None);
    let body = chat_body(json!({"thinking_token_budget": 10}));
    let (status, e) = call(&plain.app, "POST", "/v1/chat/completions", Some(body)).await;
    assert_eq!(
        assert_error(status, &e, StatusCode::BAD_REQUEST),
        "thinking_token_budget"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generic_parser_splits_and_budgets_at_its_own_strings() {
    let parser = ReasoningParser::generic("<seed:think>", "</seed:think>").unwrap();
    let script = format!("<seed:think>{THINKING}</seed:think>{ANSWER}");
    let server = scripted_server(&script, Some(parser));
    assert_eq!(split(&server).await, (json!(THINKING), json!(ANSWER)));

    // A budget of 3: the engine forces `</seed:think>` after three thinking tokens.
    let tokenizer = &smollm2().tokenizer;
    let all = tokenizer.encode_plain(&script).unwrap();
    let start = tokenizer.encode_plain("<seed:think>").unwrap().len();
    let body = chat_body(json!({"thinking_token_budget": 3}));
    let (status, whole) = call(&server.app, "POST", "/v1/chat/completions", Some(body)).await;
    assert_eq!(status, StatusCode::OK, "{whole}");
    let message = &whole["choices"][0]["message"];
    let expected = tokenizer.decode(&all[start..start + 3]).unwrap();
    assert_eq!(message["reasoning_content"], expected.as_str(), "{whole}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn effort_and_thinking_switches_reach_the_template() {
    // A template that shows its variables in the prompt: prompt sizes tell what it got.
    let template = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
        <|im_start|>assistant\n{% if reasoning_effort is defined %}EFFORT IS {{ reasoning_effort }} {% endif %}\
        {% if enable_thinking is defined and not enable_thinking %}NO THINKING AT ALL {% elif enable_thinking is defined %}THINK {% endif %}\n";
    let setup = api::server::settings::template::TemplateSetup {
        template: Some(template.into()),
        kwargs: Default::default(),
    };
    let server = scripted_full(&script(), Some(ReasoningParser::DeepSeekR1), None, setup);
    let tokenizer = &smollm2().tokenizer;
    let prompt = |effort: &str, think: &str| {
        let text =
            format!("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n{effort}{think}\n");
        tokenizer.encode_plain(&text).unwrap().len()
    };
    assert!(prompt("", "NO THINKING AT ALL ") > prompt("", "THINK ") + 1);
    assert!(prompt("", "THINK ") > prompt("", ""));
    for (effort, shown) in [(json!("high"), "EFFORT IS high "), (json!(null), "")] {
        let body = json!({"input": "hi", "max_output_tokens": 4, "temperature": 0,
                          "reasoning": {"effort": effort}});
        let (status, r) = call(&server.app, "POST", "/v1/responses", Some(body)).await;
        assert_eq!(status, StatusCode::OK, "{r}");
        assert_eq!(
            r["usage"]["input_tokens"],
            prompt(shown, ""),
            "{effort}: {r}"
        );
    }
    for (thinking, shown) in [
        (json!({"type": "disabled"}), "NO THINKING AT ALL "),
        (json!({"type": "enabled", "budget_tokens": 2}), "THINK "),
        (json!(null), ""),
    ] {
        let body = json!({"max_tokens": 4, "temperature": 0, "thinking": thinking,
                          "messages": [{"role": "user", "content": "hi"}]});
        let (status, m) = call(&server.app, "POST", "/v1/messages", Some(body)).await;
        assert_eq!(status, StatusCode::OK, "{m}");
        let usage = &m["usage"];
        let input = usage["input_tokens"].as_u64().unwrap()
            + usage["cache_read_input_tokens"].as_u64().unwrap();
        assert_eq!(input as usize, prompt("", shown), "{thinking}: {m}");
    }
    // The request's own chat_template_kwargs win over what `thinking` implies.
    let body = json!({"max_tokens": 4, "temperature": 0, "thinking": {"type": "disabled"},
                      "chat_template_kwargs": {"enable_thinking": true},
                      "messages": [{"role": "user", "content": "hi"}]});
    let (_, m) = call(&server.app, "POST", "/v1/messages", Some(body)).await;
    let usage = &m["usage"];
    let input = usage["input_tokens"].as_u64().unwrap()
        + usage["cache_read_input_tokens"].as_u64().unwrap();
    assert_eq!(input as usize, prompt("", "THINK "), "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn markers_that_are_special_tokens_stay_in_the_text_to_split_at() {
    // `<issue_start>` and `<issue_comment>` are special tokens of SmolLM2's, left out of
    // text by default; as a parser's markers they are kept, and split at.
    let tokenizer = &smollm2().tokenizer;
    for marker in ["<issue_start>", "<issue_comment>"] {
        let id = tokenizer.token_to_id(marker).unwrap();
        assert_eq!(
            tokenizer.decode_skip_special(&[id]).unwrap(),
            "",
            "{marker}"
        );
    }
    let parser = ReasoningParser::generic("<issue_start>", "<issue_comment>").unwrap();
    let server = scripted_server("<issue_start>pondering<issue_comment>Answer.", Some(parser));
    assert_eq!(split(&server).await, (json!("pondering"), json!("Answer.")));
}
