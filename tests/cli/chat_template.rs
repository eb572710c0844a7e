//! The chat template and its variables on a real server: `--chat-template FILE` replaces the
//! model's template, `--default-chat-template-kwargs` gives it variables, and a request's
//! `chat_template_kwargs` goes over them (the Qwen3 way of turning thinking off:
//! `enable_thinking: false` writes an empty thinking block into the prompt), for chat
//! completions and `/tokenize` alike. A value that is not an object, and a render that fails,
//! are a 400 naming the field; a template that does not parse and default variables that are
//! not an object refuse to start the server.

use serde_json::{json, Value};

use crate::support::fixtures::smollm2_path;
use crate::support::processes::{thicket, ServerProcess};

const TEMPLATE: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% if fail is defined %}{{ range(1, 2, 0) }}{% endif %}";

#[test]
fn template_variables_come_from_the_server_and_the_request() {
    let dir = tempfile::tempdir().unwrap();
    let template = dir.path().join("chat.jinja");
    std::fs::write(&template, TEMPLATE).unwrap();
    let model = smollm2_path();
    let server = ServerProcess::start(
        &[
            "--kv-cache-mib",
            "64",
            "--model",
            model.to_str().unwrap(),
            "--chat-template",
            template.to_str().unwrap(),
            "--default-chat-template-kwargs",
            r#"{"enable_thinking": false}"#,
        ],
        &[],
    );
    let messages = json!([{"role": "user", "content": "Hi"}]);
    let tokens = |kwargs: Option<Value>| -> Vec<u64> {
        let mut body = json!({"messages": messages});
        if let Some(k) = kwargs {
            body["chat_template_kwargs"] = k;
        }
        let (status, answer) = server.post("/tokenize", &body);
        assert_eq!(status, 200, "{answer}");
        answer["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap())
            .collect()
    };
    let text = |tokens: &[u64]| -> String {
        let (status, answer) = server.post("/detokenize", &json!({"tokens": tokens}));
        assert_eq!(status, 200, "{answer}");
        answer["prompt"].as_str().unwrap().to_string()
    };
    // The server's default turns thinking off; the request turns it back on.
    let off = tokens(None);
    let on = tokens(Some(json!({"enable_thinking": true})));
    assert!(
        text(&off).ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"),
        "{}",
        text(&off)
    );
    assert!(
        text(&on).ends_with("Hi<|im_end|>\n<|im_start|>assistant\n"),
        "{}",
        text(&on)
    );
    // Chat completions render the same prompts.
    for (kwargs, expected) in [
        (None, off.len()),
        (Some(json!({"enable_thinking": true})), on.len()),
    ] {
        let mut body = json!({"messages": messages, "max_tokens": 2, "temperature": 0});
        if let Some(k) = kwargs {
            body["chat_template_kwargs"] = k;
        }
        let (status, answer) = server.post("/v1/chat/completions", &body);
        assert_eq!(status, 200, "{answer}");
        assert_eq!(
            answer["usage"]["prompt_tokens"],
            json!(expected),
            "{answer}"
        );
    }
    // Not an object: a 400 naming the field, on both routes.
    for path in ["/v1/chat/completions", "/tokenize"] {
        let body = json!({"messages": messages, "chat_template_kwargs": [1]});
        let (status, answer) = server.post(path, &body);
        assert_eq!(status, 400, "{path}: {answer}");
        assert_eq!(answer["error"]["param"], "chat_template_kwargs", "{answer}");
    }
    // A render that fails: a 400, not a crash, and the server goes on.
    let body =
        json!({"messages": messages, "chat_template_kwargs": {"fail": true}, "max_tokens": 2});
    let (status, answer) = server.post("/v1/chat/completions", &body);
    assert_eq!(status, 400, "{answer}");
    assert_eq!(answer["error"]["param"], "messages", "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("chat template"),
        "{answer}"
    );
    assert_eq!(tokens(None), off);
}

#[test]
fn a_template_that_does_not_parse_or_defaults_that_are_not_an_object_refuse_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("broken.jinja");
    std::fs::write(&broken, "{% for %}").unwrap();
    for (args, expected) in [
        (
            vec!["--chat-template", broken.to_str().unwrap()],
            "does not parse",
        ),
        (
            vec!["--chat-template", "/nonexistent/chat.jinja"],
            "reading --chat-template",
        ),
        (
            vec!["--default-chat-template-kwargs", "[1]"],
            "a JSON object",
        ),
        (vec!["--default-chat-template-kwargs", "{"], "not JSON"),
    ] {
        let out = thicket()
            .args(["serve", "--port", "0"])
            .args(&args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
}
