//! Every decoder family against an implementation that is not thicket's, on tiny random-weight
//! checkpoints written at test time (`engine::model::testing`): Qwen3 (QK norm, heads wider
//! than the residual) and Gemma 3 (QK norm, pre and post norms, GeGLU, scaled embeddings, five
//! windowed layers to one global with their own RoPE base) against candle-transformers' f32
//! `qwen3` and `gemma3` on the same safetensors. Each compares the prefill's logits and then 32
//! greedy decode steps, the last well past Gemma's window: logits within a tolerance stated
//! against their scale, and the same greedy token at every step. The forward's own properties
//! on these families (the fused pass's bits, trees against chains past the window) are in
//! `forward_families`.

use candle_core::{DType, Device, Tensor};
use candle_transformers::models::{gemma3, qwen3};
use engine::cpu::kv_store::KvDtype;
use engine::model::config::Architecture;
use engine::model::testing::TinyModelSpec;
use engine::sampler::argmax;
use engine::{LogitRows, Model, TokenTree, TreeBatch};

use crate::support::fixtures::{one_sequence, tiny_model};

/// Decode steps after the prompt.
const STEPS: usize = 32;

/// A VarBuilder over one safetensors file in f32.
///
/// # Safety
/// The file must not change while mapped.
unsafe fn varbuilder(path: &std::path::Path) -> candle_nn::VarBuilder<'static> {
    candle_nn::VarBuilder::from_mmaped_safetensors(&[path], DType::F32, &Device::Cpu).unwrap()
}

/// What one comparison found.
struct Agreement {
    /// Largest |ours - theirs| over every step's logits.
    worst: f32,
    /// Largest |logit| the reference produced.
    scale: f32,
    /// Our greedy tokens.
    tokens: Vec<u32>,
}

/// Runs the prompt and `STEPS` greedy steps through both: ours one sequence in the paged
/// store, theirs with its own cache, each fed our greedy token; asserts the greedy choices
/// agree at every step.
fn compare(
    ours: &Model,
    prompt: &[u32],
    mut theirs: impl FnMut(&Tensor, usize) -> candle_core::Result<Tensor>,
) -> Agreement {
    let (table, mut kv) = one_sequence(ours, prompt.len() + STEPS + 1, 4);
    let mut found = Agreement {
        worst: 0.0,
        scale: 0.0,
        tokens: Vec::new(),
    };
    let mut input: Vec<u32> = prompt.to_vec();
    let mut pos = 0;
    for step in 0..=STEPS {
        let mut batch = TreeBatch::new(4);
        batch
            .push(pos, &table, &TokenTree::chain(&input), LogitRows::Last)
            .unwrap();
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
        assert_eq!(
            next, their_next,
            "step {step} (position {pos}): greedy {next} vs the reference's {their_next}"
        );
        found.tokens.push(next);
        pos += input.len();
        input = vec![next];
    }
    found
}

/// Logits agree within this fraction of their largest magnitude: the two implementations
/// compute the same f32 expressions but sum attention and norms in different orders.
const RELATIVE_TOLERANCE: f32 = 1e-4;

fn assert_close(name: &str, found: &Agreement) {
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
        tie_word_embeddings: false,
        seed: 21,
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
        tie_word_embeddings: true,
        seed: 5,
    }
}

const PROMPT: [u32; 6] = [5, 17, 123, 42, 250, 3];

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
