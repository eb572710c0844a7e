//! A server whose "model" writes a given text: the router over an engine on the mock backend
//! with a scripted next token (the script's next token after the longest part of it the
//! row's tokens end with; the end of turn after all of it), SmolLM2's real tokenizer and chat
//! template, and the reasoning parser of the test's choice. Parsers are then tested on exact
//! outputs, whole and streamed, whatever the engine batches into each event (speculation
//! included: drafts of the script are accepted like any model's).

use std::sync::Arc;

use api::server::reasoning::ReasoningParser;
use api::server::settings::template::TemplateSetup;
use api::server::{router, AppState, Choice, ServerConfig};
use engine::backend::RankedTokens;
use engine::{
    CostCurve, EngineConfig, ManagerConfig, MockBackend, ModelTokenizer, SchedulerConfig,
    SpeculationConfig,
};
use serde_json::Value;

use super::mock_server::{call_raw, request, Server, KEY};
use crate::support::fixtures::smollm2;

/// The "model"'s next token after `seen`: where `seen` ends with the first `k` tokens of
/// `script` (the longest such), the next one; the end of turn after all of them.
fn next_token(script: &[u32], end: u32, seen: &[u32]) -> u32 {
    (0..=script.len())
        .rev()
        .find(|&k| seen.ends_with(&script[..k]))
        .and_then(|k| script.get(k).copied())
        .unwrap_or(end)
}

/// A server on SmolLM2's tokenizer whose answers are `script`, read with `parser`.
pub(crate) fn scripted_server(script: &str, parser: Option<ReasoningParser>) -> Server {
    scripted_with(script, parser, None)
}

/// `scripted_server` reading tool calls in the format `tool_format` names (the template's
/// when `None`).
pub(crate) fn scripted_with(
    script: &str,
    parser: Option<ReasoningParser>,
    tool_format: Option<&str>,
) -> Server {
    scripted_full(script, parser, tool_format, TemplateSetup::default())
}

/// `scripted_with` rendering chats with `template` (`--chat-template` and its variables).
pub(crate) fn scripted_full(
    script: &str,
    parser: Option<ReasoningParser>,
    tool_format: Option<&str>,
    template: TemplateSetup,
) -> Server {
    scripted_pieces(&[script], parser, tool_format, template)
}

/// `scripted_full` writing each of `pieces` in its own tokens (as a model writes a marker
/// that is one special token of its vocabulary: no token spans it and the text beside it).
pub(crate) fn scripted_pieces(
    pieces: &[&str],
    parser: Option<ReasoningParser>,
    tool_format: Option<&str>,
    template: TemplateSetup,
) -> Server {
    let tokenizer = &smollm2().tokenizer;
    let tokens: Vec<u32> = pieces
        .iter()
        .flat_map(|piece| tokenizer.encode_plain(piece).unwrap())
        .collect();
    let end = tokenizer.token_to_id("<|im_end|>").unwrap();
    let rule: RankedTokens = Arc::new(move |seen: &[u32]| vec![next_token(&tokens, end, seen)]);
    ranked_server(rule, parser, tool_format, template)
}

/// `scripted_with` whose "model" tries to end its answer right after the first `at` bytes of
/// `script` (its end of turn ranked first there, the script's next token second), `script`
/// ending at a token boundary there.
pub(crate) fn scripted_ending_at(script: &str, at: usize, tool_format: Option<&str>) -> Server {
    let tokenizer = &smollm2().tokenizer;
    let tokens: Vec<u32> = tokenizer.encode_plain(script).unwrap();
    let before = tokenizer.encode_plain(&script[..at]).unwrap();
    assert!(tokens.starts_with(&before), "{at} is not a token boundary");
    let end = tokenizer.token_to_id("<|im_end|>").unwrap();
    let rule: RankedTokens = Arc::new(move |seen: &[u32]| {
        let next = next_token(&tokens, end, seen);
        if seen.ends_with(&before) {
            vec![end, next]
        } else {
            vec![next]
        }
    });
    ranked_server(rule, None, tool_format, TemplateSetup::default())
}

/// A server on SmolLM2's tokenizer whose mock model ranks tokens by `rule`.
fn ranked_server(
    rule: RankedTokens,
    parser: Option<ReasoningParser>,
    tool_format: Option<&str>,
    template: TemplateSetup,
) -> Server {
    let tokenizer = Arc::new(smollm2().tokenizer.clone());
    ranked_server_on(tokenizer, rule, parser, tool_format, template)
}

/// A server on `tokenizer` (its chat template) whose mock model writes its first end token
/// at once: for what a server does before it generates (`/tokenize`).
pub(crate) fn silent_server_on(
    tokenizer: ModelTokenizer,
    parser: Option<ReasoningParser>,
) -> Server {
    let end = tokenizer.eos_ids().first().copied().unwrap_or(0);
    let rule: RankedTokens = Arc::new(move |_: &[u32]| vec![end]);
    ranked_server_on(
        Arc::new(tokenizer),
        rule,
        parser,
        None,
        TemplateSetup::default(),
    )
}

/// A server on `tokenizer` whose mock model ranks tokens by `rule`.
fn ranked_server_on(
    tokenizer: Arc<ModelTokenizer>,
    rule: RankedTokens,
    parser: Option<ReasoningParser>,
    tool_format: Option<&str>,
    template: TemplateSetup,
) -> Server {
    let vocab = tokenizer.inner().get_vocab_size(true);
    let kv = ManagerConfig {
        num_blocks: 256,
        block_size: 16,
        prefix_caching: true,
        watermark: 0.0,
        window: None,
    };
    let config = EngineConfig {
        scheduler: SchedulerConfig {
            max_num_batched_tokens: 256,
            max_num_seqs: 8,
            max_model_len: 512,
            kv,
        },
        max_pending: 16,
        speculation: SpeculationConfig {
            cost: CostCurve::flat(),
            ..SpeculationConfig::default()
        },
        kv_prefault: false,
        state_snapshots: Default::default(),
    };
    let backend = MockBackend::ranked(vocab, kv.num_blocks * kv.block_size, rule);
    let eos = tokenizer.eos_ids().to_vec();
    let (engine, _) =
        engine::spawn_with_backend(Box::new(backend), tokenizer, eos, config).unwrap();
    let state = AppState::new(ServerConfig {
        served_model_name: "scripted".into(),
        api_key: Some(KEY.into()),
        max_body_bytes: 1 << 20,
        reasoning_parser: parser.map_or(Choice::Off, Choice::Use),
        tool_call_parser: tool_format.map_or(Choice::Auto, |name| {
            Choice::Use(api::server::tools::tool_format(name).unwrap())
        }),
        template,
    });
    state.set_engine(engine.clone());
    Server {
        app: router(state.clone()),
        state,
        engine,
        _dir: tempfile::tempdir().unwrap(),
    }
}

/// The events of `body` sent to `path` with `stream: true` (a 200 asserted).
pub(crate) async fn streamed(
    app: &axum::Router,
    path: &str,
    mut body: Value,
) -> Vec<(Option<String>, Value)> {
    body["stream"] = serde_json::json!(true);
    let req = request("POST", path, Some(body.to_string().into_bytes()), Some(KEY));
    let (status, _, bytes) = call_raw(app, req).await;
    assert_eq!(
        status,
        axum::http::StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&bytes)
    );
    events(&bytes)
}

/// The events of an SSE body: each event's name (if named) and its data (`[DONE]` as a
/// JSON string).
pub(crate) fn events(bytes: &[u8]) -> Vec<(Option<String>, Value)> {
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    text.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|event| {
            let mut name = None;
            let mut data = String::new();
            for line in event.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = Some(n.to_string());
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data.push_str(d);
                }
            }
            let value = serde_json::from_str(&data).unwrap_or(Value::String(data));
            (name, value)
        })
        .collect()
}

#[test]
fn the_script_continues_from_the_longest_part_already_written() {
    let script = [5, 6, 5, 7];
    assert_eq!(next_token(&script, 0, &[1, 2]), 5);
    assert_eq!(next_token(&script, 0, &[1, 5]), 6);
    assert_eq!(next_token(&script, 0, &[1, 5, 6, 5]), 7);
    assert_eq!(next_token(&script, 0, &[1, 5, 6, 5, 7]), 0);
}
