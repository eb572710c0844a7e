//! The engine thread's speculation state: the shared Token Recycling matrix, one drafter per
//! speculating sequence, per-method acceptance statistics and the forward-cost curve. The
//! engine loop asks it for the scheduler's draft offers, for each granted tree, and tells it
//! what every forward computed and what every verification accepted. Metrics per method
//! (`crate::metrics::spec`): drafted and accepted tokens, verify steps, acceptances per tree
//! depth.

use std::collections::HashMap;
use std::path::PathBuf;

use kvcache::{ManagerConfig, SeqId};
use scheduler::{CostCurve, DraftInputs, DraftOffer};

use crate::model::Model;
use crate::spec::draft_model::{DraftModelDrafter, DraftModelRunner};
use crate::spec::recycling::{RecyclingMatrix, StaticTree, TOP_K};
use crate::spec::stats::AcceptanceStats;
use crate::spec::{new_drafter, DraftContext, Drafter, SpecMethod, SpecRequest};
use crate::tree::TokenTree;

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
        }
    }
}

/// One speculating sequence's drafting state; it lives in the engine's record of the
/// sequence and goes with it.
pub(crate) struct SeqDrafter {
    drafter: Box<dyn Drafter>,
    request: SpecRequest,
    max_draft: usize,
    /// How this sequence accepts relative to its method's statistics.
    ratio: f32,
    /// Nodes the drafter prepared this step.
    available: usize,
    /// What it drafted and had accepted so far.
    totals: SpecTotals,
}

impl SeqDrafter {
    /// Its totals so far.
    pub(crate) fn totals(&self) -> SpecTotals {
        self.totals
    }

    /// Whether Token Recycling should learn from this sequence's prompt rows: it drafts
    /// with the shared matrix (directly or through `auto`).
    pub(crate) fn learns_from_prompt(&self) -> bool {
        matches!(
            self.request.method,
            SpecMethod::Recycling | SpecMethod::Auto
        )
    }

    /// Whether it drafts with the draft model.
    fn uses_draft_model(&self) -> bool {
        self.drafter.method() == SpecMethod::DraftModel
    }

    /// The sequence's known tokens grew by their last `appended`.
    pub(crate) fn observe(&mut self, tokens: &[u32], appended: usize) {
        self.drafter.observe(tokens, appended);
    }
}

/// Per-sequence totals of speculation, reported with the finished sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SpecTotals {
    /// Verification steps.
    pub steps: usize,
    /// Draft nodes verified.
    pub drafted: usize,
    /// Draft nodes accepted.
    pub accepted: usize,
}

pub(crate) struct Speculation {
    config: SpeculationConfig,
    runner: Option<DraftModelRunner>,
    recycling: RecyclingMatrix,
    tree: StaticTree,
    stats: HashMap<SpecMethod, AcceptanceStats>,
    /// Measured seconds per unit of the cost curve (moving average).
    seconds_per_unit: Option<f64>,
    /// Measured seconds the draft model spends per sequence it drafts for (moving average).
    draft_model_seconds: Option<f64>,
}

/// How far a sequence's acceptance ratio drifts back towards 1 per step it could draft.
const RATIO_RECOVERY: f32 = 0.02;

/// Weight of a new measurement in the moving averages above.
const COST_SMOOTHING: f64 = 0.2;

fn smooth(average: &mut Option<f64>, sample: f64) {
    if !sample.is_finite() || sample < 0.0 {
        return;
    }
    *average = Some(match *average {
        Some(a) => a + COST_SMOOTHING * (sample - a),
        None => sample,
    });
}

impl Speculation {
    /// State for a model with `vocab` logits per row; loads the recycling state if present.
    pub(crate) fn new(config: SpeculationConfig, vocab: usize) -> Self {
        let recycling = match &config.recycling_state {
            Some(path) if path.exists() => RecyclingMatrix::load(path, vocab, TOP_K)
                .unwrap_or_else(|e| {
                    tracing::warn!("starting with a cold recycling matrix: {e}");
                    RecyclingMatrix::new(vocab, TOP_K)
                }),
            _ => RecyclingMatrix::new(vocab, TOP_K),
        };
        let runner = config
            .draft_model
            .as_ref()
            .map(|d| DraftModelRunner::new(d.model.clone(), d.kv, d.k_config.clone()));
        Self {
            config,
            runner,
            recycling,
            tree: StaticTree::paper(),
            stats: HashMap::new(),
            seconds_per_unit: None,
            draft_model_seconds: None,
        }
    }

    /// A drafter for a sequence that asked for `request` (the default when `None`) with
    /// known tokens `tokens`; `None` for method `none`.
    pub(crate) fn drafter_for(
        &self,
        request: Option<SpecRequest>,
        tokens: &[u32],
    ) -> Option<SeqDrafter> {
        let request = request.unwrap_or(self.config.default);
        let max_draft = request
            .max_draft_tokens
            .unwrap_or(self.config.max_draft_tokens)
            .min(self.config.max_draft_tokens);
        if max_draft == 0 {
            return None;
        }
        let drafter: Box<dyn Drafter> = match (&self.runner, request.method) {
            (Some(runner), SpecMethod::DraftModel) => {
                Box::new(DraftModelDrafter::new(runner.max_nodes()))
            }
            _ => new_drafter(request.method, tokens, &self.tree)?,
        };
        Some(SeqDrafter {
            drafter,
            request,
            max_draft,
            ratio: 1.0,
            available: 0,
            totals: SpecTotals::default(),
        })
    }

    /// A drafter for a sequence forked from one drafting with `parent`.
    pub(crate) fn fork(&self, parent: &SeqDrafter, tokens: &[u32]) -> Option<SeqDrafter> {
        self.drafter_for(Some(parent.request), tokens)
    }

    /// Forgets what is held for `seq` beyond its record (the draft model's KV).
    pub(crate) fn release(&mut self, seq: SeqId) {
        if let Some(runner) = &mut self.runner {
            runner.release(seq);
        }
    }

    /// Prepares every candidate's drafter and returns the scheduler's draft inputs.
    pub(crate) fn offers<'a>(
        &mut self,
        candidates: impl Iterator<Item = (SeqId, &'a [u32], &'a mut SeqDrafter)>,
    ) -> Option<DraftInputs> {
        let mut offers = HashMap::new();
        for (seq, tokens, state) in candidates {
            let ctx = DraftContext {
                tokens,
                recycling: &self.recycling,
                prepared: None,
            };
            state.available = state.drafter.prepare(&ctx).min(state.max_draft);
            if state.available == 0 {
                continue;
            }
            // Without drafts there is no evidence, so a ratio that failures pushed below
            // what drafting needs would never rise again: it drifts back towards the
            // method's average, and the sequence tries a small tree now and then.
            state.ratio += RATIO_RECOVERY * (1.0 - state.ratio);
            let method = state.drafter.method();
            let stats = self.stats.entry(method).or_default();
            let expected_accepted = stats
                .curve(state.available)
                .into_iter()
                .enumerate()
                .map(|(i, e)| (e * state.ratio).min((i + 1) as f32))
                .collect();
            let fixed_cost = match (method, self.draft_model_seconds, self.seconds_per_unit) {
                (SpecMethod::DraftModel, Some(seconds), Some(per_unit)) if per_unit > 0.0 => {
                    seconds / per_unit
                }
                _ => 0.0,
            };
            offers.insert(
                seq,
                DraftOffer {
                    expected_accepted,
                    fixed_cost,
                },
            );
        }
        (!offers.is_empty()).then(|| DraftInputs {
            cost: self.config.cost.clone(),
            offers,
        })
    }

    /// Runs the batched drafters (a draft model's forwards) for every `(seq, known tokens,
    /// budget, drafter)` granted this step, before any of them drafts.
    pub(crate) fn prepare_batched(&mut self, granted: &[(SeqId, &[u32], usize, &SeqDrafter)]) {
        let Some(runner) = &mut self.runner else {
            return;
        };
        let uses_model: Vec<(SeqId, &[u32], usize)> = granted
            .iter()
            .filter(|g| g.3.uses_draft_model())
            .map(|g| (g.0, g.1, g.2))
            .collect();
        let drafting: usize = uses_model.iter().filter(|g| g.2 > 0).count();
        let started = std::time::Instant::now();
        if let Err(e) = runner.prepare(&uses_model) {
            tracing::warn!("draft model failed, decoding without its drafts: {e}");
        }
        if drafting > 0 {
            let per_seq = started.elapsed().as_secs_f64() / drafting as f64;
            smooth(&mut self.draft_model_seconds, per_seq);
        }
    }

    /// `seq`'s draft tree for `budget` nodes (root = the pending token, the last of
    /// `tokens`), after [`Speculation::prepare_batched`].
    pub(crate) fn draft(
        &self,
        seq: SeqId,
        tokens: &[u32],
        budget: usize,
        state: &mut SeqDrafter,
    ) -> TokenTree {
        let ctx = DraftContext {
            tokens,
            recycling: &self.recycling,
            prepared: self.runner.as_ref().and_then(|r| r.prepared(seq)),
        };
        state.drafter.draft(&ctx, budget.min(state.available))
    }

    /// Refines the cost curve with one measured forward of `rows` rows.
    pub(crate) fn observe_cost(&mut self, rows: usize, seconds: f64) {
        let units = self.config.cost.cost(rows);
        if units > 0.0 {
            smooth(&mut self.seconds_per_unit, seconds / units);
        }
        self.config.cost.observe(rows, seconds);
    }

    /// Whether the recycling matrix has never seen `token` fed to the model.
    pub(crate) fn is_cold(&self, token: u32) -> bool {
        (token as usize) < self.recycling.vocab() && self.recycling.candidates(token).is_none()
    }

    /// Token Recycling learns from one computed row: `token` was fed, `logits` came out.
    pub(crate) fn learn(&mut self, token: u32, logits: &[f32]) {
        self.recycling.update(token, logits);
    }

    /// Records a verification by `state`'s sequence: its tree and the accepted nodes
    /// (root first).
    pub(crate) fn verified(
        &mut self,
        state: &mut SeqDrafter,
        tree: &TokenTree,
        accepted: &[usize],
    ) {
        let drafted = tree.len().saturating_sub(1);
        if drafted == 0 {
            return;
        }
        let accepted_drafts = accepted.len().saturating_sub(1);
        let method = state.drafter.method();
        let stats = self.stats.entry(method).or_default();
        let expected = stats
            .curve(drafted)
            .last()
            .copied()
            .unwrap_or(0.0)
            .max(0.05);
        let ratio = (accepted_drafts as f32 / expected).clamp(0.05, 3.0);
        state.ratio += 0.2 * (ratio - state.ratio);
        stats.record(drafted, accepted_drafts);
        state.drafter.record(drafted, accepted_drafts);
        let totals = &mut state.totals;
        totals.steps += 1;
        totals.drafted += drafted;
        totals.accepted += accepted_drafts;
        let name = method.as_str();
        use crate::metrics::spec::*;
        metrics::counter!(DRAFT_TOKENS, "method" => name).increment(drafted as u64);
        metrics::counter!(ACCEPTED_TOKENS, "method" => name).increment(accepted_drafts as u64);
        metrics::counter!(VERIFY_STEPS, "method" => name).increment(1);
        for depth in 1..accepted.len() {
            metrics::counter!(ACCEPTED_PER_POSITION, "method" => name, "position" => depth.to_string())
                .increment(1);
        }
    }

    /// Saves the recycling matrix where the configuration says.
    pub(crate) fn save(&self) {
        if let Some(path) = &self.config.recycling_state {
            if let Err(e) = self.recycling.save(path) {
                tracing::warn!("{e}");
            }
        }
    }
}
