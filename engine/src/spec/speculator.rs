//! The speculator seam. A [`Speculator`] is one speculation method's engine-wide side: it
//! makes each speculating sequence's [`Drafter`], does the method's batched work for every
//! sequence granted a budget in a step (a draft model's forwards), hands out each one's
//! tree, and sees every row the forward computed (Token Recycling learns from them; it may
//! also ask for prompt rows' logits), and every request's prompt and output (a global index
//! learns from them). The engine holds one speculator per method, built-in
//! or registered by the embedding program ([`SpeculatorFactory`]), and calls them through
//! this trait only: once before the forward (prepare, draft) and once after (observe).

use std::fmt;
use std::sync::Arc;

use kvcache::{BlockHash, SeqId};

use super::{DraftContext, Drafter, NewSequence, SpecMethod};
use crate::tree::TokenTree;
use crate::Result;

/// One row a forward computed.
#[derive(Debug, Clone, Copy)]
pub struct ObservedRow<'a> {
    /// The token fed.
    pub token: u32,
    /// The logits that came out.
    pub logits: &'a [f32],
    /// The cache-salt scope of the row's sequence's request (`NewSequence::cache_scope`).
    pub cache_scope: Option<BlockHash>,
    /// The tokens fed before this row's on its path: its sequence's tokens before the
    /// batch's rows, then the row's ancestors in its tree or chain.
    pub before: Before,
}

/// The last (at most two) tokens fed before a row's own on its path, oldest first.
pub type Before = LastTokens<2>;

/// The last (at most `N`) tokens of a sequence of them, oldest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LastTokens<const N: usize> {
    tokens: [u32; N],
    len: usize,
}

impl<const N: usize> Default for LastTokens<N> {
    fn default() -> Self {
        Self {
            tokens: [0; N],
            len: 0,
        }
    }
}

impl<const N: usize> LastTokens<N> {
    /// The last `N` of `tokens` (all of them when fewer).
    pub fn new(tokens: &[u32]) -> Self {
        let mut last = Self::default();
        for &t in &tokens[tokens.len().saturating_sub(N)..] {
            last.push(t);
        }
        last
    }

    /// `token` comes last; the oldest drops out when `N` are kept.
    pub fn push(&mut self, token: u32) {
        if N == 0 {
            return;
        }
        if self.len == N {
            self.tokens.copy_within(1.., 0);
            self.tokens[N - 1] = token;
        } else {
            self.tokens[self.len] = token;
            self.len += 1;
        }
    }

    /// The tokens, oldest first.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens[..self.len]
    }
}

/// A request's tokens the engine saw, whatever its method: at admission its prompt, when
/// one of its sequences leaves (finished, cancelled or failed) that sequence's prompt and
/// output.
#[derive(Debug, Clone, Copy)]
pub struct SeenRequest<'a> {
    /// The tokens.
    pub tokens: &'a [u32],
    /// How many of them are the prompt.
    pub prompt_len: usize,
    /// The cache-salt scope of the request (`NewSequence::cache_scope`).
    pub cache_scope: Option<BlockHash>,
}

/// A sequence granted a draft budget this step.
#[derive(Debug, Clone, Copy)]
pub struct Granted<'a> {
    /// The sequence.
    pub seq: SeqId,
    /// Its known tokens; the last one is the pending token (the root of its tree).
    pub tokens: &'a [u32],
    /// Most draft nodes it may feed.
    pub budget: usize,
    /// Its request's cache-salt scope (`NewSequence::cache_scope`).
    pub cache_scope: Option<kvcache::BlockHash>,
}

/// One speculation method's engine-wide state and work.
pub trait Speculator: Send {
    /// The method it serves; requests name it.
    fn method(&self) -> SpecMethod;

    /// A drafter for a new sequence (admitted, or forked), from what the request tells of
    /// it; `None` when the method cannot draft for it.
    fn drafter(&self, seq: &NewSequence<'_>) -> Option<Box<dyn Drafter>>;

    /// What [`Speculator::prepare`]'s own work (a model's forwards) costs a drafting
    /// sequence in a step for a tree of `nodes` nodes, in seconds, as the speculator
    /// measured it; the engine charges it to this method's offers. Only work that recurs
    /// every step counts: catching up with a prompt, or with tokens decoded while the
    /// sequence did not draft, is a one-off, like a prefill. `None` (the default) for
    /// drafters that only look things up, whose few microseconds would only make the
    /// planner weigh every plan twice, and before the first measurement.
    fn draft_seconds(&self, _nodes: usize) -> Option<f64> {
        None
    }

    /// Batched work for every sequence of this method granted a budget this step, before
    /// any of them drafts. An error costs only this step's drafts: the engine logs it and
    /// the sequences decode without them.
    fn prepare(&mut self, _granted: &[Granted<'_>]) -> Result<()> {
        Ok(())
    }

    /// `seq`'s tree of at most `budget` nodes under its pending token; by default its
    /// drafter's.
    fn draft(
        &mut self,
        _seq: SeqId,
        ctx: &DraftContext<'_>,
        budget: usize,
        drafter: &mut dyn Drafter,
    ) -> TokenTree {
        drafter.draft(ctx, budget)
    }

    /// Whether the logits of a prompt row feeding `token`, of a sequence whose request's
    /// cache-salt scope is `cache_scope`, are worth computing for this method's sequences (a
    /// row of the output projection each; the engine caps them).
    fn wants_logits(&self, _token: u32, _cache_scope: Option<BlockHash>) -> bool {
        false
    }

    /// One row the forward computed, whatever its sequence's method. What a speculator
    /// learns from it, it may share only with requests of the row's cache-salt scope.
    fn observe_row(&mut self, _row: &ObservedRow<'_>) {}

    /// A request was admitted (`request.tokens` is its prompt). What a speculator learns
    /// from it, it may share only with requests of the same cache-salt scope.
    fn admitted(&mut self, _request: &SeenRequest<'_>) {}

    /// A sequence left the engine with its prompt and output (`request`), whatever its
    /// method. Scoped as [`Speculator::admitted`].
    fn finished(&mut self, _request: &SeenRequest<'_>) {}

    /// Have the OS map the memory of the KV the speculator keeps of its own (a draft model's
    /// pool) now, before any request, as `--kv-prefault` asks of the target's pool. By
    /// default there is none.
    fn prefault_kv(&mut self) {}

    /// `seq` left the engine: forget what is kept for it.
    fn release(&mut self, _seq: SeqId) {}

    /// The engine is shutting down: persist what should outlive it.
    fn save(&self) {}
}

/// Builds a speculator for a model with `vocab` logits per row. The engine configuration
/// holds factories rather than speculators, so that it can be cloned to start engines.
#[derive(Clone)]
pub struct SpeculatorFactory {
    name: String,
    make: Arc<dyn Fn(usize) -> Box<dyn Speculator> + Send + Sync>,
}

impl SpeculatorFactory {
    /// A factory called `name` (for messages) around `make`.
    pub fn new(
        name: impl Into<String>,
        make: impl Fn(usize) -> Box<dyn Speculator> + Send + Sync + 'static,
    ) -> Self {
        Self {
            name: name.into(),
            make: Arc::new(make),
        }
    }

    /// A speculator for `vocab` logits per row.
    pub fn build(&self, vocab: usize) -> Box<dyn Speculator> {
        (self.make)(vocab)
    }
}

impl fmt::Debug for SpeculatorFactory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SpeculatorFactory")
            .field("name", &self.name)
            .finish()
    }
}

/// The speculator of a method whose drafters need nothing engine-wide (the context
/// drafters: n-gram trie, prompt lookup).
pub struct ContextSpeculator {
    method: SpecMethod,
    make: fn(&[u32]) -> Box<dyn Drafter>,
}

impl ContextSpeculator {
    /// `method`'s speculator, whose drafters `make` builds from a sequence's tokens.
    pub fn new(method: SpecMethod, make: fn(&[u32]) -> Box<dyn Drafter>) -> Self {
        Self { method, make }
    }
}

impl Speculator for ContextSpeculator {
    fn method(&self) -> SpecMethod {
        self.method
    }

    fn drafter(&self, seq: &NewSequence<'_>) -> Option<Box<dyn Drafter>> {
        Some((self.make)(seq.tokens))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_tokens_keep_the_newest_oldest_first() {
        let mut last = LastTokens::<2>::new(&[1, 2, 3]);
        assert_eq!(last.tokens(), &[2, 3]);
        last.push(4);
        assert_eq!(last.tokens(), &[3, 4]);
        let mut short = LastTokens::<3>::new(&[]);
        assert!(short.tokens().is_empty());
        short.push(5);
        short.push(6);
        assert_eq!(short.tokens(), &[5, 6]);
        assert_eq!(LastTokens::<3>::new(&[7]).tokens(), &[7]);
    }
}
