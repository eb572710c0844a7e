//! The pooling routes and a generating model in one server: a generating model alone refuses
//! them with a 400 naming `model`; an encoder served beside it (`--embedding-model`) answers
//! them under its own name once both have loaded, `/v1/models` lists both, and `/tokenize`
//! follows `model`.

use axum::http::StatusCode;
use serde_json::{json, Value};

use super::mock_server::{assert_error, call, server_with};
use super::pooling::{minilm, WEATHER};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_generating_model_refuses_the_pooling_routes() {
    let server = server_with(8, 1 << 20);
    for (path, body) in [
        ("/v1/embeddings", json!({"input": "a"})),
        ("/v1/rerank", json!({"query": "q", "documents": ["a"]})),
        ("/v1/score", json!({"text_1": "q", "text_2": "a"})),
    ] {
        let (status, err) = call(&server.app, "POST", path, Some(body)).await;
        assert_eq!(
            assert_error(status, &err, StatusCode::BAD_REQUEST),
            "model",
            "{path}"
        );
        assert!(
            err["error"]["message"]
                .as_str()
                .unwrap()
                .contains("cannot pool"),
            "{err}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_encoder_beside_a_generating_model_serves_the_pooling_routes_under_its_own_name() {
    let server = server_with(8, 1 << 20);
    server.state.expect_encoder_beside("minilm".into());
    // Until the encoder has loaded, the server is not ready and embeddings wait.
    let (status, _) = call(&server.app, "GET", "/health", None).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let (status, _) = call(
        &server.app,
        "POST",
        "/v1/embeddings",
        Some(json!({"input": "a"})),
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    // Beside an engine the encoder runs its loops without a team of its own.
    server.state.set_encoder(minilm(8192, true));
    let (status, _) = call(&server.app, "GET", "/health", None).await;
    assert_eq!(status, StatusCode::OK);
    for model in [json!("minilm"), Value::Null] {
        let (status, body) = call(
            &server.app,
            "POST",
            "/v1/embeddings",
            Some(json!({"model": model, "input": WEATHER})),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["model"], "minilm");
        assert_eq!(body["data"].as_array().unwrap().len(), 3);
    }
    let (status, err) = call(
        &server.app,
        "POST",
        "/v1/embeddings",
        Some(json!({"model": "mock", "input": "a"})),
    )
    .await;
    assert_eq!(assert_error(status, &err, StatusCode::BAD_REQUEST), "model");
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("'minilm' serves"),
        "{err}"
    );
    let (status, err) = call(
        &server.app,
        "POST",
        "/v1/score",
        Some(json!({"model": "other", "text_1": "a", "text_2": "b"})),
    )
    .await;
    assert_error(status, &err, StatusCode::NOT_FOUND);
    // The generating model still answers chat.
    let (status, chat) = call(
        &server.app,
        "POST",
        "/v1/completions",
        Some(json!({"model": "mock", "prompt": "<5> <6>", "max_tokens": 3})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{chat}");
    let (_, models) = call(&server.app, "GET", "/v1/models", None).await;
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["mock", "minilm"]);
    let (status, card) = call(&server.app, "GET", "/v1/models/minilm", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(card["max_model_len"], 256);
    // /tokenize follows `model`: the encoder's WordPiece, or the generating model's tokenizer.
    let (_, enc) = call(
        &server.app,
        "POST",
        "/tokenize",
        Some(json!({"model": "minilm", "prompt": "x"})),
    )
    .await;
    assert_eq!(enc["tokens"], json!([101, 1060, 102]), "{enc}");
    let (status, gen) = call(
        &server.app,
        "POST",
        "/tokenize",
        Some(json!({"prompt": "<5> <6>"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{gen}");
    assert_ne!(gen["tokens"], enc["tokens"]);
}
