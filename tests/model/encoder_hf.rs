//! A tiny random cross-encoder (`BertForSequenceClassification`, one label, written by
//! `engine::model::testing::write_tiny_bert_hf`) against Hugging Face transformers on the same
//! checkpoint (`tests/data/bert_cross_encoder_transformers.json`, made by
//! `scripts/bert-reference.py`): the ids and token types of each pair, every token's last
//! state and the logit, from the folder and from a reranking `bert` GGUF written from it; and
//! `/v1/rerank` and `/v1/score` on it, scoring pairs by the sigmoid of that logit.

use axum::http::StatusCode;
use engine::encoder::{spawn_encoder, Encoder, EncoderServeConfig, EncoderTask};
use engine::model::testing::{write_tiny_bert_hf, TinyBert};
use serde_json::{json, Value};

use crate::http::mock_server::call;
use crate::http::pooling::encoder_app;

fn reference() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/bert_cross_encoder_transformers.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Writes the tiny cross-encoder where `THICKET_REFERENCE_HF` says, for
/// `scripts/bert-reference.py`.
#[test]
#[ignore = "writes the reference checkpoint for scripts/bert-reference.py"]
fn write_the_cross_encoder_reference() {
    let dir = std::env::var("THICKET_REFERENCE_HF").expect("THICKET_REFERENCE_HF");
    write_tiny_bert_hf(std::path::Path::new(&dir), &TinyBert::default()).unwrap();
}

fn tiny() -> (tempfile::TempDir, Encoder) {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_bert_hf(dir.path(), &TinyBert::default()).unwrap();
    let encoder = Encoder::load(dir.path(), engine::WeightDType::Auto).unwrap();
    (dir, encoder)
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

#[test]
fn the_tiny_cross_encoder_agrees_with_transformers() {
    let (_dir, encoder) = tiny();
    assert_eq!(encoder.task, EncoderTask::Classify { labels: 1 });
    let reference = reference();
    let pairs = reference["pairs"].as_array().unwrap();
    let inputs: Vec<_> = pairs
        .iter()
        .map(|p| {
            let input = encoder
                .tokenizer
                .pair(
                    p["first"].as_str().unwrap(),
                    p["second"].as_str().unwrap(),
                    None,
                )
                .unwrap();
            let ids: Vec<u32> = p["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect();
            let types: Vec<u32> = p["types"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect();
            assert_eq!((&input.ids, &input.types), (&ids, &types), "{p}");
            input
        })
        .collect();
    // All pairs in one packed forward.
    let states = encoder.model.forward(&inputs).unwrap();
    let logits = encoder.model.classify(&states, &inputs).unwrap().unwrap();
    let h = encoder.model.config().hidden_size;
    for ((pair, &(start, len)), logit) in pairs
        .iter()
        .zip(&engine::encoder::bert::spans(&inputs))
        .zip(&logits)
    {
        let want = floats(&pair["states"]);
        let got = &states[start * h..(start + len) * h];
        let diff = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(diff < 2e-5, "{}: states differ by {diff}", pair["first"]);
        let want = pair["logit"].as_f64().unwrap() as f32;
        assert!(
            (logit[0] - want).abs() < 2e-5,
            "{}: logit {} vs {want}",
            pair["first"],
            logit[0]
        );
    }
    // The logits spread: the check is not passed by a constant.
    let spread = logits
        .iter()
        .map(|l| l[0])
        .fold(f32::NEG_INFINITY, f32::max)
        - logits.iter().map(|l| l[0]).fold(f32::INFINITY, f32::min);
    assert!(spread > 0.05, "{logits:?}");
}

/// The same cross-encoder as a `bert` GGUF of pooling type 4 (llama.cpp's reranker: the
/// pooled `[CLS]` through `cls` and `cls.output`): the pairs read the same ids and types from
/// the rebuilt WordPiece vocabulary, and give transformers' logits.
#[test]
fn the_tiny_cross_encoder_as_a_reranking_gguf_agrees_with_transformers() {
    let (dir, _) = tiny();
    let path = dir.path().join("rerank.gguf");
    engine::model::testing::write_bert_gguf(dir.path(), &path, 4).unwrap();
    let encoder = Encoder::load(&path, engine::WeightDType::Auto).unwrap();
    assert_eq!(encoder.task, EncoderTask::Classify { labels: 1 });
    let reference = reference();
    for pair in reference["pairs"].as_array().unwrap() {
        let input = encoder
            .tokenizer
            .pair(
                pair["first"].as_str().unwrap(),
                pair["second"].as_str().unwrap(),
                None,
            )
            .unwrap();
        let ids: Vec<u32> = floats(&pair["ids"]).iter().map(|&x| x as u32).collect();
        let types: Vec<u32> = floats(&pair["types"]).iter().map(|&x| x as u32).collect();
        assert_eq!((&input.ids, &input.types), (&ids, &types), "{pair}");
        let inputs = [input];
        let states = encoder.model.forward(&inputs).unwrap();
        let logit = encoder.model.classify(&states, &inputs).unwrap().unwrap()[0][0];
        let want = pair["logit"].as_f64().unwrap() as f32;
        assert!(
            (logit - want).abs() < 2e-5,
            "{pair}: logit {logit} vs {want}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rerank_and_score_on_a_cross_encoder_are_sigmoids_of_its_logits() {
    let (_dir, encoder) = tiny();
    let (handle, _) = spawn_encoder(encoder, EncoderServeConfig::default()).unwrap();
    let app = encoder_app(handle, "tiny");
    let reference = reference();
    let pairs: Vec<&Value> = reference["pairs"]
        .as_array()
        .unwrap()
        .iter()
        .take(3)
        .collect();
    let query = "what is the cat";
    assert_eq!(pairs[0]["first"], query);
    let sigmoid = |l: f64| 1.0 / (1.0 + (-l).exp());
    let (status, scored) = call(
        &app,
        "POST",
        "/v1/score",
        Some(
            json!({"text_1": pairs.iter().map(|p| p["first"].clone()).collect::<Vec<_>>(),
                    "text_2": pairs.iter().map(|p| p["second"].clone()).collect::<Vec<_>>()}),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{scored}");
    for (d, p) in scored["data"].as_array().unwrap().iter().zip(&pairs) {
        let want = sigmoid(p["logit"].as_f64().unwrap());
        assert!(
            (d["score"].as_f64().unwrap() - want).abs() < 1e-5,
            "{d} vs {want}"
        );
    }
    // Rerank: the query against every second text, sorted by the same scores.
    let documents: Vec<&str> = [
        "the cat sat on the mat .",
        "a big red house",
        "the dog is in the garden",
    ]
    .to_vec();
    let (status, ranked) = call(
        &app,
        "POST",
        "/v1/rerank",
        Some(json!({"query": query, "documents": documents})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{ranked}");
    let results = ranked["results"].as_array().unwrap();
    assert_eq!(results.len(), 3);
    let scores: Vec<f64> = results
        .iter()
        .map(|r| r["relevance_score"].as_f64().unwrap())
        .collect();
    assert!(scores.windows(2).all(|w| w[0] >= w[1]), "{scores:?}");
    let first = results.iter().find(|r| r["index"] == 0).unwrap();
    assert!(
        (first["relevance_score"].as_f64().unwrap() - sigmoid(pairs[0]["logit"].as_f64().unwrap()))
            .abs()
            < 1e-5
    );
    // A cross-encoder gives no embeddings of its own: its logits are not a vector to compare.
    let (status, body) = call(
        &app,
        "POST",
        "/v1/embeddings",
        Some(json!({"input": "the cat"})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["param"], "model");
}
