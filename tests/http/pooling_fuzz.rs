//! Random and malformed bodies on the pooling routes of the real MiniLM encoder: every answer
//! is a 200 or a 4xx in OpenAI's error shape, never a 5xx, and the encoder still answers
//! afterwards (nothing a client sends can stop its thread).

use axum::http::StatusCode;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use super::mock_server::{assert_error, call};
use super::pooling::minilm_server;

/// A random JSON value, nested at most `depth` deep.
fn value(rng: &mut StdRng, depth: u32) -> Value {
    match rng.random_range(0..if depth == 0 { 6 } else { 8 }) {
        0 => Value::Null,
        1 => json!(rng.random_bool(0.5)),
        2 => json!(rng.random_range(-3i64..40_000)),
        3 => json!(rng.random_range(-2.0f64..2.0)),
        4 => json!(
            [
                "",
                "a",
                "the cat",
                "word ".repeat(300).as_str(),
                "ü🙂",
                "[CLS]"
            ][rng.random_range(0..6)]
        ),
        5 => json!(-1),
        6 => Value::Array(
            (0..rng.random_range(0..4))
                .map(|_| value(rng, depth - 1))
                .collect(),
        ),
        _ => {
            let keys = ["text", "input", "x"];
            Value::Object(
                (0..rng.random_range(0..3))
                    .map(|i| (keys[i % 3].to_string(), value(rng, depth - 1)))
                    .collect(),
            )
        }
    }
}

/// A value `field` accepts.
fn valid(field: &str, rng: &mut StdRng) -> Value {
    let pick =
        |rng: &mut StdRng, options: &[Value]| options[rng.random_range(0..options.len())].clone();
    match field {
        "input" | "documents" | "text_2" => pick(
            rng,
            &[
                json!("the cat"),
                json!(["a", "b c"]),
                json!([101, 1996, 102]),
            ],
        ),
        "query" | "text_1" => json!("where is the dog"),
        "encoding_format" => pick(rng, &[json!("float"), json!("base64")]),
        "dimensions" => json!(384),
        "truncate_prompt_tokens" => pick(rng, &[json!(-1), json!(8)]),
        "model" => json!("minilm"),
        "top_n" => json!(1),
        _ => json!(rng.random_bool(0.5)),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn random_bodies_get_answers_or_clear_client_errors() {
    let app = minilm_server(512);
    let mut rng = StdRng::seed_from_u64(81);
    let routes: [(&str, &[&str]); 3] = [
        (
            "/v1/embeddings",
            &[
                "input",
                "encoding_format",
                "dimensions",
                "truncate_prompt_tokens",
                "model",
            ],
        ),
        (
            "/v1/rerank",
            &[
                "query",
                "documents",
                "top_n",
                "return_documents",
                "truncate_prompt_tokens",
            ],
        ),
        (
            "/v1/score",
            &["text_1", "text_2", "truncate_prompt_tokens", "model"],
        ),
    ];
    let (mut ok, mut refused) = (0, 0);
    for _ in 0..300 {
        let (path, fields) = routes[rng.random_range(0..routes.len())];
        let mut body = serde_json::Map::new();
        for field in fields.iter() {
            if rng.random_bool(0.8) {
                // Mostly a value the route takes, so that answers come too.
                let v = match rng.random_bool(0.75) {
                    true => valid(field, &mut rng),
                    false => value(&mut rng, 2),
                };
                body.insert(field.to_string(), v);
            }
        }
        let (status, answer) = call(&app, "POST", path, Some(Value::Object(body.clone()))).await;
        if status == StatusCode::OK {
            ok += 1;
        } else {
            assert!(
                status.is_client_error(),
                "{path} {} -> {status}: {answer}",
                Value::Object(body)
            );
            assert_error(status, &answer, status);
            refused += 1;
        }
    }
    eprintln!("{ok} answered, {refused} refused");
    assert!(
        ok >= 20 && refused >= 20,
        "{ok} answered, {refused} refused"
    );
    let (status, body) = call(
        &app,
        "POST",
        "/v1/embeddings",
        Some(json!({"input": "still here"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
}
