//! The last stage of a step: each new token of a sample becomes output, in order. Its stop
//! conditions are checked (end of sequence, stop tokens, stop strings, length), its text is
//! detokenized and filtered, latency metrics are recorded, and the events go out; a finished
//! sample leaves the engine (its sequence, its drafter) and reports its usage.

use std::time::Instant;

use kvcache::SeqId;

use super::step_output::Emissions;
use super::Engine;
use crate::metrics as names;
use crate::request::{Event, FinishReason, Usage};
use crate::sampler::Sampled;
use crate::Result;

impl Engine {
    /// Emits every sequence's new tokens in order, up to the one that finishes its sample;
    /// a sequence all of whose tokens went out settles its draft counts with them.
    pub(super) fn emit_all(&mut self, emissions: Emissions) -> Result<()> {
        for (seq, tokens) in emissions {
            let mut finished = false;
            for (i, sampled) in tokens.into_iter().enumerate() {
                if self.emit(seq, sampled, i + 1)? {
                    finished = true;
                    break;
                }
            }
            // Every token of its tree went out: its draft counts do too.
            if !finished {
                self.settle(seq, usize::MAX);
            }
        }
        Ok(())
    }

    /// `seq_id`'s request (a pooling one) ends with `values`, read off its last prompt row.
    pub(super) fn finish_pooled(&mut self, seq_id: SeqId, values: Vec<f32>) {
        let Some(request_id) = self.records.get(&seq_id).map(|r| r.request) else {
            return;
        };
        let Some(request) = self.requests.get(&request_id) else {
            return;
        };
        let usage = Usage {
            prompt_tokens: request.request.prompt.len(),
            cached_tokens: request.cached_tokens,
            ..Usage::default()
        };
        let events = request.events.clone();
        // Out of the pending count before its answer is out, so that a client may submit
        // again as soon as it has read it.
        self.remove_request(request_id);
        let _ = events.send(Event::Pooled { values, usage });
    }

    /// The speculation counts of `seq_id`'s last verified tree go to its totals and the
    /// metrics, its accepted drafts among the first `emitted` tokens of its path only.
    pub(super) fn settle(&mut self, seq_id: SeqId, emitted: usize) {
        if let Some(drafter) = self
            .records
            .get_mut(&seq_id)
            .and_then(|r| r.drafter.as_mut())
        {
            drafter.settle(emitted);
        }
    }

    /// Records `sampled` as the newest output of `seq_id`, the `nth` token it emits this
    /// step, checks stop conditions and sends the events. Returns true when the sample
    /// finished (it is then gone, its usage counting only the tokens it output).
    pub(super) fn emit(&mut self, seq_id: SeqId, sampled: Sampled, nth: usize) -> Result<bool> {
        let Sampled {
            token_id: token,
            logprob,
        } = sampled;
        let now = Instant::now();
        let max_model_len = self.scheduler.config().max_model_len;
        let Some(state) = self.records.get_mut(&seq_id) else {
            return Ok(true);
        };
        let Some(request) = self.requests.get_mut(&state.request) else {
            return Ok(true);
        };
        state.num_output += 1;
        match state.last_token_at {
            Some(at) => {
                metrics::histogram!(names::INTER_TOKEN_LATENCY).record((now - at).as_secs_f64())
            }
            None if request.first_token_at.is_none() => {
                request.first_token_at = Some(now);
                metrics::histogram!(names::TIME_TO_FIRST_TOKEN)
                    .record((now - request.submitted).as_secs_f64());
            }
            None => {}
        }
        state.last_token_at = Some(now);
        metrics::counter!(names::GENERATED_TOKENS).increment(1);

        let stop = &request.request.stop;
        let past_min = state.num_output >= stop.min_tokens;
        let mut finish = None;
        if past_min && !stop.ignore_eos && self.eos_ids.contains(&token) {
            finish = Some(FinishReason::Eos);
        } else if past_min && stop.stop_token_ids.contains(&token) && state.may_stop() {
            finish = Some(FinishReason::StopToken(token));
        }
        let mut text = String::new();
        if finish.is_none() {
            let piece = state.detokenizer.push(&self.tokenizer, token)?;
            let (shown, stopped) = state.filter.push(&piece);
            text = shown;
            finish = stopped.map(FinishReason::StopString);
            state.emitted();
        }
        if finish.is_none()
            && (state.num_output >= stop.max_tokens
                || request.request.prompt.len() + state.num_output >= max_model_len)
        {
            finish = Some(FinishReason::Length);
        }
        if matches!(
            finish,
            Some(FinishReason::Eos | FinishReason::StopToken(_) | FinishReason::Length)
        ) {
            let rest = state.detokenizer.flush(&self.tokenizer)?;
            let (shown, stopped) = state.filter.push(&rest);
            text.push_str(&shown);
            match stopped {
                Some(s) => finish = Some(FinishReason::StopString(s)),
                None => text.push_str(&state.filter.flush()),
            }
        }
        let _ = request.events.send(Event::Output {
            index: state.index,
            token_ids: vec![token],
            text,
            logprobs: logprob.into_iter().collect(),
        });
        let Some(reason) = finish else {
            return Ok(false);
        };
        let spec = match state.drafter.as_mut() {
            Some(drafter) => {
                drafter.settle(nth);
                drafter.totals()
            }
            None => Default::default(),
        };
        let usage = Usage {
            prompt_tokens: request.request.prompt.len(),
            completion_tokens: state.num_output,
            cached_tokens: request.cached_tokens,
            spec_steps: spec.steps,
            draft_tokens: spec.drafted,
            accepted_tokens: spec.accepted,
            sources: spec.sources,
        };
        let _ = request.events.send(Event::Finished {
            index: state.index,
            reason,
            usage,
        });
        request.unfinished -= 1;
        let request_id = state.request;
        let done = request.unfinished == 0;
        self.remove_seq(seq_id);
        if done {
            self.remove_request(request_id);
        }
        Ok(true)
    }
}
