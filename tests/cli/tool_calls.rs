//! Tool calling with real models and templates: Qwen2.5's own template renders the offered
//! tools, an earlier call and its result; SmolLM2's template, which knows no tools, gets them
//! as text in the same form; and a `thicket serve` on Qwen2.5-Coder-0.5B answers a weather
//! question with a `get_weather` call that the API returns parsed (`tool_calls`,
//! `finish_reason: "tool_calls"`), the same whole and streamed, for `auto`, a named function
//! and `required` (with parallel calls allowed too: the answer still ends after its one
//! call), with and without speculation; and greedy BFCL calls on the AVX2 kernels are the
//! same tokens under `auto` as under `none`.

use api::server::pipeline::render_messages;
use api::server::request::ChatMessageIn;
use engine::ModelTokenizer;
use serde_json::{json, Value};

use crate::support::fixtures::{qwen_path, smollm2};
use crate::support::processes::ServerProcess;

fn weather() -> Value {
    json!({"type": "function", "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    }})
}

fn conversation() -> Vec<ChatMessageIn> {
    serde_json::from_value(json!([
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature\": 18}"},
    ]))
    .unwrap()
}

fn qwen_tokenizer() -> ModelTokenizer {
    let (content, _) = engine::model::gguf::read_content(&qwen_path()).unwrap();
    ModelTokenizer::from_gguf(&content).unwrap()
}

#[test]
fn templates_render_tools_calls_and_results() {
    let tools = [weather()];
    let qwen = render_messages(&qwen_tokenizer(), &conversation(), &tools).unwrap();
    assert!(qwen.starts_with("<|im_start|>system\n"), "{qwen}");
    assert!(
        qwen.contains("# Tools") && qwen.contains("<tools>\n{"),
        "{qwen}"
    );
    // `tojson` writes as transformers' does (json.dumps: `", "` and `": "`, keys in order).
    assert!(
        qwen.contains("{\"type\": \"function\", \"function\": {\"name\": \"get_weather\""),
        "{qwen}"
    );
    assert!(
        qwen.contains("<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>"),
        "{qwen}"
    );
    assert!(
        qwen.contains(
            "<|im_start|>user\n<tool_response>\n{\"temperature\": 18}\n</tool_response><|im_end|>"
        ),
        "{qwen}"
    );
    assert!(qwen.ends_with("<|im_start|>assistant\n"));

    let smol = render_messages(&smollm2().tokenizer, &conversation(), &tools).unwrap();
    let system = smol.split("<|im_end|>").next().unwrap();
    assert!(
        system.starts_with("<|im_start|>system\n")
            && system.contains("<tools>\n{\"type\":\"function\""),
        "{smol}"
    );
    assert!(
        smol.contains("<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\"}}\n</tool_call><|im_end|>"),
        "{smol}"
    );
    assert!(
        smol.contains(
            "<|im_start|>user\n<tool_response>\n{\"temperature\": 18}\n</tool_response><|im_end|>"
        ),
        "{smol}"
    );
    // Without tools, SmolLM2's prompt is what it always was.
    let plain: Vec<ChatMessageIn> =
        serde_json::from_value(json!([{"role": "user", "content": "Hi"}])).unwrap();
    let rendered = render_messages(&smollm2().tokenizer, &plain, &[]).unwrap();
    assert!(!rendered.contains("<tools>"), "{rendered}");
}

/// The calls of a streamed answer, put together from its deltas, and its finish reason.
fn streamed_calls(body: &str) -> (Vec<(String, String)>, String) {
    let mut calls: Vec<(String, String)> = Vec::new();
    let mut finish = String::new();
    for line in body.lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            break;
        }
        let chunk: Value = serde_json::from_str(data).unwrap();
        let choice = &chunk["choices"][0];
        if let Some(reason) = choice["finish_reason"].as_str() {
            finish = reason.to_string();
        }
        for delta in choice["delta"]["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let index = delta["index"].as_u64().unwrap() as usize;
            if index == calls.len() {
                assert!(
                    delta["id"].as_str().unwrap().starts_with("call_"),
                    "{delta}"
                );
                calls.push((String::new(), String::new()));
            }
            let call = &mut calls[index];
            if let Some(name) = delta["function"]["name"].as_str() {
                call.0.push_str(name);
            }
            call.1
                .push_str(delta["function"]["arguments"].as_str().unwrap_or(""));
        }
    }
    (calls, finish)
}

#[test]
fn qwen_answers_with_a_parsed_tool_call_whole_and_streamed() {
    let model = qwen_path();
    let server = ServerProcess::start(
        &[
            "--kv-cache-mib",
            "128",
            "--max-model-len",
            "1024",
            "--model",
            model.to_str().unwrap(),
        ],
        &[],
    );
    let named = json!({"type": "function", "function": {"name": "get_weather"}});
    // `required` with parallel calls allowed (the default): the grammar lets another call
    // follow, and the model ends its turn after one (its `<|im_end|>` is allowed there).
    for (choice, method, parallel) in [
        (json!("auto"), "none", false),
        (json!("auto"), "auto", false),
        (named.clone(), "none", false),
        (named, "ngram_trie", false),
        (json!("required"), "prompt_lookup", false),
        (json!("required"), "auto", true),
    ] {
        let mut body = json!({
            "messages": [{"role": "user", "content": "What is the weather in Paris right now?"}],
            "tools": [weather()],
            "tool_choice": choice,
            "max_tokens": 60,
            "temperature": 0,
            "speculation": {"method": method},
        });
        if !parallel {
            body["parallel_tool_calls"] = json!(false);
        }
        let case = format!("tool_choice {choice}, speculation {method}, parallel {parallel}");
        let (status, whole) = server.post("/v1/chat/completions", &body);
        assert_eq!(status, 200, "{case}: {whole}");
        let answer = &whole["choices"][0];
        assert_eq!(answer["finish_reason"], "tool_calls", "{case}: {whole}");
        assert!(answer["message"]["content"].is_null(), "{case}: {whole}");
        let calls = answer["message"]["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 1, "{case}: {whole}");
        assert_eq!(calls[0]["type"], "function");
        assert_eq!(calls[0]["function"]["name"], "get_weather", "{case}");
        let arguments = calls[0]["function"]["arguments"].as_str().unwrap();
        let parsed: Value = serde_json::from_str(arguments).unwrap();
        assert_eq!(parsed["city"], "Paris", "{case}: {arguments}");

        let mut streamed = body.clone();
        streamed["stream"] = json!(true);
        let (status, _, sse) = server.request(
            "POST",
            "/v1/chat/completions",
            streamed.to_string().as_bytes(),
        );
        assert_eq!(status, 200, "{case}: {sse}");
        let (calls, finish) = streamed_calls(&sse);
        assert_eq!(finish, "tool_calls", "{case}: {sse}");
        assert_eq!(
            calls,
            vec![("get_weather".to_string(), arguments.to_string())],
            "{case}: {sse}"
        );
    }
}

/// Greedy tool calls are the same tokens with speculation as without, on the AVX2 kernels
/// (the path most CPUs take, run here whatever this CPU's best is): BFCL turns whose calls
/// carry several arguments, under `none` and `auto`, on one server each.
#[test]
fn greedy_tool_calls_are_the_same_with_speculation_on_the_avx2_path() {
    #[cfg(target_arch = "x86_64")]
    let isa = if std::is_x86_feature_detected!("avx2") {
        "avx2"
    } else {
        eprintln!("this CPU has no AVX2: the turns run on its own kernels");
        ""
    };
    #[cfg(not(target_arch = "x86_64"))]
    let isa = "";
    let turns: Vec<Value> = include_str!("../../benches/data/bfcl_live.jsonl")
        .lines()
        .take(3)
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let model = qwen_path();
    let mut answers: Vec<Vec<Value>> = Vec::new();
    let mut accepted = 0;
    for method in ["none", "auto"] {
        let server = ServerProcess::start(
            &[
                "--kv-cache-mib",
                "128",
                "--max-model-len",
                "2048",
                "--model",
                model.to_str().unwrap(),
            ],
            &[("THICKET_ISA", isa)],
        );
        let mut answered = Vec::new();
        for turn in &turns {
            let body = json!({
                "messages": turn["messages"],
                "tools": turn["tools"],
                "tool_choice": "required",
                "max_tokens": 96,
                "temperature": 0,
                "speculation": {"method": method},
            });
            let (status, whole) = server.post("/v1/chat/completions", &body);
            assert_eq!(status, 200, "{method}: {whole}");
            let message = &whole["choices"][0]["message"];
            assert!(message["tool_calls"].is_array(), "{method}: {whole}");
            // The calls without their random ids.
            let calls: Vec<&Value> = message["tool_calls"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| &c["function"])
                .collect();
            answered.push(json!({"calls": calls, "tokens": whole["usage"]["completion_tokens"]}));
            accepted += whole["thicket"]["speculation"]["accepted_tokens"]
                .as_u64()
                .unwrap_or(0);
        }
        answers.push(answered);
    }
    assert_eq!(answers[0], answers[1], "none, then auto");
    assert!(
        accepted > 0,
        "auto accepted no draft: the comparison says nothing"
    );
}
