//! Decoders as embedders and rerankers. A generating model served with a pooling task
//! ([`DecoderTask`]) answers the pooling routes through the engine's own scheduler: each input
//! is a prefill-only request (`Request::pooling`) that shares the step's forward with
//! generation, reads and fills the prefix cache (and a hybrid's state snapshots), and ends at
//! its last prompt token. An embedder takes that token's final-normed state, normalized
//! (last-token pooling, Qwen3-Embedding's recipe); a reranker the logits of `no` and `yes`
//! after its templated prompt (Qwen3-Reranker's recipe), whose score is the sigmoid of their
//! difference, the probability of `yes` between the two. [`DecoderText`] is how such a model
//! reads its inputs: the special tokens its tokenizer puts around a text, and the
//! reranker's template around a pair.

use std::str::FromStr;
use std::sync::Arc;

use super::bert::EncoderInput;
use super::config::{EncoderTask, Pooling as EncoderPooling, PoolingMode};
use super::model::EncoderTokenizer;
use super::pooling::normalize;
use super::serve::{EncodeError, EncoderHandle};
use crate::handle::{EngineHandle, RequestStream, SubmitError};
use crate::request::{Event, Pooling, Request};
use crate::{Error, Result};

/// What a decoder served for pooling computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecoderTask {
    /// One vector per input: its last token's final-normed state, normalized.
    Embed,
    /// One score per (query, document) pair: `P(yes)` against `no` after the template.
    Rerank,
}

impl FromStr for DecoderTask {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "embed" => Ok(Self::Embed),
            "rerank" | "score" | "classify" => Ok(Self::Rerank),
            other => Err(format!(
                "unknown task '{other}' (expected generate, embed or rerank)"
            )),
        }
    }
}

/// The system turn of Qwen3-Reranker's template, up to the user's turn.
const RERANK_PREFIX: &str = "<|im_start|>system\nJudge whether the Document meets the \
    requirements based on the Query and the Instruct provided. Note that the answer can only \
    be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n";
/// What follows the pair: the assistant's turn with an empty thought.
const RERANK_SUFFIX: &str = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
/// The instruction a pair is judged under unless the request gives one.
pub const DEFAULT_RERANK_INSTRUCTION: &str =
    "Given a web search query, retrieve relevant passages that answer the query";

/// How a decoder that pools reads its inputs.
#[derive(Debug, Clone)]
pub struct DecoderText {
    /// Tokens before a text (the tokenizer's BOS, where it adds one).
    before: Vec<u32>,
    /// Tokens after a text (the end token an embedding model's tokenizer appends).
    after: Vec<u32>,
    /// A reranker's template around a pair.
    pair: Option<PairTemplate>,
}

/// Qwen3-Reranker's prompt: `prefix`, then `<Instruct>: ...\n<Query>: ...\n<Document>: ...`
/// tokenized on its own (and cut from its end when truncated), then `suffix`.
#[derive(Debug, Clone)]
struct PairTemplate {
    prefix: Vec<u32>,
    suffix: Vec<u32>,
    instruction: String,
}

impl DecoderText {
    /// What the special tokens of `tokenizer` put around a text: those its own
    /// post-processor adds (a `tokenizer.json` whose template appends `<|endoftext|>`, as
    /// Qwen3-Embedding's does), else `start` and `end` (from the model's metadata).
    fn new(tokenizer: &tokenizers::Tokenizer, start: Vec<u32>, end: Vec<u32>) -> Result<Self> {
        let probe = |special: bool| -> Result<Vec<u32>> {
            tokenizer
                .encode("a", special)
                .map(|e| e.get_ids().to_vec())
                .map_err(|e| Error::Tokenizer(e.to_string()))
        };
        let (plain, special) = (probe(false)?, probe(true)?);
        let at = special
            .windows(plain.len().max(1))
            .position(|w| w == plain.as_slice());
        let (mut before, mut after) = match at {
            Some(at) if !plain.is_empty() => {
                (special[..at].to_vec(), special[at + plain.len()..].to_vec())
            }
            _ => (Vec::new(), Vec::new()),
        };
        if before.is_empty() {
            before = start;
        }
        if after.is_empty() {
            after = end;
        }
        Ok(Self {
            before,
            after,
            pair: None,
        })
    }

    fn plain(tok: &EncoderTokenizer, text: &str) -> std::result::Result<Vec<u32>, String> {
        tok.inner
            .encode(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| e.to_string())
    }

    /// `text` between the model's special tokens; truncation cuts the text's end.
    pub(super) fn text(
        &self,
        tok: &EncoderTokenizer,
        text: &str,
        truncate: Option<usize>,
    ) -> std::result::Result<EncoderInput, String> {
        let body = Self::plain(tok, text)?;
        self.assemble(tok, &self.before, body, &self.after, truncate)
    }

    /// Whether it reads pairs (a reranker's template).
    pub(super) fn reads_pairs(&self) -> bool {
        self.pair.is_some()
    }

    /// A (query, document) pair in the reranker's template, under `instruction` or the
    /// template's own; truncation cuts the pair's end.
    pub(super) fn pair(
        &self,
        tok: &EncoderTokenizer,
        query: &str,
        document: &str,
        truncate: Option<usize>,
        instruction: Option<&str>,
    ) -> std::result::Result<EncoderInput, String> {
        let Some(t) = &self.pair else {
            return Err("this model embeds texts; it does not read pairs".into());
        };
        let instruction = instruction.unwrap_or(&t.instruction);
        let body = format!("<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}");
        let body = Self::plain(tok, &body)?;
        self.assemble(tok, &t.prefix, body, &t.suffix, truncate)
    }

    fn assemble(
        &self,
        tok: &EncoderTokenizer,
        before: &[u32],
        mut body: Vec<u32>,
        after: &[u32],
        truncate: Option<usize>,
    ) -> std::result::Result<EncoderInput, String> {
        let limit = tok.limit(truncate)?;
        let fixed = before.len() + after.len();
        if fixed + body.len() > limit {
            if truncate.is_none() {
                return Err(tok.too_long(fixed + body.len()));
            }
            if fixed >= limit {
                return Err(format!(
                    "truncation to {limit} tokens leaves nothing of the input after the \
                     model's {fixed} fixed tokens"
                ));
            }
            body.truncate(limit - fixed);
        }
        if body.is_empty() && fixed == 0 {
            return Err("an input has no tokens".into());
        }
        let mut ids = Vec::with_capacity(fixed + body.len());
        ids.extend_from_slice(before);
        ids.extend(body);
        ids.extend_from_slice(after);
        Ok(EncoderInput {
            ids,
            types: Vec::new(),
        })
    }
}

/// Inputs of one job submitted to the engine at once: a job of many inputs goes in waves, so
/// that it needs no more room in the engine's queue than this.
const WAVE: usize = 256;

/// How a pooling request's answer becomes the route's vector.
#[derive(Debug, Clone)]
pub(super) struct EnginePooling {
    engine: EngineHandle,
    task: DecoderTask,
    /// A reranker's `no` and `yes` tokens.
    answers: Option<Arc<[u32]>>,
}

impl EnginePooling {
    /// Runs every input as a prefill-only request of the engine, submitted together (in
    /// waves of [`WAVE`]) so that they share steps; an embedding comes back normalized, a
    /// pair's score as the single logit `yes - no`.
    pub(super) async fn pool(
        &self,
        inputs: Vec<EncoderInput>,
    ) -> std::result::Result<Vec<Vec<f32>>, EncodeError> {
        let pooling = match &self.answers {
            Some(answers) => Pooling::Logits(Arc::clone(answers)),
            None => Pooling::State,
        };
        let mut out = Vec::with_capacity(inputs.len());
        let mut inputs = inputs.into_iter().peekable();
        while inputs.peek().is_some() {
            let wave: Vec<Request> = inputs
                .by_ref()
                .take(WAVE)
                .map(|input| Request::pooling(input.ids, pooling.clone()))
                .collect();
            let streams = self.engine.submit_all(wave).map_err(|e| match e {
                SubmitError::Invalid(e) => EncodeError::Invalid(e.to_string()),
                SubmitError::Overloaded(pending) => EncodeError::Overloaded(pending),
                SubmitError::Stopped => EncodeError::Stopped("the engine has stopped".into()),
            })?;
            for stream in streams {
                out.push(self.answer(stream).await?);
            }
        }
        Ok(out)
    }

    /// One input's vector from its request's events.
    async fn answer(&self, stream: RequestStream) -> std::result::Result<Vec<f32>, EncodeError> {
        let values = loop {
            match stream.recv_async().await {
                Some(Event::Pooled { values, .. }) => break values,
                Some(Event::Error(failure)) => return Err(EncodeError::Stopped(failure.message)),
                Some(_) => {}
                None => {
                    return Err(EncodeError::Stopped(
                        "the engine stopped before the input was read".into(),
                    ))
                }
            }
        };
        match self.task {
            DecoderTask::Embed => {
                let mut v = values;
                normalize(&mut v);
                Ok(v)
            }
            DecoderTask::Rerank => match values.as_slice() {
                [no, yes] => Ok(vec![yes - no]),
                _ => Err(EncodeError::Stopped("the engine gave no logits".into())),
            },
        }
    }

    /// Whether the engine still runs.
    pub(super) fn is_running(&self) -> bool {
        self.engine.is_running()
    }
}

/// The pooling front door of the engine behind `engine`, whose model is a decoder with a
/// residual of `hidden_size`, serving `task`.
pub fn decoder_pooler(
    engine: EngineHandle,
    task: DecoderTask,
    hidden_size: usize,
) -> Result<EncoderHandle> {
    if task == DecoderTask::Embed && !engine.returns_states() {
        return Err(Error::Config(
            "--task embed reads the model's final-normed states, which this backend does              not return (it gives logits only): serve the embedder on the CPU"
                .into(),
        ));
    }
    let model_tokenizer = Arc::clone(engine.tokenizer());
    let mut inner = model_tokenizer.inner().clone();
    inner.with_padding(None);
    // Clearing truncation cannot fail (only a stride past the length can).
    let _ = inner.with_truncation(None);
    let mut text = DecoderText::new(
        &inner,
        model_tokenizer.input_start(),
        model_tokenizer.input_end(),
    )?;
    let answers = match task {
        DecoderTask::Embed => None,
        DecoderTask::Rerank => {
            let id = |token: &str| {
                model_tokenizer.token_to_id(token).ok_or_else(|| {
                    Error::Config(format!(
                        "--task rerank reads the logits of the tokens 'no' and 'yes', and \
                         this model's vocabulary has no '{token}'"
                    ))
                })
            };
            let answers: Arc<[u32]> = Arc::from([id("no")?, id("yes")?]);
            let encode = |s: &str| -> Result<Vec<u32>> {
                inner
                    .encode(s, false)
                    .map(|e| e.get_ids().to_vec())
                    .map_err(|e| Error::Tokenizer(e.to_string()))
            };
            text.pair = Some(PairTemplate {
                prefix: encode(RERANK_PREFIX)?,
                suffix: encode(RERANK_SUFFIX)?,
                instruction: DEFAULT_RERANK_INSTRUCTION.into(),
            });
            Some(answers)
        }
    };
    let limits = engine.limits();
    let tokenizer = EncoderTokenizer {
        inner,
        // A prompt leaves room for one generated token, which a pooling request never takes.
        max_length: limits.max_model_len.saturating_sub(1),
        vocab_size: limits.vocab_size,
        decoder: Some(text),
    };
    let encoder_task = match task {
        DecoderTask::Embed => EncoderTask::Embed(EncoderPooling {
            mode: PoolingMode::Last,
            normalize: true,
        }),
        DecoderTask::Rerank => EncoderTask::Classify { labels: 1 },
    };
    let pooling = EnginePooling {
        engine,
        task,
        answers,
    };
    Ok(EncoderHandle::on_engine(
        pooling,
        Arc::new(tokenizer),
        encoder_task,
        hidden_size,
    ))
}
