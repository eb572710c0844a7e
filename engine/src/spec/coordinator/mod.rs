//! The engine thread's speculation state: one [`Speculator`] per method (built in, or
//! registered through [`SpeculationConfig::speculators`]), per-method acceptance statistics
//! and the forward-cost curve. A speculating sequence's drafter ([`SeqDrafter`]) lives in
//! the engine's record of it. The engine loop asks this for the scheduler's draft offers
//! once it knows the step's rows (a drafter prepares only where its best case could pay),
//! once before the forward for every granted tree (and the prompt rows worth learning from),
//! and once after it with every computed row (`outcomes`); it also shows every speculator
//! each admitted prompt and each finished sequence. It never names a method. Metrics per
//! method or draft source (`crate::metrics::spec`): drafted and accepted tokens, verify
//! steps, acceptances per tree depth.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;

use kvcache::{ManagerConfig, SeqId};
use scheduler::{CostCurve, DraftInputs, DraftOffer};

use crate::model::Model;
use crate::spec::methods::auto::AutoSpeculator;
use crate::spec::methods::draft_model::{DraftModelRunner, DraftModelSpeculator};
use crate::spec::methods::ngram_trie::NgramTrie;
use crate::spec::methods::prediction::{Prediction, PredictionDrafter, PredictionFirst};
use crate::spec::methods::prompt_lookup::PromptLookup;
use crate::spec::methods::recycling::RecyclingSpeculator;
use crate::spec::methods::suffix::SuffixSpeculator;
use crate::spec::methods::suffix_indexes::{SuffixIndexes, DEFAULT_BUDGET};
use crate::spec::speculator::{
    ContextSpeculator, Granted, SeenRequest, Speculator, SpeculatorFactory,
};
use crate::spec::stats::AcceptanceStats;
use crate::spec::{DraftContext, Drafter, NewSequence, SpecMethod, SpecRequest};
use crate::tree::TokenTree;
use crate::{Error, Result};

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

/// A method whose drafting costs time of its own (a draft model) is first offered as if
/// every node of a tree of at most [`PROBE_NODES`] nodes would be accepted, until this
/// many of its trees were verified. From the pessimistic prior alone such a method never
/// drafts: a draft model's forwards cost about as much as a target step, which the
/// prior's fraction of a token never repays, so it would never show what it accepts. The
/// probe costs a few steps once per engine; the evidence then keeps or stops it.
const PROBE_VERIFICATIONS: u64 = 8;

/// Most nodes a probing tree has.
const PROBE_NODES: usize = 4;

/// Where a drafter prices its nodes by the engine's statistics, its method's first trees at
/// each evidence level are offered as if their first [`EXPLORE_NODES`] nodes would be
/// accepted (and the rest as the statistics say), until this many were verified; and a
/// method with fewer than
/// [`PROBE_VERIFICATIONS`] verified trees in all prepares whatever its prior says. Where a
/// second row costs 0.4 of a step (two cores without AVX-512), the pessimistic prior and
/// its exploration bonus never pass the break-even, so a method that would pay never
/// drafts and never shows that it does. Exploring costs a few small trees per evidence
/// level once per engine; the evidence then keeps or stops them.
const EXPLORE_VERIFICATIONS: u64 = 2;

/// Nodes of an exploring tree offered as sure.
const EXPLORE_NODES: usize = 2;

/// How far a sequence's acceptance ratio drifts back towards 1 per step it decodes and
/// could draft.
const RATIO_RECOVERY: f32 = 0.02;

/// An exploring tree's curve: its first [`EXPLORE_NODES`] nodes sure, each later node adding
/// what it added before.
fn explore(expected: &mut [f32]) {
    let sure = EXPLORE_NODES.min(expected.len());
    let Some(&before) = sure.checked_sub(1).and_then(|i| expected.get(i)) else {
        return;
    };
    let lift = (sure as f32 - before).max(0.0);
    for (i, e) in expected.iter_mut().enumerate() {
        let nodes = (i + 1) as f32;
        *e = if i < sure {
            nodes
        } else {
            (*e + lift).min(nodes)
        };
    }
}

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

    /// Prepares the drafter of every candidate whose best case could pay on a step of
    /// `base` rows with room for `room` more, and returns the scheduler's draft inputs. A
    /// candidate's `forced` tokens (what its output format forces next) are offered as
    /// certain: each of the first `forced` nodes is expected to be accepted.
    ///
    /// A candidate's best case is its method's best acceptance per node (any evidence
    /// level), scaled by the sequence's ratio, at most one token a node. Where that is no
    /// more than the cost curve's break-even gain at this step's size
    /// (`CostCurve::break_even_gain`), no tree of the sequence's could raise the step's
    /// rate on its own, so its drafter does not prepare and it makes no offer: at a load
    /// where rows cost more than drafts return, speculation costs no work per step.
    pub(crate) fn offers<'a>(
        &mut self,
        candidates: impl Iterator<Item = (SeqId, &'a [u32], &'a mut SeqDrafter, usize)>,
        base: usize,
        room: usize,
    ) -> Option<DraftInputs> {
        let started = std::time::Instant::now();
        let offers = self.make_offers(candidates, base, room);
        self.this_step.lookup += started.elapsed().as_secs_f64();
        offers
    }

    /// [`Self::offers`], untimed.
    fn make_offers<'a>(
        &mut self,
        candidates: impl Iterator<Item = (SeqId, &'a [u32], &'a mut SeqDrafter, usize)>,
        base: usize,
        room: usize,
    ) -> Option<DraftInputs> {
        let cost = self.planning_cost();
        let break_even = cost.break_even_gain(base, room);
        let mut offers = HashMap::new();
        for (seq, tokens, state, forced) in candidates {
            // Without drafts there is no evidence, so a ratio that failures pushed below
            // what drafting needs would never rise again: it drifts back towards the
            // method's average, and the sequence tries a small tree now and then.
            for (_, ratio) in &mut state.ratios {
                *ratio += RATIO_RECOVERY * (1.0 - *ratio);
            }
            state.available = 0;
            let speculator = &self.speculators[state.speculator];
            let costly = speculator.draft_seconds(1).is_some() && state.drafter.needs_speculator();
            let forced = forced.min(state.max_draft);
            if forced == 0 && !costly {
                // The best any of its sources could do (a prediction is one of them).
                let mut best = 0.0f32;
                for method in [
                    Some(state.drafter.method()),
                    state.prediction.as_ref().map(|_| SpecMethod::Prediction),
                ]
                .into_iter()
                .flatten()
                {
                    let per_node = match self.best_per_node.iter().find(|(m, _)| *m == method) {
                        Some(&(_, known)) => known,
                        None => {
                            let computed = self.best_per_node(method);
                            self.best_per_node.push((method, computed));
                            computed
                        }
                    };
                    best = best.max(per_node * state.ratio(method));
                }
                if f64::from(best.min(1.0)) <= break_even {
                    continue;
                }
            }
            let ctx = DraftContext { tokens };
            state.available = state.drafter.prepare(&ctx).min(state.max_draft);
            if state.available == 0 && forced == 0 {
                continue;
            }
            // Whether this step's tree is the speculator's costly work (a prediction drafts
            // for free whatever the method).
            let costly = speculator.draft_seconds(1).is_some() && state.drafter.needs_speculator();
            let method = state.drafter.method();
            let ratio = state.ratio(method);
            let key = (method, state.drafter.evidence());
            let stats =
                (self.stats.entry(key)).or_insert_with(|| AcceptanceStats::prior(key.0, key.1));
            let own = state.drafter.expected_accepted();
            let mut expected_accepted: Vec<f32> =
                if costly && stats.observations() < PROBE_VERIFICATIONS {
                    state.available = state.available.min(PROBE_NODES);
                    (1..=state.available).map(|n| n as f32).collect()
                } else {
                    // The drafter's own pricing where it keeps one, else the method's record.
                    let curve = match own {
                        Some(own) => own[..state.available.min(own.len())].to_vec(),
                        None => stats.curve(state.available),
                    };
                    curve
                        .into_iter()
                        .enumerate()
                        .map(|(i, e)| (e * ratio).min((i + 1) as f32))
                        .collect()
                };
            let drafted_best = expected_accepted.last().copied().unwrap_or(0.0);
            expected_accepted.resize(state.available.max(forced), drafted_best);
            if !costly && own.is_none() && stats.observations() < EXPLORE_VERIFICATIONS {
                explore(&mut expected_accepted);
            }
            for (i, e) in expected_accepted.iter_mut().enumerate() {
                *e = e.max((i + 1).min(forced) as f32);
            }
            // The same test as before `prepare`, on this step's own curve: an offer none of
            // whose trees could pay for its rows would only cost the planner's time.
            let per_node = crate::spec::stats::best_per_node(&expected_accepted);
            if forced == 0 && !costly && f64::from(per_node.min(1.0)) <= break_even {
                continue;
            }
            let draft_cost = match self.seconds_per_unit {
                Some(per_unit) if costly && per_unit > 0.0 => (1..=expected_accepted.len())
                    .map(|n| speculator.draft_seconds(n).unwrap_or(0.0) / per_unit)
                    .collect(),
                _ => Vec::new(),
            };
            offers.insert(
                seq,
                DraftOffer {
                    expected_accepted,
                    draft_cost,
                },
            );
        }
        (!offers.is_empty()).then_some(DraftInputs { cost, offers })
    }

    /// The most `method`'s statistics at any evidence level (the prior for a level not
    /// seen yet) expect a node of a tree to accept; a whole token while the method is still
    /// exploring (fewer than [`PROBE_VERIFICATIONS`] trees verified).
    fn best_per_node(&self, method: SpecMethod) -> f32 {
        let max_nodes = self.config.max_draft_tokens;
        let of_method = || self.stats.iter().filter(|((m, _), _)| *m == method);
        let verified: u64 = of_method().map(|(_, stats)| stats.observations()).sum();
        if verified < PROBE_VERIFICATIONS {
            return 1.0;
        }
        of_method()
            .map(|(_, stats)| stats.best_per_node(max_nodes))
            .fold(
                AcceptanceStats::best_prior(method).best_per_node(max_nodes),
                f32::max,
            )
    }

    /// The cost curve the planner prices a step with: the configured one, refined by the
    /// forwards measured, with what a step costs beside its forward.
    fn planning_cost(&self) -> CostCurve {
        let mut cost = self.config.cost.clone();
        if let (Some(fixed), Some(per_unit)) = (self.step_overhead, self.seconds_per_unit) {
            if per_unit > 0.0 {
                let per_token = self.sampling_per_token.unwrap_or(0.0);
                cost.set_step_overhead(fixed / per_unit, per_token / per_unit);
                cost.set_row_overhead(self.observing_per_row.unwrap_or(0.0) / per_unit);
            }
        }
        cost
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
