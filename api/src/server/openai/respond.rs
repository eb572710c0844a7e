//! How a started chat or completions request is answered in OpenAI's shapes: whole, once
//! every choice has finished ([`body`]), or as server-sent events when it streams
//! ([`respond`]).

use axum::response::{IntoResponse, Response};
use axum::Json;
use engine::handle::RequestStream;
use engine::{Event, Failure, ModelTokenizer};

use super::body::{full_response, Endpoint, ResponseMeta};
use super::choice::ChoiceState;
use super::stream::sse_response;
use crate::server::error::{engine_failure, not_generated, ApiResult};
use crate::server::pipeline::Started;
use crate::server::reasoning::Reasoning;

/// The whole (non-streamed) response body, once every choice has finished: exactly what
/// the endpoint answers with.
pub async fn body(started: Started, endpoint: Endpoint) -> ApiResult<serde_json::Value> {
    let meta = ResponseMeta::new(endpoint, &started.model);
    let n = started.options.n;
    let mut choices = Vec::with_capacity(started.submitted.len() * n);
    let mut echoes = Vec::with_capacity(started.submitted.len());
    for s in started.submitted {
        let reasoning = started.options.reasoning.map(|r| (r, &*started.tokenizer));
        let field = started.options.format_field;
        choices.extend(collect(&s.stream, n, field, reasoning).await?);
        echoes.push(s.echo);
    }
    Ok(full_response(
        &meta,
        &started.tokenizer,
        &choices,
        &echoes,
        &started.options,
        started.calls.as_ref(),
    ))
}

/// The endpoint's answer: server-sent events when the request streams, else the whole
/// body.
pub async fn respond(started: Started, endpoint: Endpoint) -> ApiResult<Response> {
    if started.options.stream {
        return Ok(sse_response(
            ResponseMeta::new(endpoint, &started.model),
            started.tokenizer,
            started.options,
            started.submitted,
            started.calls,
        ));
    }
    Ok(Json(body(started, endpoint).await?).into_response())
}

/// Waits for all `n` choices of one request.
async fn collect(
    stream: &RequestStream,
    n: usize,
    format_field: &str,
    reasoning: Option<(Reasoning, &ModelTokenizer)>,
) -> ApiResult<Vec<ChoiceState>> {
    let mut choices = vec![ChoiceState::default(); n];
    let mut open = n;
    while open > 0 {
        match stream.recv_async().await {
            Some(Event::Output {
                index,
                text,
                logprobs,
                token_ids,
            }) => {
                if let Some(c) = choices.get_mut(index) {
                    c.text.push_str(&text);
                    c.logprobs.extend(logprobs);
                    if reasoning.is_some() {
                        c.token_ids.extend(token_ids);
                    }
                }
            }
            Some(Event::Finished {
                index,
                reason,
                usage,
            }) => {
                if let Some(c) = choices.get_mut(index) {
                    c.finish(reason, usage, reasoning);
                    open -= 1;
                }
            }
            Some(Event::Error(failure)) => return Err(engine_failure(&failure, format_field)),
            Some(Event::Pooled { .. }) => return Err(engine_failure(&not_generated(), "")),
            None => return Err(engine_failure(&Failure::engine("the engine stopped"), "")),
        }
    }
    Ok(choices)
}
