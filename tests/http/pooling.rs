//! The pooling routes on the real all-MiniLM-L6-v2 encoder, in process: `/v1/embeddings` in
//! its four input shapes and two encodings against the encoder's own forward, `/v1/rerank`
//! (and `/rerank`, `/v2/rerank`) sorted, cut and with or without documents, `/v1/score` one
//! against many and pair by pair, every bad input as a 400 naming its field, the generating
//! routes refused with 400, and concurrent clients batched together getting what each gets
//! alone. A generating model beside or without an encoder is in `pooling_beside`, random
//! bodies in `pooling_fuzz`.

use api::server::{router, AppState, Choice, ServerConfig};
use axum::http::StatusCode;
use axum::Router;
use base64::Engine as _;
use engine::encoder::pooling::cosine;
use engine::encoder::{spawn_encoder, Encoder, EncoderServeConfig};
use serde_json::{json, Value};

use super::mock_server::{assert_error, call, KEY};
use crate::model::encoder::minilm_dir;

pub(crate) fn minilm(
    max_batch_tokens: usize,
    sharing_cores: bool,
) -> engine::encoder::EncoderHandle {
    let encoder = Encoder::load(&minilm_dir(), engine::WeightDType::Auto).unwrap();
    spawn_encoder(
        encoder,
        EncoderServeConfig {
            max_batch_tokens,
            max_pending: 256,
            sharing_cores,
        },
    )
    .unwrap()
    .0
}

pub(crate) fn minilm_server(max_batch_tokens: usize) -> Router {
    encoder_app(minilm(max_batch_tokens, false), "minilm")
}

/// The router over an encoder alone, served as `name`, behind the test key.
pub(crate) fn encoder_app(handle: engine::encoder::EncoderHandle, name: &str) -> Router {
    let state = AppState::new(ServerConfig {
        served_model_name: name.into(),
        api_key: Some(KEY.into()),
        max_body_bytes: 1 << 20,
        reasoning_parser: Choice::Off,
        tool_call_parser: Choice::Auto,
        template: Default::default(),
    });
    state.set_encoder(handle);
    router(state)
}

/// One JSON array of numbers as f32.
pub(crate) fn vector(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a vector: {v}"))
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

/// The `embedding` of every item of an answer's `data`, in order.
pub(crate) fn vectors(body: &Value) -> Vec<Vec<f32>> {
    body["data"]
        .as_array()
        .unwrap_or_else(|| panic!("no data: {body}"))
        .iter()
        .map(|d| vector(&d["embedding"]))
        .collect()
}

pub(crate) const WEATHER: [&str; 3] = [
    "The weather is lovely today.",
    "It's so sunny outside!",
    "He drove to the stadium.",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn embeddings_in_every_input_shape_and_encoding_agree() {
    let app = minilm_server(8192);
    let (status, body) = call(
        &app,
        "POST",
        "/v1/embeddings",
        Some(json!({"model": "minilm", "input": WEATHER})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["object"], "list");
    assert_eq!(body["model"], "minilm");
    let data = body["data"].as_array().unwrap();
    assert_eq!(data.len(), 3);
    let floats: Vec<Vec<f32>> = data.iter().map(|d| vector(&d["embedding"])).collect();
    for (i, d) in data.iter().enumerate() {
        assert_eq!(
            (d["object"].as_str(), d["index"].as_u64()),
            (Some("embedding"), Some(i as u64))
        );
        assert_eq!(floats[i].len(), 384);
        let norm: f32 = floats[i].iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4, "norm {norm}");
    }
    assert!((cosine(&floats[0], &floats[1]) - 0.6660).abs() < 6e-4);
    // [CLS] + 7 + [SEP], [CLS] + 7 + [SEP], [CLS] + 6 + [SEP] (WordPiece splits "it's" in three).
    let tokens = body["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(body["usage"]["total_tokens"].as_u64(), Some(tokens));
    assert!(tokens >= 25, "{}", body["usage"]);

    // base64: the same floats, little-endian.
    let (_, b64) = call(
        &app,
        "POST",
        "/v1/embeddings",
        Some(json!({"input": WEATHER[1], "encoding_format": "base64"})),
    )
    .await;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64["data"][0]["embedding"].as_str().unwrap())
        .unwrap();
    let decoded: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(decoded, floats[1]);

    // Token ids, one list and a list of lists: the ids of the text give the text's vector.
    let (_, tok) = call(
        &app,
        "POST",
        "/v1/embeddings",
        Some(json!({"input": [101, 1996, 4633, 2003, 8403, 2651, 1012, 102]})),
    )
    .await;
    assert!(
        cosine(&vector(&tok["data"][0]["embedding"]), &floats[0]) > 0.99999,
        "{tok}"
    );
    let (status, lists) = call(
        &app,
        "POST",
        "/v1/embeddings",
        Some(json!({"input": [[101, 1996, 4633, 2003, 8403, 2651, 1012, 102], [101, 102]]})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{lists}");
    assert_eq!(lists["data"].as_array().unwrap().len(), 2);
    assert_eq!(lists["usage"]["prompt_tokens"], 10);

    // Truncation keeps the first tokens and the markers; without it a long input is refused.
    let long = "word ".repeat(300);
    let (status, err) = call(&app, "POST", "/v1/embeddings", Some(json!({"input": long}))).await;
    assert_eq!(assert_error(status, &err, StatusCode::BAD_REQUEST), "input");
    assert!(
        err["error"]["message"].as_str().unwrap().contains("256"),
        "{err}"
    );
    let (status, cut) = call(
        &app,
        "POST",
        "/v1/embeddings",
        Some(json!({"input": long, "truncate_prompt_tokens": 12})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{cut}");
    assert_eq!(cut["usage"]["prompt_tokens"], 12);
    let (_, max) = call(
        &app,
        "POST",
        "/v1/embeddings",
        Some(json!({"input": long, "truncate_prompt_tokens": -1})),
    )
    .await;
    assert_eq!(max["usage"]["prompt_tokens"], 256);
    let (_, metrics) = call(&app, "GET", "/metrics", None).await;
    let metrics = metrics.as_str().unwrap_or_default();
    assert!(
        metrics.contains("thicket_encoder_tokens_total"),
        "{metrics}"
    );
    assert!(
        metrics.contains("thicket_encoder_step_duration_seconds"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_pooling_requests_are_400s_naming_their_field() {
    let app = minilm_server(8192);
    let cases = [
        ("/v1/embeddings", json!({"input": []}), "input"),
        ("/v1/embeddings", json!({"input": ["a", 3]}), "input[1]"),
        ("/v1/embeddings", json!({"input": ["a", ""]}), "input[1]"),
        (
            "/v1/embeddings",
            json!({"input": [[1, 2], [-1]]}),
            "input[1]",
        ),
        ("/v1/embeddings", json!({"input": [5, 999999]}), "input"),
        ("/v1/embeddings", json!({"input": {"text": "a"}}), "input"),
        (
            "/v1/embeddings",
            json!({"input": "a", "encoding_format": "int8"}),
            "encoding_format",
        ),
        (
            "/v1/embeddings",
            json!({"input": "a", "dimensions": 128}),
            "dimensions",
        ),
        (
            "/v1/embeddings",
            json!({"input": "a", "dimensions": 0}),
            "dimensions",
        ),
        (
            "/v1/embeddings",
            json!({"input": "a", "truncate_prompt_tokens": 0}),
            "truncate_prompt_tokens",
        ),
        (
            "/v1/embeddings",
            json!({"input": "a", "truncate_prompt_tokens": 999}),
            "truncate_prompt_tokens",
        ),
        (
            "/v1/rerank",
            json!({"query": "q", "documents": []}),
            "documents",
        ),
        (
            "/v1/rerank",
            json!({"query": 3, "documents": ["a"]}),
            "query",
        ),
        (
            "/v1/rerank",
            json!({"query": "q", "documents": ["a", null]}),
            "documents[1]",
        ),
        (
            "/v1/rerank",
            json!({"query": "q", "documents": ["a"], "top_n": -2}),
            "top_n",
        ),
        (
            "/v1/score",
            json!({"text_1": ["a", "b"], "text_2": ["a", "b", "c"]}),
            "text_1",
        ),
        ("/v1/score", json!({"text_1": "a", "text_2": 7}), "text_2"),
    ];
    for (path, body, field) in cases {
        let (status, err) = call(&app, "POST", path, Some(body.clone())).await;
        assert_eq!(
            assert_error(status, &err, StatusCode::BAD_REQUEST),
            field,
            "{path} {body}: {err}"
        );
    }
    // A body without the required field names it too.
    let (status, err) = call(
        &app,
        "POST",
        "/v1/embeddings",
        Some(json!({"model": "minilm"})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{err}");
    assert!(
        err["error"]["message"].as_str().unwrap().contains("input"),
        "{err}"
    );
    // Another model name is a 404, as on every route.
    let (status, err) = call(
        &app,
        "POST",
        "/v1/embeddings",
        Some(json!({"model": "other", "input": "a"})),
    )
    .await;
    assert_error(status, &err, StatusCode::NOT_FOUND);
    // The generating routes say the model only embeds.
    for (path, body) in [
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}]}),
        ),
        ("/v1/completions", json!({"prompt": "hi"})),
    ] {
        let (status, err) = call(&app, "POST", path, Some(body)).await;
        assert_eq!(assert_error(status, &err, StatusCode::BAD_REQUEST), "model");
        assert!(
            err["error"]["message"]
                .as_str()
                .unwrap()
                .contains("embedding model"),
            "{err}"
        );
    }
    let (status, models) = call(&app, "GET", "/v1/models", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(models["data"][0]["max_model_len"], 256);
    // Tokenize and detokenize with the encoder's WordPiece.
    let (status, tok) = call(
        &app,
        "POST",
        "/tokenize",
        Some(json!({"prompt": WEATHER[0]})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{tok}");
    assert_eq!(
        tok["tokens"],
        json!([101, 1996, 4633, 2003, 8403, 2651, 1012, 102])
    );
    assert_eq!(tok["max_model_len"], 256);
    let (_, plain) = call(
        &app,
        "POST",
        "/tokenize",
        Some(json!({"prompt": WEATHER[0], "add_special_tokens": false})),
    )
    .await;
    assert_eq!(plain["count"], 6);
    let (status, text) = call(
        &app,
        "POST",
        "/detokenize",
        Some(json!({"tokens": tok["tokens"]})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(text["prompt"], "the weather is lovely today.");
    let (status, err) = call(
        &app,
        "POST",
        "/detokenize",
        Some(json!({"tokens": [5, 40000]})),
    )
    .await;
    assert_eq!(
        assert_error(status, &err, StatusCode::BAD_REQUEST),
        "tokens"
    );
    let (status, err) = call(
        &app,
        "POST",
        "/tokenize",
        Some(json!({"messages": [{"role": "user", "content": "hi"}]})),
    )
    .await;
    assert_eq!(
        assert_error(status, &err, StatusCode::BAD_REQUEST),
        "messages"
    );
    let (status, _) = call(&app, "GET", "/health", None).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rerank_sorts_cuts_and_agrees_with_score_and_embeddings() {
    let app = minilm_server(8192);
    let query = "What is the capital of France?";
    let documents = [
        "The Eiffel Tower was finished in 1889.",
        "Paris is the capital and largest city of France.",
        "Photosynthesis turns light into sugar.",
        "France borders Spain, Italy and Germany.",
    ];
    let (status, full) = call(
        &app,
        "POST",
        "/v1/rerank",
        Some(json!({"model": "minilm", "query": query, "documents": documents})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{full}");
    let results = full["results"].as_array().unwrap();
    assert_eq!(results.len(), 4);
    assert_eq!(results[0]["index"], 1);
    assert_eq!(results[0]["document"]["text"], documents[1]);
    let scores: Vec<f64> = results
        .iter()
        .map(|r| r["relevance_score"].as_f64().unwrap())
        .collect();
    assert!(scores.windows(2).all(|w| w[0] >= w[1]), "{scores:?}");
    // The scores are the cosines of the embeddings.
    let mut texts = vec![query];
    texts.extend(documents);
    let (_, emb) = call(
        &app,
        "POST",
        "/v1/embeddings",
        Some(json!({"input": texts})),
    )
    .await;
    let e: Vec<Vec<f32>> = emb["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| vector(&d["embedding"]))
        .collect();
    for r in results {
        let i = r["index"].as_u64().unwrap() as usize;
        let expected = cosine(&e[0], &e[i + 1]);
        assert!(
            (r["relevance_score"].as_f64().unwrap() as f32 - expected).abs() < 1e-5,
            "{r}"
        );
    }
    // top_n and return_documents, on each path.
    for path in ["/rerank", "/v2/rerank", "/v1/rerank"] {
        let (status, cut) = call(
            &app,
            "POST",
            path,
            Some(json!({"query": query, "documents": documents, "top_n": 2, "return_documents": false})),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{path}: {cut}");
        let r = cut["results"].as_array().unwrap();
        assert_eq!(r.len(), 2, "{path}");
        assert_eq!(r[0]["index"], results[0]["index"]);
        assert_eq!(r[1]["index"], results[1]["index"]);
        assert!(r[0].get("document").is_none(), "{cut}");
    }
    // Score: one against many keeps the input order; pair by pair.
    let (status, one_many) = call(
        &app,
        "POST",
        "/v1/score",
        Some(json!({"text_1": query, "text_2": documents})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{one_many}");
    let data = one_many["data"].as_array().unwrap();
    assert_eq!(data.len(), 4);
    for r in results {
        let i = r["index"].as_u64().unwrap() as usize;
        assert_eq!(data[i]["index"], i);
        assert!(
            (data[i]["score"].as_f64().unwrap() - r["relevance_score"].as_f64().unwrap()).abs()
                < 1e-6
        );
    }
    let (_, pairs) = call(
        &app,
        "POST",
        "/v1/score",
        Some(json!({"text_1": [WEATHER[0], WEATHER[1]], "text_2": [WEATHER[1], WEATHER[2]]})),
    )
    .await;
    let p: Vec<f64> = pairs["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["score"].as_f64().unwrap())
        .collect();
    assert!(
        (p[0] - 0.6660).abs() < 6e-4 && (p[1] - 0.1411).abs() < 6e-4,
        "{p:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn concurrent_clients_batched_together_get_what_each_gets_alone() {
    // A small step budget so that jobs span steps and share them.
    let app = minilm_server(64);
    let texts: Vec<String> = (0..24)
        .map(|i| {
            format!(
                "Sentence number {i} talks about {} things.",
                ["red", "blue", "green"][i % 3]
            )
        })
        .collect();
    let mut alone = Vec::new();
    for text in &texts {
        let (_, body) = call(&app, "POST", "/v1/embeddings", Some(json!({"input": text}))).await;
        alone.push(vector(&body["data"][0]["embedding"]));
    }
    let tasks: Vec<_> = (0..8)
        .map(|c| {
            let app = app.clone();
            let batch: Vec<String> = texts.iter().skip(c).step_by(8).cloned().collect();
            tokio::spawn(async move {
                let (status, body) = call(
                    &app,
                    "POST",
                    "/v1/embeddings",
                    Some(json!({"input": batch})),
                )
                .await;
                assert_eq!(status, StatusCode::OK, "{body}");
                body["data"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|d| vector(&d["embedding"]))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    for (c, task) in tasks.into_iter().enumerate() {
        let got = task.await.unwrap();
        assert_eq!(got.len(), 3);
        for (k, v) in got.iter().enumerate() {
            let i = c + 8 * k;
            assert!(cosine(v, &alone[i]) > 0.999_999, "client {c}, text {i}");
        }
    }
}
