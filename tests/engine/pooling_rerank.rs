//! A decoder served as a reranker (`DecoderTask::Rerank`) on SmolLM2, a ChatML model whose
//! vocabulary has `yes` and `no`: a pair is read in Qwen3-Reranker's template (its system turn
//! and empty thought around `<Instruct>: ...\n<Query>: ...\n<Document>: ...`, each part
//! tokenized on its own, as the model card builds it), and its logit is the model's own
//! `yes - no` at the last token, as a plain forward of the same ids gives them; truncation
//! cuts the document's end, never the template. A request's `instruction` replaces the
//! template's own (`/v1/rerank` and `/v1/score` take it; a bad one is a 400 naming it).

use engine::encoder::decoder::DEFAULT_RERANK_INSTRUCTION;
use engine::encoder::{decoder_pooler, DecoderTask};
use engine::{EngineConfig, LogitRows, TokenTree, TreeBatch};

use axum::http::StatusCode;
use serde_json::json;

use super::pooling::engine_config;
use crate::http::mock_server::{assert_error, call};
use crate::http::pooling::encoder_app;
use crate::support::fixtures::{one_sequence, smollm2, spawn_smollm2};

const PREFIX: &str = "<|im_start|>system\nJudge whether the Document meets the requirements \
    based on the Query and the Instruct provided. Note that the answer can only be \"yes\" or \
    \"no\".<|im_end|>\n<|im_start|>user\n";
const SUFFIX: &str = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";

fn config() -> EngineConfig {
    engine_config(64, 512, 16)
}

#[test]
fn a_reranking_decoder_reads_the_template_and_gives_yes_minus_no() {
    let loaded = smollm2();
    let tokenizer = &loaded.tokenizer;
    let pooler = decoder_pooler(spawn_smollm2(config()), DecoderTask::Rerank, 576).unwrap();
    let (query, document) = (
        "What is the capital of France?",
        "Paris is the capital of France.",
    );
    let input = pooler.tokenizer().pair(query, document, None).unwrap();
    let body = format!(
        "<Instruct>: {DEFAULT_RERANK_INSTRUCTION}\n<Query>: {query}\n<Document>: {document}"
    );
    let parts = [PREFIX, &body, SUFFIX].map(|s| tokenizer.encode_plain(s).unwrap());
    assert_eq!(input.ids, parts.concat());
    // The engine's logit (prefill-only, 64-token steps) is a plain forward's yes - no.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let ours = runtime
        .block_on(pooler.encode(vec![input.clone()]))
        .unwrap();
    let (table, mut kv) = one_sequence(&loaded.model, input.ids.len(), 16);
    let mut batch = TreeBatch::new(16);
    batch
        .push(0, &table, &TokenTree::chain(&input.ids), LogitRows::Last)
        .unwrap();
    let logits = loaded.model.forward(&batch, &mut kv).unwrap();
    let logits = logits.to_vec2::<f32>().unwrap().remove(0);
    let id = |t: &str| tokenizer.token_to_id(t).unwrap() as usize;
    let expected = logits[id("yes")] - logits[id("no")];
    assert_eq!(ours[0].len(), 1);
    // The engine ran the prompt in chunks over a cached f16 K/V, the plain forward at once.
    assert!(
        (ours[0][0] - expected).abs() < 0.05 * expected.abs().max(1.0),
        "{} against {expected}",
        ours[0][0]
    );
    // Truncation keeps the template whole and cuts the document's end.
    let cut = pooler
        .tokenizer()
        .pair(query, document, Some(input.ids.len() - 3))
        .unwrap();
    assert_eq!(cut.ids.len(), input.ids.len() - 3);
    assert!(cut.ids.starts_with(&parts[0]) && cut.ids.ends_with(&parts[2]));
    assert_eq!(
        cut.ids[parts[0].len()..cut.ids.len() - parts[2].len()],
        parts[1][..parts[1].len() - 3]
    );
    assert!(pooler.tokenizer().pair(query, document, Some(10)).is_err());
    let too_long = pooler.tokenizer().pair(query, &"word ".repeat(600), None);
    assert!(too_long.unwrap_err().contains("at most 511"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_instruction_replaces_the_templates_own() {
    let pooler = decoder_pooler(spawn_smollm2(config()), DecoderTask::Rerank, 576).unwrap();
    let tokenizer = pooler.tokenizer().clone();
    let instruction = "Find the sentence about the weather";
    let (query, documents) = ("Is it sunny?", ["The sky is clear.", "He drove home."]);
    let instructed: Vec<_> = documents
        .iter()
        .map(|d| {
            tokenizer
                .pair_instructed(query, d, None, Some(instruction))
                .unwrap()
        })
        .collect();
    let plain = tokenizer.pair(query, documents[0], None).unwrap();
    assert_ne!(instructed[0].ids, plain.ids);
    let body = smollm2()
        .tokenizer
        .encode_plain(&format!(
            "<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {}",
            documents[0]
        ))
        .unwrap();
    assert!(instructed[0].ids.windows(body.len()).any(|w| w == body));
    let logits = pooler.encode(instructed).await.unwrap();
    let app = encoder_app(pooler, "reranker");
    let (status, answer) = call(
        &app,
        "POST",
        "/v1/score",
        Some(json!({"text_1": query, "text_2": documents, "instruction": instruction})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    for (d, logit) in answer["data"].as_array().unwrap().iter().zip(&logits) {
        let want = 1.0 / (1.0 + (-logit[0]).exp());
        let got = d["score"].as_f64().unwrap() as f32;
        assert!((got - want).abs() < 1e-5, "{got} vs {want}");
    }
    for bad in [json!(""), json!(5)] {
        let (status, err) = call(
            &app,
            "POST",
            "/v1/rerank",
            Some(json!({"query": query, "documents": documents, "instruction": bad})),
        )
        .await;
        assert_eq!(
            assert_error(status, &err, StatusCode::BAD_REQUEST),
            "instruction"
        );
    }
}
