//! `POST /v1/completions`: the body is validated here (`suffix`, `echo` with `logprobs`,
//! `best_of`, one to [`MAX_PROMPTS`] prompts as text or token ids), each prompt submitted
//! through the shared pipeline, and the choices answered whole or streamed in the legacy
//! completions shape ([`response`]).

pub mod request;
pub mod response;

use axum::extract::State;
use axum::response::Response;

use self::request::{CompletionRequest, PromptInput};
use crate::server::body::GenerationBody;
use crate::server::error::{ApiError, ApiResult};
use crate::server::openai::body::Endpoint;
use crate::server::openai::respond::respond;
use crate::server::pipeline::{off_runtime, submit_all, Started};
use crate::server::settings::{settings, DEFAULT_COMPLETION_TOKENS};
use crate::server::AppState;

/// Most prompts in one completions request.
pub const MAX_PROMPTS: usize = 256;

/// `POST /v1/completions`.
pub(in crate::server) async fn create(
    State(state): State<AppState>,
    GenerationBody(body): GenerationBody<CompletionRequest>,
) -> ApiResult<Response> {
    let started = off_runtime(state, move |state| start_completion(state, body)).await?;
    respond(started, Endpoint::Completion).await
}

/// Validates a `/v1/completions` body and submits its prompts.
pub fn start_completion(state: &AppState, body: CompletionRequest) -> ApiResult<Started> {
    let engine = state.engine()?;
    state.check_model(body.common.model.as_deref())?;
    let limits = engine.limits();
    if body.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::invalid("suffix", "suffix is not supported"));
    }
    let echo = body.echo.unwrap_or(false);
    if echo && body.logprobs.is_some() {
        return Err(ApiError::invalid(
            "echo",
            "echo together with logprobs is not supported (prompt log-probabilities are not computed)",
        ));
    }
    let mut settings = settings(&body.common, body.common.max_tokens, body.logprobs, limits)?;
    settings.predict(engine.tokenizer())?;
    if let Some(best_of) = body.best_of {
        if best_of != settings.options.n {
            return Err(ApiError::invalid(
                "best_of",
                "only best_of equal to n is supported",
            ));
        }
    }
    let tokenizer = engine.tokenizer();
    let encode = |text: &str| {
        tokenizer
            .encode(text)
            .map_err(|e| ApiError::invalid("prompt", e.to_string()))
    };
    let prompts: Vec<Vec<u32>> = match body.prompt {
        None => return Err(ApiError::invalid("prompt", "prompt is required")),
        Some(PromptInput::Text(text)) => vec![encode(&text)?],
        Some(PromptInput::Texts(texts)) => {
            texts.iter().map(|t| encode(t)).collect::<ApiResult<_>>()?
        }
        Some(PromptInput::Tokens(ids)) => vec![ids],
        Some(PromptInput::TokenLists(lists)) => lists,
    };
    if prompts.is_empty() {
        return Err(ApiError::invalid("prompt", "the prompt list is empty"));
    }
    if prompts.len() > MAX_PROMPTS {
        return Err(ApiError::invalid(
            "prompt",
            format!("at most {MAX_PROMPTS} prompts in one request"),
        ));
    }
    let echoes = prompts
        .iter()
        .map(|p| {
            echo.then(|| tokenizer.decode_skip_special(p))
                .transpose()
                .map_err(|e| ApiError::invalid("prompt", e.to_string()))
        })
        .collect::<ApiResult<Vec<_>>>()?;
    let submitted = submit_all(
        engine,
        &settings,
        prompts.into_iter().zip(echoes),
        Some(DEFAULT_COMPLETION_TOKENS),
    )?;
    Ok(Started {
        model: state.model_name().to_string(),
        tokenizer: tokenizer.clone(),
        options: settings.options,
        submitted,
        calls: None,
    })
}
