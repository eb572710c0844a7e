//! A model without a chat template (a base model such as Gemma 3 270M): every route that
//! renders messages answers 400 in its own error shape, saying so and pointing at
//! `/v1/completions`, which answers as usual, as does `/tokenize` with a prompt.

use axum::http::StatusCode;
use engine::Backend;
use serde_json::{json, Value};

use super::mock_server::{assert_error, call_with_key, mock_server, Server};

fn server() -> Server {
    let plain = |inner| -> Box<dyn Backend> { Box::new(inner) };
    mock_server(plain, None, 64, None, 1 << 20)
}

fn says_no_template(message: &str) {
    assert!(
        message.contains("no chat template") && message.contains("/v1/completions"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_routes_refuse_with_400_and_completions_answer() {
    let s = server();
    assert_eq!(s.engine.tokenizer().chat_template(), None);
    let post = |path: &'static str, body: Value| {
        let app = s.app.clone();
        async move { call_with_key(&app, "POST", path, Some(body), None).await }
    };
    let messages = json!([{"role": "user", "content": "<5> <6>"}]);

    for stream in [false, true] {
        let body = json!({"messages": messages, "max_tokens": 2, "stream": stream});
        let (status, body) = post("/v1/chat/completions", body).await;
        let param = assert_error(status, &body, StatusCode::BAD_REQUEST);
        assert_eq!(param, "messages");
        assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
        says_no_template(body["error"]["message"].as_str().unwrap_or_default());
    }
    let (status, body) = post(
        "/v1/responses",
        json!({"input": "<5> <6>", "max_output_tokens": 2}),
    )
    .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST);
    says_no_template(body["error"]["message"].as_str().unwrap_or_default());
    let (status, body) = post("/tokenize", json!({"messages": messages})).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST);
    says_no_template(body["error"]["message"].as_str().unwrap_or_default());

    // Anthropic's routes, in Anthropic's shape.
    for path in ["/v1/messages", "/v1/messages/count_tokens"] {
        let (status, body) = post(
            path,
            json!({"model": "mock", "max_tokens": 2, "messages": messages}),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {body}");
        assert_eq!(body["type"], "error", "{body}");
        assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
        says_no_template(body["error"]["message"].as_str().unwrap_or_default());
    }

    // Raw prompts need no template.
    let (status, body) = post(
        "/v1/completions",
        json!({"prompt": "<5> <6>", "max_tokens": 2, "temperature": 0}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body["choices"][0]["text"].is_string(), "{body}");
    assert_eq!(body["usage"]["prompt_tokens"], 2, "{body}");
    let (status, body) = post("/tokenize", json!({"prompt": "<5> <6>"})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}
