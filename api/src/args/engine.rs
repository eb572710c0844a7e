//! Engine flags shared by every command that runs the engine (`generate`, `serve`, `batch`,
//! `bench engine`, `bench spec`, `bench edits`): [`KvArgs`], [`SpecArgs`] and [`EngineArgs`]
//! around them, how they become an [`EngineConfig`] for a model (measuring and caching the
//! forward-cost curve the planner weighs drafts with), and [`spawn`], the engine thread over
//! a loaded model.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::Args;
use engine::{
    CostCurve, DraftModelSetup, EngineConfig, EngineHandle, LoadOptions, LoadedModel,
    ManagerConfig, Model, SchedulerConfig, SpecMethod, SpecRequest, SpeculationConfig,
    StateSnapshotConfig, WeightDType,
};

use super::model::parse_dtype;

/// KV cache flags.
#[derive(Debug, Clone, Args)]
pub struct KvArgs {
    /// Positions per KV block.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub block_size: u16,
    /// Do not reuse the KV of previously computed prompt prefixes.
    #[arg(long)]
    pub no_prefix_cache: bool,
    /// Have the OS map the whole KV cache at start rather than page by page as requests
    /// first reach it (and, for a hybrid model, the recurrent states of `--max-num-seqs`
    /// sequences and of the snapshots `--state-snapshot-mib` allows): no request pays for
    /// that, at the cost of a slower start and all of it resident from the start. `bench spec` and `bench engine` always do.
    #[arg(long)]
    pub kv_prefault: bool,
    /// A model whose layers carry a recurrent state (Gated DeltaNet, Mamba-2) resumes a
    /// cached prefix only from a snapshot of that state: keep one at every this many block
    /// boundaries a sequence passes, besides its prompt's last and its latest few (0: only
    /// those).
    #[arg(long, default_value_t = StateSnapshotConfig::default().interval)]
    pub state_snapshot_interval: usize,
    /// Memory for those snapshots, in MiB; past it the least recently used go (at least four
    /// are kept, whatever their size).
    #[arg(
        long,
        default_value_t = StateSnapshotConfig::default().max_bytes >> 20,
        value_parser = parse_snapshot_mib
    )]
    pub state_snapshot_mib: usize,
}

/// `--state-snapshot-mib`: a whole number of MiB, at least 1, that fits in an address.
fn parse_snapshot_mib(s: &str) -> Result<usize, String> {
    let mib: usize = s
        .parse()
        .map_err(|_| format!("'{s}' is not a whole number of MiB"))?;
    if mib == 0 {
        return Err("the snapshots need some memory: 1 MiB or more".into());
    }
    if mib.checked_mul(1 << 20).is_none() {
        return Err(format!("{mib} MiB is more memory than can be addressed"));
    }
    Ok(mib)
}

/// Scheduler and KV pool flags.
#[derive(Debug, Clone, Args)]
pub struct EngineArgs {
    /// KV cache flags.
    #[command(flatten)]
    pub kv: KvArgs,
    /// Memory for the KV cache, in MiB (sets the number of blocks).
    #[arg(long, default_value_t = 2048)]
    pub kv_cache_mib: usize,
    /// Tokens fed to the model in one step; longer prompts are prefilled in chunks.
    #[arg(long, default_value_t = 512)]
    pub max_num_batched_tokens: usize,
    /// Sequences running at once.
    #[arg(long, default_value_t = 64)]
    pub max_num_seqs: usize,
    /// Longest prompt plus output, in tokens [default: the model's context length, within
    /// the KV cache].
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// Requests queued beyond the running ones before new ones are refused.
    #[arg(long, default_value_t = 1024)]
    pub max_queue: usize,
    /// Speculation flags.
    #[command(flatten)]
    pub spec: SpecArgs,
}

/// Speculative decoding flags.
#[derive(Debug, Clone, Args)]
pub struct SpecArgs {
    /// Default speculation method: auto | suffix | recycling | ngram_trie | prompt_lookup |
    /// draft_model | none.
    #[arg(long, default_value = "auto", value_parser = parse_method)]
    pub speculation: SpecMethod,
    /// Most draft tokens per sequence per step.
    #[arg(long, default_value_t = 64)]
    pub max_draft_tokens: usize,
    /// File the Token Recycling matrix is loaded from at start and saved to at shutdown.
    #[arg(long)]
    pub recycling_state: Option<PathBuf>,
    /// Most tokens the global suffix index (what `suffix` drafts from: every request's prompt
    /// and output, per cache salt) holds; past it the oldest requests are evicted. 0 turns
    /// it off. About 33 bytes a token.
    #[arg(long, default_value_t = engine::spec::methods::suffix::global::DEFAULT_BUDGET)]
    pub suffix_index_tokens: usize,
    /// File the global suffix index (of requests without a cache salt) is loaded from at
    /// start and saved to at shutdown. It holds users' prompts and outputs, so it is off
    /// unless given.
    #[arg(long)]
    pub suffix_index_state: Option<PathBuf>,
    /// Forward-cost curve for draft budgets: measure (at start-up) | flat | linear.
    #[arg(long, default_value = "measure", value_parser = ["measure", "flat", "linear"])]
    pub spec_cost: String,
    /// A smaller model with the same tokenizer, for `draft_model` requests (alias, GGUF
    /// file or HF directory).
    #[arg(long)]
    pub draft_model: Option<String>,
    /// Weight representation of the draft model: auto | q | f32 | f16 | bf16.
    #[arg(long, default_value = "auto", value_parser = parse_dtype)]
    pub draft_dtype: WeightDType,
    /// Draft-model tree shape: candidates per depth.
    #[arg(long, value_delimiter = ',', default_value = "4,2,1,1")]
    pub k_config: Vec<usize>,
    /// Memory for the draft model's KV cache, in MiB.
    #[arg(long, default_value_t = 512)]
    pub draft_kv_cache_mib: usize,
}

fn parse_method(s: &str) -> Result<SpecMethod, String> {
    SpecMethod::parse(s).ok_or_else(|| {
        format!(
            "unknown speculation method '{s}' (auto, suffix, recycling, ngram_trie, prompt_lookup, draft_model, none)"
        )
    })
}

impl SpecArgs {
    /// The speculation configuration, measuring the forward-cost curve of `model` when asked
    /// (a few seconds at start-up).
    pub fn config(&self, model: &Model) -> anyhow::Result<SpeculationConfig> {
        let cost = match self.spec_cost.as_str() {
            "flat" => CostCurve::flat(),
            "linear" => CostCurve::linear(),
            _ if self.speculation == SpecMethod::None => CostCurve::linear(),
            _ => measured_cost(model)?,
        };
        let draft_model = match &self.draft_model {
            Some(name) => {
                let options = LoadOptions {
                    dtype: self.draft_dtype,
                    // The draft runs where the target runs.
                    device: engine::DeviceChoice::of(model.device()),
                    ..LoadOptions::default()
                };
                let draft = engine::load_model(name, &options)
                    .with_context(|| format!("loading draft model '{name}'"))?;
                if self.k_config.is_empty() || self.k_config.contains(&0) {
                    bail!("--k-config needs positive candidate counts, e.g. 4,2,1,1");
                }
                let block_size = 16;
                let bytes = self.draft_kv_cache_mib.saturating_mul(1 << 20);
                let num_blocks = EngineConfig::kv_blocks_for(&draft.model, bytes, block_size);
                Some(DraftModelSetup {
                    model: draft.model,
                    k_config: self.k_config.clone(),
                    kv: ManagerConfig {
                        num_blocks,
                        block_size,
                        prefix_caching: true,
                        watermark: 0.0,
                        window: None,
                    },
                })
            }
            None if self.speculation == SpecMethod::DraftModel => {
                bail!("--speculation draft_model needs --draft-model")
            }
            None => None,
        };
        Ok(SpeculationConfig {
            default: SpecRequest {
                method: self.speculation,
                max_draft_tokens: None,
            },
            max_draft_tokens: self.max_draft_tokens,
            cost,
            recycling_state: self.recycling_state.clone(),
            suffix_index_tokens: self.suffix_index_tokens,
            suffix_index_state: self.suffix_index_state.clone(),
            draft_model,
            speculators: Vec::new(),
        })
    }
}

impl EngineArgs {
    /// The engine configuration these flags describe for `model`.
    pub fn config(&self, model: &Model) -> anyhow::Result<EngineConfig> {
        let block_size = usize::from(self.kv.block_size);
        let (num_blocks, window) = EngineConfig::kv_pool_for(
            model,
            self.kv_cache_mib.saturating_mul(1 << 20),
            block_size,
            self.max_num_seqs,
            self.max_num_batched_tokens,
        );
        let pool_len = (num_blocks * block_size).saturating_sub(block_size);
        let model_len = model.config().max_position_embeddings;
        let max_model_len = match self.max_model_len {
            Some(len) if len > model_len => {
                bail!("--max-model-len {len} exceeds the model's context length {model_len}")
            }
            Some(len) if len > pool_len => bail!(
                "--max-model-len {len} does not fit in {} MiB of KV cache ({pool_len} tokens); raise --kv-cache-mib",
                self.kv_cache_mib
            ),
            Some(len) => len,
            None => model_len.min(pool_len),
        };
        if max_model_len < 2 {
            bail!("--kv-cache-mib {} holds too few tokens", self.kv_cache_mib);
        }
        let config = EngineConfig {
            scheduler: SchedulerConfig {
                max_num_batched_tokens: self.max_num_batched_tokens,
                max_num_seqs: self.max_num_seqs,
                max_model_len,
                kv: ManagerConfig {
                    num_blocks,
                    block_size,
                    prefix_caching: !self.kv.no_prefix_cache,
                    watermark: 0.01,
                    window,
                },
            },
            max_pending: self.max_queue + self.max_num_seqs,
            speculation: self.spec.config(model)?,
            kv_prefault: self.kv.kv_prefault,
            state_snapshots: StateSnapshotConfig {
                interval: self.kv.state_snapshot_interval,
                max_bytes: self.kv.state_snapshot_mib.saturating_mul(1 << 20),
            },
        };
        if let Err(e) = config.scheduler.validate() {
            bail!("{e}");
        }
        config.state_snapshots.validate()?;
        Ok(config)
    }
}

/// Starts the engine thread for `loaded` under `config`, with the model's tokenizer and its
/// end-of-sequence tokens.
pub fn spawn(
    loaded: &LoadedModel,
    config: EngineConfig,
) -> anyhow::Result<(EngineHandle, std::thread::JoinHandle<()>)> {
    Ok(engine::spawn(
        loaded.model.clone(),
        Arc::new(loaded.tokenizer.clone()),
        loaded.tokenizer.eos_ids().to_vec(),
        config,
    )?)
}

/// Bumped whenever the forward's code changes its cost, or the way the curve is measured, so
/// curves cached by an older build are measured anew (5: sizes measured in interleaved
/// rounds, nine of them; 6: the kernel prefetches, which made few-row forwards cheaper; 7:
/// knots at 3 and 5 rows too, where small trees are decided, and 25 rounds: with nine, one
/// noisy round moved the small sizes by a tenth; 8: the KV store's value type is in the
/// name, and f16 stores made attention cheaper; 9: Q4_K and Q6_K weights moved from candle's
/// kernels to thicket's on AVX-512; 10: products split into tasks of one size and the tile
/// kernel compiled per format, which made many-row forwards cheaper; 11: one team of workers
/// per forward and the next tile prefetched by the second group of rows, and each size timed
/// after a forward of its own size: cost(1) had read above cost(2); 12: keys stored in tiles
/// and scored with the keys in lanes, which made many-row attention cheaper; 13: the host's
/// CPU and core count are in the name: a models directory shared between a Zen 5 and an
/// Intel Xeon served each the other's curve, on which few-row forwards cost nothing more than
/// one row, and trees were granted that did not pay; 14: sizes up to 8 rows measured in rounds
/// of their own, before the larger ones, which had made one row read 1.5 times its cost; the
/// larger ones in 9 rounds).
const COST_CURVE_VERSION: u32 = 14;

/// The host in a cost curve's name: a short hash of the CPU's model name and the cores the
/// forward runs on.
fn host_tag() -> String {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    engine::calibration::cpu_name().hash(&mut hasher);
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .hash(&mut hasher);
    format!("{:08x}", hasher.finish() as u32)
}

/// The forward-cost curve of `model` on this machine: read from the models directory when
/// it was measured before, else measured now (a few seconds) and stored there.
fn measured_cost(model: &Model) -> anyhow::Result<CostCurve> {
    let c = model.config();
    // Everything that changes the cost is in the name: the model's shape and weights, the
    // kernels and the instruction set they run in, and the version of the forward's code.
    let name = format!(
        "cost-v{COST_CURVE_VERSION}-{}-{}-{}x{}-{}b-{:?}-{}-{}-{}-kv{}.json",
        host_tag(),
        c.architecture.as_str(),
        c.num_layers,
        c.hidden_size,
        model.weight_bytes(),
        model.attention(),
        match model.quant_kernel() {
            Some(kernel) => format!("{kernel:?}"),
            None => "dense".into(),
        },
        engine::cpu::qgemm::process_isa().name(),
        if model.is_fused() { "fused" } else { "ops" },
        model.kv_dtype().name()
    );
    let path = engine::model::fetch::models_dir().join(name);
    if let Ok(text) = std::fs::read_to_string(&path) {
        let points: Option<Vec<(usize, f64)>> = serde_json::from_str(&text).ok();
        if let Some(curve) = points.and_then(CostCurve::new) {
            return Ok(curve);
        }
    }
    let started = std::time::Instant::now();
    // Every size up to 5 rows (small trees are decided there, and 5 rows start a second
    // group of the kernel's rows), then doublings.
    let sizes = [1, 2, 3, 4, 5, 8, 16, 32, 64];
    let points = engine::calibration::forward_cost(model, 64, &sizes, 25)?;
    let curve = CostCurve::new(points.iter().map(|p| (p.new_tokens, p.seconds)).collect())
        .context("the measured forward cost is not usable")?;
    tracing::info!(
        "measured the forward-cost curve in {:.1}s (saved to {}): {:?}",
        started.elapsed().as_secs_f64(),
        path.display(),
        curve.points()
    );
    if let Ok(json) = serde_json::to_string(curve.points()) {
        // A cache only: failing to write it costs a re-measurement next time.
        let _ = std::fs::create_dir_all(engine::model::fetch::models_dir());
        let _ = std::fs::write(&path, json);
    }
    Ok(curve)
}
