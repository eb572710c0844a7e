//! Every decoder family against an implementation that is not thicket's, on tiny random-weight
//! checkpoints written at test time (`engine::model::testing`): Qwen3 (QK norm, heads wider
//! than the residual) and Gemma 3 (QK norm, pre and post norms, GeGLU, scaled embeddings, five
//! windowed layers to one global with their own RoPE base) against candle-transformers' f32
//! `qwen3` and `gemma3` on the same safetensors. Each compares the prefill's logits and then 32
//! greedy decode steps, the last well past Gemma's window: logits within a tolerance stated
//! against their scale, and the same greedy token at every step. The forward's own properties
//! on these families (the fused pass's bits, trees against chains past the window) are in
//! `forward`. Gemma 2 (soft-capped scores and logits, alternating windows) and Mistral run
//! against candle's `gemma2` and `mistral` within their windows (candle applies those only
//! to a prefill's mask); Llama 3.1's RoPE scaling against candle's `llama`.

use candle_core::{DType, Device, Tensor};
use candle_transformers::models::{gemma2, gemma3, llama, mistral, phi3, qwen3};
use engine::cpu::kv_store::KvDtype;
use engine::model::config::Architecture;
use engine::model::testing::TinyModelSpec;
use engine::sampler::argmax;
use engine::{LogitRows, Model, SeqState, TokenTree, TreeBatch};

use crate::support::fixtures::{one_sequence, tiny_model};

/// Decode steps after the prompt.
pub(crate) const STEPS: usize = 32;

/// A VarBuilder over one safetensors file in f32.
///
/// # Safety
/// The file must not change while mapped.
pub(crate) unsafe fn varbuilder(path: &std::path::Path) -> candle_nn::VarBuilder<'static> {
    candle_nn::VarBuilder::from_mmaped_safetensors(&[path], DType::F32, &Device::Cpu).unwrap()
}

/// What one comparison found.
pub(crate) struct Agreement {
    /// Largest |ours - theirs| over every step's logits.
    pub worst: f32,
    /// Largest |logit| the reference produced.
    pub scale: f32,
    /// Our greedy tokens.
    pub tokens: Vec<u32>,
    /// Steps whose greedy choices differed within the near-tie allowance.
    pub near_ties: usize,
}

/// Runs the prompt and `STEPS` greedy steps through both: ours one sequence in the paged
/// store, theirs with its own cache, each fed our greedy token; asserts the greedy choices
/// agree at every step.
pub(crate) fn compare(
    ours: &Model,
    prompt: &[u32],
    theirs: impl FnMut(&Tensor, usize) -> candle_core::Result<Tensor>,
) -> Agreement {
    compare_within(ours, prompt, theirs, 0.0)
}

/// `compare`, where a step may choose another token than the reference when the two lie within
/// `near_tie` of each other in the reference's logits (counted in `near_ties`).
pub(crate) fn compare_within(
    ours: &Model,
    prompt: &[u32],
    mut theirs: impl FnMut(&Tensor, usize) -> candle_core::Result<Tensor>,
    near_tie: f32,
) -> Agreement {
    let (table, mut kv) = one_sequence(ours, prompt.len() + STEPS + 1, 4);
    let mut found = Agreement {
        worst: 0.0,
        scale: 0.0,
        tokens: Vec::new(),
        near_ties: 0,
    };
    let mut input: Vec<u32> = prompt.to_vec();
    let mut pos = 0;
    for step in 0..=STEPS {
        let mut batch = TreeBatch::new(4);
        batch
            .push(pos, &table, &TokenTree::chain(&input), LogitRows::Last)
            .unwrap();
        // A recurrent layer's state (slot 0) follows the kept chain; others ignore it.
        batch.set_state(0, KEPT).unwrap();
        let mine = ours.forward(&batch, &mut kv).unwrap();
        let mine = mine.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let x = Tensor::new(input.as_slice(), &Device::Cpu)
            .unwrap()
            .unsqueeze(0)
            .unwrap();
        let other = theirs(&x, pos).unwrap();
        let other = other.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(mine.len(), other.len(), "vocabulary sizes differ");
        for (a, b) in mine.iter().zip(&other) {
            found.worst = found.worst.max((a - b).abs());
            found.scale = found.scale.max(b.abs());
        }
        let (next, their_next) = (argmax(&mine), argmax(&other));
        if next != their_next {
            // Only a near-tie may go either way: within `near_tie` in the reference's logits.
            let gap = other[their_next as usize] - other[next as usize];
            assert!(
                gap <= near_tie,
                "step {step} (position {pos}): greedy {next} vs the reference's {their_next}, \
                 {gap} apart in its logits"
            );
            found.near_ties += 1;
        }
        found.tokens.push(next);
        pos += input.len();
        input = vec![next];
    }
    found
}

/// The one sequence of a test's batches, in state slot 0, keeping its rows.
pub(crate) const KEPT: SeqState = SeqState {
    slot: 0,
    commits: true,
    resume: None,
};

/// The one sequence of a test's batches, in state slot 0, its rows verified but not kept.
pub(crate) const VERIFIED: SeqState = SeqState {
    slot: 0,
    commits: false,
    resume: None,
};

/// Logits agree within this fraction of their largest magnitude: the two implementations
/// compute the same f32 expressions but sum attention and norms in different orders.
pub(crate) const RELATIVE_TOLERANCE: f32 = 1e-4;

pub(crate) fn assert_close(name: &str, found: &Agreement) {
    assert!(
        found.scale > 1.0,
        "{name}: degenerate logits (max |logit| {}) make the comparison meaningless",
        found.scale
    );
    assert!(
        found.worst <= RELATIVE_TOLERANCE * found.scale,
        "{name}: max |ours - candle| = {} against logits up to {}",
        found.worst,
        found.scale
    );
    // A model whose greedy output is one token repeated says little about its attention.
    let distinct: std::collections::HashSet<_> = found.tokens.iter().collect();
    assert!(distinct.len() > 4, "{name}: tokens {:?}", found.tokens);
}

/// A Qwen3-shaped tiny model: 4 query heads of 32 over a residual of 64.
pub fn tiny_qwen3() -> TinyModelSpec {
    TinyModelSpec {
        architecture: Architecture::Qwen3,
        vocab_size: 300,
        hidden_size: 64,
        intermediate_size: 96,
        num_layers: 3,
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: Some(32),
        sliding_window: None,
        rope_scaling: None,
        partial_rotary_factor: None,
        tie_word_embeddings: false,
        seed: 21,
        experts: None,
    }
}

/// A Gemma 3-shaped tiny model: seven layers (windowed but for the sixth), windows of 8,
/// one KV head of 32 under 4 query heads over a residual of 64, tied head.
pub fn tiny_gemma3() -> TinyModelSpec {
    TinyModelSpec {
        architecture: Architecture::Gemma3,
        vocab_size: 300,
        hidden_size: 64,
        intermediate_size: 96,
        num_layers: 7,
        num_heads: 4,
        num_kv_heads: 1,
        head_dim: Some(32),
        sliding_window: Some(8),
        rope_scaling: None,
        partial_rotary_factor: None,
        tie_word_embeddings: true,
        seed: 5,
        experts: None,
    }
}

pub(crate) const PROMPT: [u32; 6] = [5, 17, 123, 42, 250, 3];

#[test]
fn tiny_qwen3_matches_candle_qwen3() {
    let (dir, ours) = tiny_model(&tiny_qwen3());
    assert_eq!(ours.config().attention_width(), 128);
    let ours = ours.with_kv_dtype(KvDtype::F32);
    let cfg: qwen3::Config =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("config.json")).unwrap())
            .unwrap();
    let vb = unsafe { varbuilder(&dir.path().join("model.safetensors")) };
    let mut reference = qwen3::ModelForCausalLM::new(&cfg, vb).unwrap();
    let found = compare(&ours, &PROMPT, |x, pos| reference.forward(x, pos));
    assert_close("qwen3", &found);
}

#[test]
fn tiny_gemma3_matches_candle_gemma3_past_its_window() {
    let spec = tiny_gemma3();
    let (dir, ours) = tiny_model(&spec);
    let cfg = ours.config();
    let windowed: Vec<bool> = (0..7)
        .map(|i| cfg.layer_attention(i).window.is_some())
        .collect();
    assert_eq!(windowed, [true, true, true, true, true, false, true]);
    let ours = ours.with_kv_dtype(KvDtype::F32);
    let cfg: gemma3::Config =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("config.json")).unwrap())
            .unwrap();
    let vb = unsafe { varbuilder(&dir.path().join("model.safetensors")) };
    let mut reference = gemma3::Model::new(false, &cfg, vb).unwrap();
    // The prompt is shorter than the window: candle's prefill mask lets a row see one key more
    // than the window (`j + window < i` masked), while its decoding cache holds exactly the
    // window, as transformers and llama.cpp count it. The 32 steps then run to position 38.
    assert!(PROMPT.len() < spec.sliding_window.unwrap());
    let found = compare(&ours, &PROMPT, |x, pos| reference.forward(x, pos));
    assert_close("gemma3", &found);
}

/// A Gemma 2-shaped tiny model (soft-caps of 4 on scores and 15 on logits; windows of 64,
/// beyond these sequences).
pub fn tiny_gemma2() -> TinyModelSpec {
    TinyModelSpec {
        architecture: Architecture::Gemma2,
        num_layers: 6,
        sliding_window: Some(64),
        seed: 11,
        ..tiny_gemma3()
    }
}

#[test]
fn tiny_gemma2_matches_candle_gemma2() {
    let (dir, ours) = tiny_model(&tiny_gemma2());
    let v = &ours.config().variant;
    assert_eq!(
        (v.attention_softcap, v.final_softcap),
        (Some(4.0), Some(15.0))
    );
    let ours = ours.with_kv_dtype(KvDtype::F32);
    let cfg: gemma2::Config =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("config.json")).unwrap())
            .unwrap();
    let vb = unsafe { varbuilder(&dir.path().join("model.safetensors")) };
    let mut reference = gemma2::Model::new(false, &cfg, vb).unwrap();
    let found = compare(&ours, &PROMPT, |x, pos| reference.forward(x, pos));
    assert_close("gemma2", &found);
    assert!(
        found.scale < 15.0,
        "soft-capped logits reach {}",
        found.scale
    );
}

#[test]
fn tiny_mistral_matches_candle_mistral() {
    let spec = TinyModelSpec {
        architecture: Architecture::Mistral,
        vocab_size: 300,
        sliding_window: Some(64),
        seed: 4,
        ..TinyModelSpec::default()
    };
    let (dir, ours) = tiny_model(&spec);
    assert_eq!(ours.config().layer_attention(0).window, Some(64));
    let ours = ours.with_kv_dtype(KvDtype::F32);
    let cfg: mistral::Config =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("config.json")).unwrap())
            .unwrap();
    let vb = unsafe { varbuilder(&dir.path().join("model.safetensors")) };
    let mut reference = mistral::Model::new(&cfg, vb).unwrap();
    let found = compare(&ours, &PROMPT, |x, pos| reference.forward(x, pos));
    assert_close("mistral", &found);
}

#[test]
fn llama3_rope_scaling_matches_candle_llama() {
    // Frequencies whose wavelength passes 16 positions are divided by 8, those between 4 and
    // 16 are blended: over 39 positions the scaled and plain tables differ.
    let spec = TinyModelSpec {
        vocab_size: 300,
        seed: 12,
        ..TinyModelSpec::default()
    };
    let dir = tempfile::tempdir().unwrap();
    engine::model::testing::write_tiny_hf_model(dir.path(), &spec).unwrap();
    let path = dir.path().join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    config["rope_scaling"] = serde_json::json!({
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    });
    std::fs::write(&path, config.to_string()).unwrap();
    let (ours, _) =
        engine::model::load::load_hf_model(dir.path(), engine::WeightDType::F32, &Device::Cpu)
            .unwrap();
    let ours = ours.with_kv_dtype(KvDtype::F32);
    let cfg: llama::LlamaConfig = serde_json::from_str(&config.to_string()).unwrap();
    let cfg = cfg.into_config(false);
    let vb = unsafe { varbuilder(&dir.path().join("model.safetensors")) };
    let reference = llama::Llama::load(vb, &cfg).unwrap();
    let mut cache = llama::Cache::new(true, DType::F32, &cfg, &Device::Cpu).unwrap();
    let found = compare(&ours, &PROMPT, |x, pos| {
        reference.forward(x, pos, &mut cache)
    });
    assert_close("llama3-scaled llama", &found);

    // The scaling matters here: the plain table gives other logits.
    config["rope_scaling"] = serde_json::Value::Null;
    std::fs::write(&path, config.to_string()).unwrap();
    let (plain, _) =
        engine::model::load::load_hf_model(dir.path(), engine::WeightDType::F32, &Device::Cpu)
            .unwrap();
    let plain = plain.with_kv_dtype(KvDtype::F32);
    let (table, mut kv) = one_sequence(&plain, PROMPT.len() + STEPS + 1, 4);
    let mut input = PROMPT.to_vec();
    input.extend(&found.tokens[..STEPS]);
    let mut batch = TreeBatch::new(4);
    batch
        .push(0, &table, &TokenTree::chain(&input), LogitRows::Last)
        .unwrap();
    let unscaled = plain.forward(&batch, &mut kv).unwrap();
    let (table, mut kv) = one_sequence(&ours, PROMPT.len() + STEPS + 1, 4);
    let mut batch = TreeBatch::new(4);
    batch
        .push(0, &table, &TokenTree::chain(&input), LogitRows::Last)
        .unwrap();
    let scaled = ours.forward(&batch, &mut kv).unwrap();
    let moved = crate::support::fixtures::max_abs_diff(&scaled, &unscaled);
    assert!(
        moved > 1e-2,
        "scaling moved the last logits by only {moved}"
    );
}

/// A Phi-3-shaped tiny model: q/k/v and gate/up stored fused; no window (candle's `phi3`
/// takes none).
pub fn tiny_phi3() -> TinyModelSpec {
    TinyModelSpec {
        architecture: Architecture::Phi3,
        vocab_size: 300,
        seed: 14,
        ..TinyModelSpec::default()
    }
}

/// A Phi-4-mini-shaped tiny model: RoPE turns three quarters of each head (12 of 16).
pub fn tiny_phi3_partial_rotary() -> TinyModelSpec {
    TinyModelSpec {
        partial_rotary_factor: Some(0.75),
        seed: 16,
        ..tiny_phi3()
    }
}

#[test]
fn tiny_phi3_with_partial_rotary_matches_candle_phi3() {
    let (dir, ours) = tiny_model(&tiny_phi3_partial_rotary());
    assert_eq!(ours.config().rotary_dim(), 12);
    let ours = ours.with_kv_dtype(KvDtype::F32);
    let cfg: phi3::Config =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("config.json")).unwrap())
            .unwrap();
    assert_eq!(cfg.partial_rotary_factor, Some(0.75));
    let vb = unsafe { varbuilder(&dir.path().join("model.safetensors")) };
    let mut reference = phi3::Model::new(&cfg, vb).unwrap();
    let found = compare(&ours, &PROMPT, |x, pos| reference.forward(x, pos));
    assert_close("phi3 with partial rotary", &found);
    // Candle's ops (the reference path) turn the same dimensions as the fused pass.
    let (_ops_dir, ops) = tiny_model(&tiny_phi3_partial_rotary());
    let ops = ops
        .with_attention(engine::cpu::attention::AttentionKernel::Reference)
        .with_kv_dtype(KvDtype::F32);
    let vb = unsafe { varbuilder(&dir.path().join("model.safetensors")) };
    let mut reference = phi3::Model::new(&cfg, vb).unwrap();
    let found = compare(&ops, &PROMPT, |x, pos| reference.forward(x, pos));
    assert_close("phi3 with partial rotary, candle's ops", &found);
}

#[test]
fn tiny_phi3_with_fused_projections_matches_candle_phi3() {
    let (dir, ours) = tiny_model(&tiny_phi3());
    let ours = ours.with_kv_dtype(KvDtype::F32);
    let cfg: phi3::Config =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("config.json")).unwrap())
            .unwrap();
    let vb = unsafe { varbuilder(&dir.path().join("model.safetensors")) };
    let mut reference = phi3::Model::new(&cfg, vb).unwrap();
    let found = compare(&ours, &PROMPT, |x, pos| reference.forward(x, pos));
    assert_close("phi3", &found);
}
