//! What `bench spec` and `bench edits` share: an engine per configuration, started with its
//! KV cache mapped and warmed up untimed on a prompt outside every set ([`start_warm`]); a
//! round of requests all submitted before any stream is read, each then read to its end on
//! its own thread and timed from its submission ([`run_round`], [`read_timed`]); and the
//! order of the engines in each round, every engine as often early as late
//! ([`round_order`]).

use std::time::Instant;

use anyhow::{bail, Context};
use engine::{Event, LoadedModel, Request, SpecMethod};

use crate::args::{spawn, EngineArgs};
use crate::chat::user_prompt;

/// A prompt outside every bench's data set, for each engine's untimed warm-up: it pages the
/// weights in and settles the allocator without putting any measured request's prefix in the
/// cache or its continuation in the recycling matrix.
const WARM_UP: &str = "List the days of the week.";

/// The label of a second `none` engine (`--control`): its ratio to the first is the run's
/// noise floor.
pub(crate) const CONTROL: &str = "none (control)";

/// One configuration's own engine, alive for the whole bench so that requests can be
/// interleaved across configurations while each still sees only its own traffic.
pub(crate) struct BenchEngine {
    /// The engine.
    pub handle: engine::EngineHandle,
    thread: std::thread::JoinHandle<()>,
}

impl BenchEngine {
    /// Shuts the engine down and waits for its thread.
    pub fn stop(self) {
        self.handle.shutdown();
        let _ = self.thread.join();
    }
}

/// Starts an engine of `engine_args` drafting with `method` by default, with its KV cache
/// mapped, warmed up untimed on [`WARM_UP`].
pub(crate) fn start_warm(
    loaded: &LoadedModel,
    engine_args: &EngineArgs,
    method: SpecMethod,
) -> anyhow::Result<BenchEngine> {
    let mut engine_args = engine_args.clone();
    engine_args.spec.speculation = method;
    // Every engine's pages mapped before the timing starts: otherwise each pays the OS's
    // first touch of its pool inside its rounds, and what a first touch costs varies with
    // what the host did before (on one host the same round took 10% longer at some places
    // in the rotation than at others).
    engine_args.kv.kv_prefault = true;
    let config = engine_args.config(&loaded.model)?;
    let (handle, thread) = spawn(loaded, config)?;
    let prompt = loaded
        .tokenizer
        .encode(&user_prompt(&loaded.tokenizer, WARM_UP)?)?;
    let warm = Request::greedy(prompt, 8, Some(method));
    handle.submit(warm)?.wait().map_err(anyhow::Error::msg)?;
    Ok(BenchEngine { handle, thread })
}

/// One request's stream read to its end, timed from its submission.
pub(crate) struct Timed {
    /// Its text.
    pub text: String,
    /// Its tokens.
    pub tokens: usize,
    /// Submission to the last token.
    pub seconds: f64,
    /// Submission to the first token.
    pub ttft_seconds: f64,
    /// Its usage.
    pub usage: engine::Usage,
}

/// Reads `stream` (submitted at `started`) to its end.
pub(crate) fn read_timed(started: Instant, stream: engine::RequestStream) -> anyhow::Result<Timed> {
    let (mut first, mut tokens, mut text, mut usage) = (None, 0, String::new(), None);
    while let Some(event) = stream.recv() {
        match event {
            Event::Output {
                token_ids, text: t, ..
            } => {
                first.get_or_insert_with(|| started.elapsed().as_secs_f64());
                tokens += token_ids.len();
                text.push_str(&t);
            }
            Event::Finished { usage: u, .. } => usage = Some(u),
            Event::Error(e) => bail!("{e}"),
            Event::Pooled { .. } => bail!("the engine pooled a generation request"),
        }
    }
    let usage = usage.context("the engine stopped early")?;
    let seconds = started.elapsed().as_secs_f64();
    Ok(Timed {
        text,
        tokens,
        seconds,
        ttft_seconds: first.unwrap_or(seconds),
        usage,
    })
}

/// Runs `items` all at once (one client each) and measures each. Every item is submitted
/// before any stream is read, so each round reaches the engine in the same order and at
/// once for every configuration (threads started one by one would let the engine begin with
/// whichever few had arrived, and the prefill order would vary by configuration); then each
/// stream is read on its own thread by `measure`, given the item and when it was submitted.
pub(crate) fn run_round<T, M>(
    items: &[T],
    submit: impl Fn(&T) -> anyhow::Result<engine::RequestStream>,
    measure: impl Fn(&T, Instant, engine::RequestStream) -> anyhow::Result<M> + Sync,
) -> anyhow::Result<Vec<M>>
where
    T: Sync,
    M: Send,
{
    let submitted = items
        .iter()
        .map(|item| {
            let started = Instant::now();
            Ok((item, started, submit(item)?))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let measure = &measure;
    std::thread::scope(|scope| {
        let readers: Vec<_> = submitted
            .into_iter()
            .map(|(item, started, stream)| scope.spawn(move || measure(item, started, stream)))
            .collect();
        readers
            .into_iter()
            .map(|r| {
                r.join()
                    .map_err(|_| anyhow::anyhow!("a bench reader panicked"))?
            })
            .collect()
    })
}

/// The order in which `engines` engines run round `round`. Rounds go in pairs: the second
/// of a pair runs the first's order backwards, so over each pair every engine's two places
/// add up to the same (a host that slows down or speeds up along a round weighs on all
/// alike, however few the rounds), and the order rotates by one from pair to pair.
pub(crate) fn round_order(round: usize, engines: usize) -> Vec<usize> {
    let pair = round / 2;
    let order = (0..engines).map(move |turn| (pair + turn) % engines);
    if round.is_multiple_of(2) {
        order.collect()
    } else {
        order.rev().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::round_order;

    #[test]
    fn every_engine_runs_as_often_early_as_late() {
        for engines in 1..=7 {
            let mut places = vec![0; engines];
            for round in 0..2 * engines {
                let order = round_order(round, engines);
                let mut sorted = order.clone();
                sorted.sort();
                assert_eq!(sorted, (0..engines).collect::<Vec<_>>(), "a permutation");
                for (place, &engine) in order.iter().enumerate() {
                    places[engine] += place;
                }
                if !round.is_multiple_of(2) {
                    // After each pair of rounds every engine's places add up alike.
                    let each = round.div_ceil(2) * (engines - 1);
                    assert_eq!(
                        places,
                        vec![each; engines],
                        "{engines} engines, round {round}"
                    );
                }
            }
        }
        // The first place rotates from pair to pair.
        let firsts: Vec<usize> = (0..8).map(|r| round_order(r, 3)[0]).collect();
        assert_eq!(firsts, [0, 2, 1, 0, 2, 1, 0, 2]);
    }
}
