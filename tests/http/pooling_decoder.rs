//! A generating model that also pools (`--task embed`): the pooling routes answer under the
//! served model's own name through the engine, beside chat. On the mock model, whose
//! final-normed state is a bag of the tokens a row sees (`MockBackend::state`), an embedding
//! is that bag normalized: texts and token ids alike, equal bags equal, `usage` counted, more
//! inputs than the engine queues at once answered in waves; the server lists one model and keeps generating; concurrent embedding and chat requests each
//! get what they get alone.

use axum::http::StatusCode;
use engine::encoder::{decoder_pooler, DecoderTask};
use engine::MockBackend;
use serde_json::json;

use super::mock_server::{assert_error, call, server_with, Server};
use super::pooling::vectors;

fn embedding_server() -> Server {
    let server = server_with(300, 1 << 20);
    let pooler = decoder_pooler(
        server.engine.clone(),
        DecoderTask::Embed,
        MockBackend::STATE_WIDTH,
    )
    .unwrap();
    server.state.set_encoder(pooler);
    server
}

/// The mock's state after `ids`, normalized.
fn expected(ids: &[u32]) -> Vec<f32> {
    let state = MockBackend::state(ids);
    let norm = state.iter().map(|v| v * v).sum::<f32>().sqrt();
    state.iter().map(|v| v / norm).collect()
}

fn close(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-6)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_decoder_embeds_under_its_own_name_beside_chat() {
    let server = embedding_server();
    let (status, body) = call(
        &server.app,
        "POST",
        "/v1/embeddings",
        Some(json!({"model": "mock", "input": ["<5> <6> <13>", "<13> <6> <5>", "<5> <5>"]})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["model"], "mock");
    assert_eq!(body["usage"]["prompt_tokens"], 8);
    let v = vectors(&body);
    assert!(close(&v[0], &expected(&[5, 6, 13])), "{:?}", v[0]);
    assert!(close(&v[0], &v[1]));
    assert!(close(&v[2], &expected(&[5, 5])));
    assert!(!close(&v[0], &v[2]));
    // Token ids are read as given.
    let (status, ids) = call(
        &server.app,
        "POST",
        "/v1/embeddings",
        Some(json!({"input": [[5, 6, 13], [9]]})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{ids}");
    let w = vectors(&ids);
    assert!(close(&w[0], &v[0]));
    assert!(close(&w[1], &expected(&[9])));
    // More inputs than the engine queues at once go in waves.
    let many: Vec<Vec<u32>> = (0..300).map(|i| vec![1 + i % 60, 2]).collect();
    let (status, body) = call(
        &server.app,
        "POST",
        "/v1/embeddings",
        Some(json!({ "input": many })),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let all = vectors(&body);
    assert_eq!(all.len(), 300);
    assert!(close(&all[299], &expected(&many[299])));
    // Scores are cosines of the embeddings.
    let (status, score) = call(
        &server.app,
        "POST",
        "/v1/score",
        Some(json!({"text_1": "<5> <6> <13>", "text_2": ["<13> <6> <5>", "<5> <5>"]})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{score}");
    let cosine: f32 = v[0].iter().zip(&v[2]).map(|(a, b)| a * b).sum();
    let scores: Vec<f64> = score["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["score"].as_f64().unwrap())
        .collect();
    assert!((scores[0] - 1.0).abs() < 1e-5, "{scores:?}");
    assert!((scores[1] - f64::from(cosine)).abs() < 1e-5, "{scores:?}");
    // One model, which still generates.
    let (_, models) = call(&server.app, "GET", "/v1/models", None).await;
    assert_eq!(models["data"].as_array().unwrap().len(), 1, "{models}");
    let (status, chat) = call(
        &server.app,
        "POST",
        "/v1/completions",
        Some(json!({"prompt": "<5> <6>", "max_tokens": 3})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{chat}");
    // Not trained to be cut; an unknown name is a 404.
    let (status, err) = call(
        &server.app,
        "POST",
        "/v1/embeddings",
        Some(json!({"input": "<5>", "dimensions": 4})),
    )
    .await;
    assert_eq!(
        assert_error(status, &err, StatusCode::BAD_REQUEST),
        "dimensions"
    );
    let (status, err) = call(
        &server.app,
        "POST",
        "/v1/embeddings",
        Some(json!({"model": "other", "input": "<5>"})),
    )
    .await;
    assert_error(status, &err, StatusCode::NOT_FOUND);
    // An embedder reads texts alone: no instruction.
    let (status, err) = call(
        &server.app,
        "POST",
        "/v1/score",
        Some(json!({"text_1": "<5>", "text_2": "<6>", "instruction": "judge"})),
    )
    .await;
    assert_eq!(
        assert_error(status, &err, StatusCode::BAD_REQUEST),
        "instruction"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn embeddings_and_chat_at_once_each_get_what_they_get_alone() {
    let server = embedding_server();
    let completion = json!({"prompt": "<7> <8> <9>", "max_tokens": 12, "temperature": 0});
    let (_, alone) = call(
        &server.app,
        "POST",
        "/v1/completions",
        Some(completion.clone()),
    )
    .await;
    let texts: Vec<String> = (0..16)
        .map(|i| format!("<{}> <{}> <{}>", 10 + i, 20 + i % 5, 30 + i % 3))
        .collect();
    let mut tasks = Vec::new();
    for i in 0..8 {
        let app = server.app.clone();
        let body = match i % 2 {
            0 => ("/v1/completions", completion.clone()),
            _ => ("/v1/embeddings", json!({"input": texts.clone()})),
        };
        tasks.push(tokio::spawn(async move {
            call(&app, "POST", body.0, Some(body.1)).await
        }));
    }
    for (i, task) in tasks.into_iter().enumerate() {
        let (status, body) = task.await.unwrap();
        assert_eq!(status, StatusCode::OK, "{body}");
        if i % 2 == 0 {
            assert_eq!(body["choices"][0]["text"], alone["choices"][0]["text"]);
        } else {
            let v = vectors(&body);
            assert_eq!(v.len(), 16);
            let ids = [10 + 7, 20 + 7 % 5, 30 + 7 % 3];
            assert!(close(&v[7], &expected(&ids)));
        }
    }
}

#[test]
fn a_reranking_decoder_needs_yes_and_no_in_its_vocabulary() {
    let server = server_with(8, 1 << 20);
    let err = decoder_pooler(server.engine.clone(), DecoderTask::Rerank, 8).unwrap_err();
    assert!(err.to_string().contains("'no'"), "{err}");
}
