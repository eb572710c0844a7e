//! The engine thread's speculation state: one [`Speculator`] per method (built in, or
//! registered through [`SpeculationConfig::speculators`]), per-method acceptance statistics
//! and the forward-cost curve. A speculating sequence's drafter ([`SeqDrafter`]) lives in
//! the engine's record of it. The engine loop asks this for the scheduler's draft offers
//! once it knows the step's rows (`offers`: a drafter prepares only where its best case could
//! pay), once before the forward for every granted tree (and the prompt rows worth learning
//! from), and once after it with every computed row (`outcomes`); it also shows every speculator
//! each admitted prompt and each finished sequence. It never names a method. Metrics per
//! method or draft source (`crate::metrics::spec`): drafted and accepted tokens, verify
//! steps, acceptances per tree depth.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;

use kvcache::{ManagerConfig, SeqId};
use scheduler::CostCurve;

use crate::model::Model;
use crate::spec::methods::auto::AutoSpeculator;
use crate::spec::methods::draft_model::{DraftModelRunner, DraftModelSpeculator};
use crate::spec::methods::ngram_trie::NgramTrie;
use crate::spec::methods::prediction::{Prediction, PredictionDrafter, PredictionFirst};
use crate::spec::methods::prompt_lookup::PromptLookup;
use crate::spec::methods::recycling::RecyclingSpeculator;
use crate::spec::methods::suffix::global::{SuffixIndexes, DEFAULT_BUDGET};
use crate::spec::methods::suffix::SuffixSpeculator;
use crate::spec::speculator::{
    ContextSpeculator, Granted, SeenRequest, Speculator, SpeculatorFactory,
};
use crate::spec::stats::AcceptanceStats;
use crate::spec::{DraftContext, Drafter, NewSequence, SpecMethod, SpecRequest};
use crate::tree::TokenTree;
use crate::{Error, Result};

mod offers;
mod outcomes;
mod seq;

pub(crate) use seq::SeqDrafter;
pub use seq::{SourceTotals, SpecTotals};

/// How the engine speculates.
#[derive(Debug, Clone)]
pub struct SpeculationConfig {
    /// Used by requests that do not choose.
    pub default: SpecRequest,
    /// Most draft nodes per sequence per step.
    pub max_draft_tokens: usize,
    /// The forward-cost curve the draft budgets are planned with.
    pub cost: CostCurve,
    /// Where the Token Recycling matrix is loaded from at start and saved at shutdown.
    pub recycling_state: Option<PathBuf>,
    /// A draft model for `draft_model` requests.
    pub draft_model: Option<DraftModelSetup>,
    /// Most tokens the global suffix indexes hold (0: they learn nothing).
    pub suffix_index_tokens: usize,
    /// Where the suffix index of requests without a cache salt is loaded from at start and
    /// saved at shutdown (it holds users' prompts and outputs: off unless asked for).
    pub suffix_index_state: Option<PathBuf>,
    /// Methods beyond the built-in ones, each named by its speculator
    /// ([`SpecMethod::Named`]).
    pub speculators: Vec<SpeculatorFactory>,
}

/// A draft model and how it drafts.
#[derive(Debug, Clone)]
pub struct DraftModelSetup {
    /// The model (same tokenizer as the target).
    pub model: Model,
    /// Candidates per depth, e.g. `[4, 2, 1, 1]`.
    pub k_config: Vec<usize>,
    /// Its KV pool.
    pub kv: ManagerConfig,
}

impl Default for SpeculationConfig {
    fn default() -> Self {
        Self {
            default: SpecRequest {
                method: SpecMethod::None,
                max_draft_tokens: None,
            },
            max_draft_tokens: 80,
            cost: CostCurve::linear(),
            recycling_state: None,
            draft_model: None,
            suffix_index_tokens: DEFAULT_BUDGET,
            suffix_index_state: None,
            speculators: Vec::new(),
        }
    }
}

pub(crate) struct Speculation {
    config: SpeculationConfig,
    speculators: Vec<Box<dyn Speculator>>,
    /// Per method and evidence level (`Drafter::evidence`).
    stats: HashMap<(SpecMethod, u8), AcceptanceStats>,
    /// Measured seconds per unit of the cost curve (moving average).
    seconds_per_unit: Option<f64>,
    /// Measured seconds a step takes beside its forward, its drafting and its sampling
    /// (moving average): every step pays them whatever it yields, so they make verified rows
    /// relatively cheaper than the forward's curve alone says.
    step_overhead: Option<f64>,
    /// Measured seconds of sampling per token a step yields (moving average): verification
    /// samples along the accepted path only, so every token pays them, drafted or not.
    sampling_per_token: Option<f64>,
    /// Measured seconds the speculators spend reading one computed row (moving average):
    /// Token Recycling's top-k over the row's logits, for instance. A draft row pays it.
    observing_per_row: Option<f64>,
    /// This step's measurements so far, until `observe_step`.
    this_step: StepTimes,
    /// Each method's [`Speculation::best_per_node`] since its statistics last changed: the
    /// check every decoding sequence's drafter passes each step before it prepares, kept
    /// so that a step costs no curve to be rebuilt per sequence (a step's bookkeeping
    /// between forwards slows the next forward by several times its own length).
    best_per_node: Vec<(SpecMethod, f32)>,
}

/// What a step spent where, in seconds.
#[derive(Debug, Clone, Copy, Default)]
struct StepTimes {
    forward: Option<f64>,
    drafting: f64,
    /// Drafters' preparation for the planner's offers, and the speculators' learning of
    /// admitted and finished requests (the global index's upkeep).
    lookup: f64,
    sampling: f64,
    /// The speculators' reading of the forward's computed rows.
    observing: f64,
}

/// Most prompt rows computed per step only for speculators that learn from them.
const PROMPT_LEARNING_ROWS: usize = 32;

/// The most of a step's estimated cost that its learning rows may add. Learning yields no
/// token this step, and on SmolLM2 on a CPU 32 of them cost 3-4% of the time to the first
/// token with no measurable gain in tokens per step later, so they are only taken where
/// rows are (nearly) free.
const LEARNING_SHARE: f64 = 0.01;

impl Speculation {
    /// State for a model with `vocab` logits per row: the built-in speculators (Token
    /// Recycling's matrix loaded if saved; the draft model's when one is set up) and the
    /// registered ones. Errors on a registered method that is not a new name.
    pub(crate) fn new(mut config: SpeculationConfig, vocab: usize) -> Result<Self> {
        let recycling = RecyclingSpeculator::new(vocab, config.recycling_state.clone());
        let matrices = recycling.shared();
        let suffix = SuffixSpeculator::new(SuffixIndexes::new(
            config.suffix_index_tokens,
            config.suffix_index_state.clone(),
        ));
        let indexes = suffix.shared();
        let mut speculators: Vec<Box<dyn Speculator>> = vec![
            Box::new(recycling),
            Box::new(AutoSpeculator::new(matrices, Some(indexes))),
            Box::new(ContextSpeculator::new(SpecMethod::NgramTrie, |_| {
                Box::new(NgramTrie::new())
            })),
            Box::new(ContextSpeculator::new(SpecMethod::PromptLookup, |_| {
                Box::new(PromptLookup::new())
            })),
            Box::new(suffix),
        ];
        if let Some(d) = &config.draft_model {
            let runner = DraftModelRunner::new(d.model.clone(), d.kv, d.k_config.clone())?;
            speculators.push(Box::new(DraftModelSpeculator::new(runner)));
        }
        for factory in std::mem::take(&mut config.speculators) {
            let speculator = factory.build(vocab);
            let method = speculator.method();
            if !matches!(method, SpecMethod::Named(_))
                || speculators.iter().any(|s| s.method() == method)
            {
                return Err(Error::Metadata(format!(
                    "speculator {factory:?} serves method '{}', which is taken: a registered \
                     method needs a new name",
                    method.as_str()
                )));
            }
            speculators.push(speculator);
        }
        Ok(Self {
            config,
            speculators,
            stats: HashMap::new(),
            seconds_per_unit: None,
            step_overhead: None,
            sampling_per_token: None,
            observing_per_row: None,
            this_step: StepTimes::default(),
            best_per_node: Vec::new(),
        })
    }

    /// Every method this engine can draft with.
    pub(crate) fn methods(&self) -> Vec<SpecMethod> {
        self.speculators.iter().map(|s| s.method()).collect()
    }

    /// A drafter for a sequence that asked for `request` (the default when `None`) with
    /// known tokens `tokens` of which the first `prompt_len` are the prompt, and a
    /// `prediction` of its output (tokenized; `None` or empty: none); `None` for method
    /// `none` and methods no speculator serves. Where there is a prediction and the
    /// method's drafter does not merge it into its own trees, the prediction drafts first
    /// ([`PredictionFirst`]) around it.
    pub(crate) fn drafter_for(
        &self,
        request: Option<SpecRequest>,
        tokens: &[u32],
        prompt_len: usize,
        prediction: Option<&Arc<[u32]>>,
        cache_scope: Option<kvcache::BlockHash>,
    ) -> Option<SeqDrafter> {
        let prediction = prediction
            .filter(|p| !p.is_empty())
            .map(|p| Arc::new(Prediction::new(Arc::clone(p))));
        self.new_drafter(request, tokens, prompt_len, prediction, cache_scope)
    }

    /// [`Speculation::drafter_for`] with the prediction indexed (forks share the index).
    fn new_drafter(
        &self,
        request: Option<SpecRequest>,
        tokens: &[u32],
        prompt_len: usize,
        prediction: Option<Arc<Prediction>>,
        cache_scope: Option<kvcache::BlockHash>,
    ) -> Option<SeqDrafter> {
        let request = request.unwrap_or(self.config.default);
        let max_draft = request
            .max_draft_tokens
            .unwrap_or(self.config.max_draft_tokens)
            .min(self.config.max_draft_tokens);
        if max_draft == 0 {
            return None;
        }
        if request.method == SpecMethod::None {
            return None;
        }
        let speculator = self
            .speculators
            .iter()
            .position(|s| s.method() == request.method)?;
        let new = NewSequence {
            tokens,
            prompt_len,
            prediction: prediction.as_ref(),
            cache_scope,
        };
        let own = self.speculators[speculator].drafter(&new);
        let drafter: Box<dyn Drafter> = match (&prediction, own) {
            (Some(_), Some(own)) if own.drafts_prediction() => own,
            (Some(p), own) => Box::new(PredictionFirst::new(
                PredictionDrafter::new(Arc::clone(p), prompt_len),
                own,
            )),
            (None, own) => own?,
        };
        Some(SeqDrafter {
            drafter,
            speculator,
            request,
            prompt_len,
            prediction,
            cache_scope,
            max_draft,
            ratios: Vec::new(),
            available: 0,
            totals: SpecTotals::default(),
            unsettled: None,
        })
    }

    /// A request was admitted with `prompt`: every speculator sees it.
    pub(crate) fn admitted(&mut self, prompt: &[u32], cache_scope: Option<kvcache::BlockHash>) {
        let request = SeenRequest {
            tokens: prompt,
            prompt_len: prompt.len(),
            cache_scope,
        };
        let started = std::time::Instant::now();
        for speculator in &mut self.speculators {
            speculator.admitted(&request);
        }
        self.this_step.lookup += started.elapsed().as_secs_f64();
    }

    /// A sequence left with `tokens`, of which the first `prompt_len` are the prompt: every
    /// speculator sees it.
    pub(crate) fn finished(
        &mut self,
        tokens: &[u32],
        prompt_len: usize,
        cache_scope: Option<kvcache::BlockHash>,
    ) {
        let request = SeenRequest {
            tokens,
            prompt_len,
            cache_scope,
        };
        let started = std::time::Instant::now();
        for speculator in &mut self.speculators {
            speculator.finished(&request);
        }
        self.this_step.lookup += started.elapsed().as_secs_f64();
    }

    /// A drafter for a sequence forked from one drafting with `parent`.
    pub(crate) fn fork(&self, parent: &SeqDrafter, tokens: &[u32]) -> Option<SeqDrafter> {
        self.new_drafter(
            Some(parent.request),
            tokens,
            parent.prompt_len,
            parent.prediction.clone(),
            parent.cache_scope,
        )
    }

    /// `seq` (which drafted with `state`) left: its speculator forgets what it kept for it
    /// (the draft model's KV).
    pub(crate) fn release(&mut self, seq: SeqId, state: &SeqDrafter) {
        if let Some(speculator) = self.speculators.get_mut(state.speculator) {
            speculator.release(seq);
        }
    }

    /// Every granted sequence's draft tree, in the order given: `(seq, known tokens,
    /// budget, drafter)`. Each method's speculator first does its batched work for all of
    /// its granted sequences (a draft model's forwards), then each one's tree is cut to its
    /// budget.
    pub(crate) fn draft_all(
        &mut self,
        granted: &mut [(SeqId, &[u32], usize, &mut SeqDrafter)],
    ) -> Vec<TokenTree> {
        let started = std::time::Instant::now();
        let trees = self.draft_granted(granted);
        self.this_step.drafting += started.elapsed().as_secs_f64();
        trees
    }

    /// `draft_all`'s work.
    fn draft_granted(
        &mut self,
        granted: &mut [(SeqId, &[u32], usize, &mut SeqDrafter)],
    ) -> Vec<TokenTree> {
        for (index, speculator) in self.speculators.iter_mut().enumerate() {
            let mine: Vec<Granted<'_>> = granted
                .iter()
                .filter(|g| g.3.speculator == index && g.3.drafter.needs_speculator())
                .map(|g| Granted {
                    seq: g.0,
                    tokens: g.1,
                    budget: g.2.min(g.3.available),
                    cache_scope: g.3.cache_scope,
                })
                .collect();
            if mine.iter().all(|g| g.budget == 0) {
                continue;
            }
            if let Err(e) = speculator.prepare(&mine) {
                tracing::warn!(
                    "{} failed to prepare drafts, decoding without them: {e}",
                    speculator.method().as_str()
                );
            }
        }
        granted
            .iter_mut()
            .map(|(seq, tokens, budget, state)| {
                let ctx = DraftContext { tokens };
                let budget = (*budget).min(state.available);
                match self.speculators.get_mut(state.speculator) {
                    Some(s) if state.drafter.needs_speculator() => {
                        s.draft(*seq, &ctx, budget, state.drafter.as_mut())
                    }
                    Some(_) => state.drafter.draft(&ctx, budget),
                    None => TokenTree::chain(&tokens[tokens.len().saturating_sub(1)..]),
                }
            })
            .collect()
    }

    /// Which of the prompt rows `(row, token fed, drafter of its sequence)` of a step of
    /// `step_rows` rows should have their logits computed: those whose sequence's
    /// speculator wants them, each token once, at most [`PROMPT_LEARNING_ROWS`] a step. They
    /// are charged like draft nodes, each as one more row on the cost curve (whose rows all
    /// compute logits, so this is an upper bound), and taken only while together they add at
    /// most [`LEARNING_SHARE`] to the step's cost: all of them where extra rows are free, few
    /// or none where each row costs a sizeable part of a step.
    pub(crate) fn learning_rows(
        &self,
        rows: &[(usize, u32, &SeqDrafter)],
        step_rows: usize,
    ) -> Vec<usize> {
        let affordable =
            self.config
                .cost
                .rows_within(step_rows, LEARNING_SHARE, PROMPT_LEARNING_ROWS);
        let mut seen = HashSet::new();
        let mut chosen = Vec::new();
        for &(row, token, state) in rows {
            if seen.len() >= affordable {
                break;
            }
            let wants = self
                .speculators
                .get(state.speculator)
                .is_some_and(|s| s.wants_logits(token, state.cache_scope));
            if wants && seen.insert(token) {
                chosen.push(row);
            }
        }
        chosen
    }

    /// Every speculator has the OS map the KV it keeps of its own (a draft model's pool).
    pub(crate) fn prefault_kv(&mut self) {
        for speculator in &mut self.speculators {
            speculator.prefault_kv();
        }
    }

    /// Every speculator persists what should outlive the engine (the recycling matrix).
    pub(crate) fn save(&self) {
        for speculator in &self.speculators {
            speculator.save();
        }
    }
}

#[cfg(test)]
mod tests;
