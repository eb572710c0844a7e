//! The event plumbing of the adapters' streams: a front end turns each part of an answer
//! (or the failure that ends it) into events of its API ([`AnswerEvents`]), queued in an
//! [`Outbox`] that names each event, sets its `type`, and numbers it (`sequence_number`)
//! where the API does; [`sse`] sends them as server-sent events until the last is queued.

use std::collections::VecDeque;
use std::convert::Infallible;

use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream;

use crate::server::answer::{Answer, Part};
use crate::server::error::ApiError;

/// The events a streamed answer has ready to send, and whether its stream has ended.
pub struct Outbox {
    events: VecDeque<SseEvent>,
    /// The next event's `sequence_number`, where the API numbers its events.
    sequence: Option<u64>,
    /// Set once the last event is queued.
    pub ended: bool,
}

impl Outbox {
    fn new(numbered: bool) -> Self {
        Self {
            events: VecDeque::new(),
            sequence: numbered.then_some(0),
            ended: false,
        }
    }

    /// Queues the event `kind` with `data` (its `sequence_number` set where events are
    /// numbered, then its `type` set to `kind`).
    pub fn push(&mut self, kind: &str, mut data: serde_json::Value) {
        if let Some(sequence) = self.sequence.as_mut() {
            data["sequence_number"] = serde_json::json!(*sequence);
            *sequence += 1;
        }
        data["type"] = serde_json::Value::from(kind);
        self.events
            .push_back(SseEvent::default().event(kind).data(data.to_string()));
    }
}

/// A front end's stream of server-sent events over an answer: it turns each part (or the
/// failure that ends the answer) into events of its API, queued in the [`Outbox`].
pub trait AnswerEvents: Send + 'static {
    /// Whether each event carries a `sequence_number` (0, 1, ...).
    const NUMBERED: bool = false;
    /// Queues the events that open the stream.
    fn open(&mut self, out: &mut Outbox);
    /// Queues the events of `part`.
    fn part(&mut self, part: Part, out: &mut Outbox);
    /// Queues the events that end a failed answer.
    fn failed(&mut self, e: ApiError, out: &mut Outbox);
}

/// The server-sent events response of `answer`, written by `writer`.
pub fn sse<T: AnswerEvents>(answer: Answer, mut writer: T) -> Response {
    let mut outbox = Outbox::new(T::NUMBERED);
    writer.open(&mut outbox);
    let state = (answer, writer, outbox);
    let body = stream::unfold(state, |(mut answer, mut writer, mut outbox)| async move {
        loop {
            if let Some(event) = outbox.events.pop_front() {
                return Some((Ok::<_, Infallible>(event), (answer, writer, outbox)));
            }
            if outbox.ended {
                return None;
            }
            match answer.next().await {
                Some(Ok(part)) => writer.part(part, &mut outbox),
                Some(Err(e)) => writer.failed(e, &mut outbox),
                None => writer.failed(
                    ApiError::internal("the answer ended without finishing"),
                    &mut outbox,
                ),
            }
        }
    });
    Sse::new(body).into_response()
}
