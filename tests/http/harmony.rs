//! gpt-oss's harmony channels through every API, on a scripted "model" (`scripted`) that
//! answers in harmony: `analysis` becomes chat's `reasoning_content`, a Responses `reasoning`
//! item and a Messages `thinking` block, `final` the answer, whole and streamed, no marker
//! in any text; the gpt-oss chat template gets `reasoning_effort` (chat's field, the
//! Responses API's `reasoning.effort`), earlier thinking (chat's `reasoning_content`, a
//! Responses `reasoning` item, a Messages `thinking` block) and earlier calls as harmony
//! writes them; a bad effort is a 400 naming the field. A structured output is the `final`
//! message after a free analysis, and a thinking budget ends the analysis with no second one
//! after it; a forced call is written after a free analysis. (Calls in the `openai` format through
//! every API: `tool_formats`.)

use api::server::reasoning::ReasoningParser;
use api::server::settings::template::TemplateSetup;
use axum::http::StatusCode;
use serde_json::{json, Value};

use super::mock_server::{assert_error, call};
use super::scripted::{scripted_full, scripted_pieces, scripted_with, streamed};
use crate::support::fixtures::smollm2;

const THINKING: &str = "The user greets; answer briefly.";
const ANSWER: &str = "Hello! How can I help?";

fn script() -> String {
    format!(
        "<|channel|>analysis<|message|>{THINKING}<|end|><|start|>assistant\
         <|channel|>final<|message|>{ANSWER}<|return|>"
    )
}

/// SmolLM2's own chat template.
fn no_template() -> TemplateSetup {
    TemplateSetup::default()
}

fn gptoss_template() -> TemplateSetup {
    TemplateSetup {
        template: Some(include_str!("../data/gptoss_chat_template.jinja").into()),
        kwargs: Default::default(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn channels_come_apart_in_every_api_whole_and_streamed() {
    let server = scripted_with(&script(), Some(ReasoningParser::Harmony), None);
    let app = &server.app;
    let chat = json!({"messages": [{"role": "user", "content": "hi"}],
                      "max_tokens": 100, "temperature": 0});
    let (status, whole) = call(app, "POST", "/v1/chat/completions", Some(chat.clone())).await;
    assert_eq!(status, StatusCode::OK, "{whole}");
    let message = &whole["choices"][0]["message"];
    assert_eq!(message["reasoning_content"], THINKING, "{whole}");
    assert_eq!(message["content"], ANSWER, "{whole}");
    assert_eq!(whole["choices"][0]["finish_reason"], "stop");
    let (mut thinking, mut content) = (String::new(), String::new());
    for (_, data) in streamed(app, "/v1/chat/completions", chat).await {
        if let Some(choice) = data["choices"].get(0) {
            thinking.push_str(choice["delta"]["reasoning_content"].as_str().unwrap_or(""));
            content.push_str(choice["delta"]["content"].as_str().unwrap_or(""));
        }
    }
    assert_eq!((thinking.as_str(), content.as_str()), (THINKING, ANSWER));

    let responses = json!({"input": "hi", "max_output_tokens": 100, "temperature": 0});
    let (status, r) = call(app, "POST", "/v1/responses", Some(responses.clone())).await;
    assert_eq!(status, StatusCode::OK, "{r}");
    assert_eq!(r["output"][0]["type"], "reasoning", "{r}");
    assert_eq!(r["output"][0]["content"][0]["text"], THINKING);
    assert_eq!(r["output"][1]["content"][0]["text"], ANSWER, "{r}");
    let (mut thinking, mut text) = (String::new(), String::new());
    for (name, data) in streamed(app, "/v1/responses", responses).await {
        match name.as_deref() {
            Some("response.reasoning_text.delta") => {
                thinking.push_str(data["delta"].as_str().unwrap())
            }
            Some("response.output_text.delta") => text.push_str(data["delta"].as_str().unwrap()),
            _ => {}
        }
    }
    assert_eq!((thinking.as_str(), text.as_str()), (THINKING, ANSWER));

    let messages = json!({"max_tokens": 100, "temperature": 0,
                          "messages": [{"role": "user", "content": "hi"}]});
    let (status, m) = call(app, "POST", "/v1/messages", Some(messages.clone())).await;
    assert_eq!(status, StatusCode::OK, "{m}");
    assert_eq!(m["content"][0]["thinking"], THINKING, "{m}");
    assert_eq!(m["content"][1], json!({"type": "text", "text": ANSWER}));
    assert_eq!(m["stop_reason"], "end_turn");
    let (mut thinking, mut text) = (String::new(), String::new());
    for (name, data) in streamed(app, "/v1/messages", messages).await {
        if name.as_deref() == Some("content_block_delta") {
            thinking.push_str(data["delta"]["thinking"].as_str().unwrap_or(""));
            text.push_str(data["delta"]["text"].as_str().unwrap_or(""));
        }
    }
    assert_eq!((thinking.as_str(), text.as_str()), (THINKING, ANSWER));
}

/// How many tokens `text` is on the scripted server's tokenizer.
fn tokens(text: &str) -> u64 {
    smollm2().tokenizer.encode_plain(text).unwrap().len() as u64
}

/// The gpt-oss template's system message at `effort`, with tools offered or not.
fn system(effort: &str, tools: bool) -> String {
    let date = api::chat_functions::strftime(
        "%Y-%m-%d",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs(),
    );
    let calls = if tools {
        "\nCalls to these tools must go to the commentary channel: 'functions'."
    } else {
        ""
    };
    format!(
        "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n\
         Knowledge cutoff: 2024-06\nCurrent date: {date}\n\nReasoning: {effort}\n\n\
         # Valid channels: analysis, commentary, final. Channel must be included for every \
         message.{calls}<|end|>"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn effort_and_earlier_thinking_reach_the_gptoss_template() {
    let server = scripted_full(
        &script(),
        Some(ReasoningParser::Harmony),
        None,
        gptoss_template(),
    );
    let app = &server.app;
    let user = "<|start|>user<|message|>hi<|end|>";
    // reasoning_effort (chat) and reasoning.effort (Responses) set the system message's line.
    for effort in ["low", "medium", "high"] {
        let body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                          "reasoning_effort": effort});
        let (status, whole) = call(app, "POST", "/v1/chat/completions", Some(body)).await;
        assert_eq!(status, StatusCode::OK, "{whole}");
        let want = tokens(&format!(
            "{}{user}<|start|>assistant",
            system(effort, false)
        ));
        assert_eq!(whole["usage"]["prompt_tokens"], want, "{effort}: {whole}");
        let body = json!({"input": "hi", "max_output_tokens": 2,
                          "reasoning": {"effort": effort}});
        let (status, r) = call(app, "POST", "/v1/responses", Some(body)).await;
        assert_eq!(status, StatusCode::OK, "{r}");
        assert_eq!(r["usage"]["input_tokens"], want, "{effort}: {r}");
    }
    // Earlier thinking before a call goes back as an analysis message, the call as harmony
    // writes it, the result as the function's message.
    let weather = json!({"name": "get_weather", "description": "Weather of a city.",
                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                        "required": ["city"]}});
    let history = |thought: Value| {
        json!([
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": null, "reasoning_content": thought,
             "tool_calls": [{"id": "c1", "type": "function",
                             "function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        ])
    };
    let tools_shown = "<|start|>developer<|message|># Tools\n\n## functions\n\nnamespace functions {\n\n\
                       // Weather of a city.\ntype get_weather = (_: {\ncity: string,\n}) => any;\n\n\
                       } // namespace functions<|end|>";
    let call_and_result = "<|start|>assistant to=functions.get_weather<|channel|>commentary json\
                           <|message|>{\"city\": \"Oslo\"}<|call|><|start|>functions.get_weather \
                           to=assistant<|channel|>commentary<|message|>\"sunny\"<|end|><|start|>assistant";
    for (thought, shown) in [
        (
            json!("Look it up."),
            "<|start|>assistant<|channel|>analysis<|message|>Look it up.<|end|>",
        ),
        (json!(null), ""),
    ] {
        let body = json!({"messages": history(thought.clone()), "max_tokens": 2,
                          "tools": [{"type": "function", "function": weather}]});
        let (status, whole) = call(app, "POST", "/v1/chat/completions", Some(body)).await;
        assert_eq!(status, StatusCode::OK, "{whole}");
        let want = format!(
            "{}{tools_shown}{user}{shown}{call_and_result}",
            system("medium", true)
        );
        assert_eq!(
            whole["usage"]["prompt_tokens"],
            tokens(&want),
            "{thought}: {whole}"
        );
    }
    // The same thought from a Responses `reasoning` item and a Messages `thinking` block.
    let input = json!([
        {"role": "user", "content": "hi"},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "Look it up."}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
    ]);
    let body = json!({"input": input, "max_output_tokens": 2,
                      "tools": [{"type": "function", "name": "get_weather",
                                 "description": "Weather of a city.",
                                 "parameters": weather["parameters"]}]});
    let (status, r) = call(app, "POST", "/v1/responses", Some(body)).await;
    assert_eq!(status, StatusCode::OK, "{r}");
    let with_thought = format!(
        "{}{tools_shown}{user}<|start|>assistant<|channel|>analysis<|message|>Look it up.<|end|>{call_and_result}",
        system("medium", true)
    );
    assert_eq!(r["usage"]["input_tokens"], tokens(&with_thought), "{r}");
    let body = json!({"max_tokens": 2, "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Look it up.", "signature": "x"},
            {"type": "tool_use", "id": "c1", "name": "get_weather", "input": {"city": "Oslo"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1", "content": "sunny"}]}],
        "tools": [{"name": "get_weather", "description": "Weather of a city.",
                   "input_schema": weather["parameters"]}]});
    let (status, m) = call(app, "POST", "/v1/messages", Some(body)).await;
    assert_eq!(status, StatusCode::OK, "{m}");
    let usage = &m["usage"];
    let input = usage["input_tokens"].as_u64().unwrap()
        + usage["cache_read_input_tokens"].as_u64().unwrap();
    assert_eq!(input, tokens(&with_thought), "{m}");

    // A bad effort is a 400 naming the field, in both APIs.
    let body =
        json!({"messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "extreme"});
    let (status, e) = call(app, "POST", "/v1/chat/completions", Some(body)).await;
    assert_eq!(
        assert_error(status, &e, StatusCode::BAD_REQUEST),
        "reasoning_effort"
    );
    let body = json!({"input": "hi", "reasoning": {"effort": "extreme"}});
    let (status, e) = call(app, "POST", "/v1/responses", Some(body)).await;
    assert_eq!(
        assert_error(status, &e, StatusCode::BAD_REQUEST),
        "reasoning.effort"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_structured_output_is_the_final_message_after_a_free_analysis() {
    let json_answer = r#"{"city": "Oslo"}"#;
    let script = [
        "<|channel|>analysis<|message|>",
        THINKING,
        "<|end|>",
        "<|start|>assistant<|channel|>final<|message|>",
        json_answer,
    ];
    let server = scripted_pieces(&script, Some(ReasoningParser::Harmony), None, no_template());
    let app = &server.app;
    let schema = json!({"type": "object", "properties": {"city": {"type": "string"}},
                        "required": ["city"], "additionalProperties": false});
    let formats = [
        json!({"response_format": {"type": "json_schema",
                                   "json_schema": {"name": "city", "schema": schema}}}),
        json!({"structured_outputs": {"json": schema}}),
        json!({"response_format": {"type": "json_object"}}),
    ];
    for format in formats {
        let mut chat = json!({"messages": [{"role": "user", "content": "Which city?"}],
                              "max_tokens": 100, "temperature": 0});
        for (k, v) in format.as_object().unwrap() {
            chat[k] = v.clone();
        }
        let (status, whole) = call(app, "POST", "/v1/chat/completions", Some(chat.clone())).await;
        assert_eq!(status, StatusCode::OK, "{whole}");
        let message = &whole["choices"][0]["message"];
        assert_eq!(message["reasoning_content"], THINKING, "{format}: {whole}");
        assert_eq!(message["content"], json_answer, "{format}: {whole}");
        let (mut thinking, mut content) = (String::new(), String::new());
        for (_, data) in streamed(app, "/v1/chat/completions", chat).await {
            if let Some(choice) = data["choices"].get(0) {
                thinking.push_str(choice["delta"]["reasoning_content"].as_str().unwrap_or(""));
                content.push_str(choice["delta"]["content"].as_str().unwrap_or(""));
            }
        }
        assert_eq!(
            (thinking.as_str(), content.as_str()),
            (THINKING, json_answer)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thinking_budget_ends_the_analysis_and_no_second_one_begins() {
    // The model would think on in a second analysis message; with a budget, the one its
    // first ends is the only one.
    let script = [
        "<|channel|>analysis<|message|>",
        THINKING,
        "<|end|>",
        "<|start|>assistant<|channel|>analysis<|message|>More thinking.",
        "<|end|>",
        "<|start|>assistant<|channel|>final<|message|>",
        ANSWER,
    ];
    let server = scripted_pieces(&script, Some(ReasoningParser::Harmony), None, no_template());
    let app = &server.app;
    let chat = |extra: Value| {
        let mut body = json!({"messages": [{"role": "user", "content": "hi"}],
                              "max_tokens": 200, "temperature": 0});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    };
    let (status, free) = call(app, "POST", "/v1/chat/completions", Some(chat(json!({})))).await;
    assert_eq!(status, StatusCode::OK, "{free}");
    let thought = free["choices"][0]["message"]["reasoning_content"]
        .as_str()
        .unwrap();
    assert!(thought.contains("More thinking."), "{free}");
    assert_eq!(free["choices"][0]["message"]["content"], ANSWER, "{free}");

    let body = chat(json!({"thinking_token_budget": 200}));
    let (status, budgeted) = call(app, "POST", "/v1/chat/completions", Some(body)).await;
    assert_eq!(status, StatusCode::OK, "{budgeted}");
    let message = &budgeted["choices"][0]["message"];
    assert_eq!(message["reasoning_content"], THINKING, "{budgeted}");

    // A budget that runs out mid-analysis ends it there: the thinking is its first tokens.
    let body = chat(json!({"thinking_token_budget": 3}));
    let (status, cut) = call(app, "POST", "/v1/chat/completions", Some(body)).await;
    assert_eq!(status, StatusCode::OK, "{cut}");
    let thought = cut["choices"][0]["message"]["reasoning_content"]
        .as_str()
        .unwrap();
    assert!(
        !thought.is_empty() && THINKING.starts_with(thought) && thought.len() < THINKING.len(),
        "{cut}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_call_follows_a_free_analysis() {
    let script = [
        "<|channel|>analysis<|message|>",
        THINKING,
        "<|end|>",
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>",
        r#"{"city": "Oslo"}"#,
        "<|call|>",
    ];
    let server = scripted_pieces(
        &script,
        Some(ReasoningParser::Harmony),
        Some("openai"),
        no_template(),
    );
    let app = &server.app;
    let parameters = json!({"type": "object", "properties": {"city": {"type": "string"}},
                            "required": ["city"]});
    for choice in [
        json!("required"),
        json!({"type": "function", "function": {"name": "get_weather"}}),
    ] {
        let chat = json!({"messages": [{"role": "user", "content": "Weather in Oslo?"}],
                          "max_tokens": 100, "temperature": 0, "tool_choice": choice,
                          "tools": [{"type": "function", "function": {
                              "name": "get_weather", "parameters": parameters}}]});
        let (status, whole) = call(app, "POST", "/v1/chat/completions", Some(chat)).await;
        assert_eq!(status, StatusCode::OK, "{whole}");
        let c = &whole["choices"][0];
        assert_eq!(c["message"]["reasoning_content"], THINKING, "{whole}");
        assert_eq!(c["finish_reason"], "tool_calls", "{whole}");
        let call = &c["message"]["tool_calls"][0]["function"];
        assert_eq!(call["name"], "get_weather", "{whole}");
        let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
        assert_eq!(args, json!({"city": "Oslo"}), "{whole}");
    }
}
