//! LFM2, the first hybrid: most layers a gated short convolution whose inputs the paged store
//! keeps per position, a few attending. A tiny random-weight GGUF written at test time
//! (`engine::model::testing::write_tiny_lfm2_gguf`) against candle-transformers'
//! `quantized_lfm2` (an implementation that is not thicket's: its own GGUF reader, a Conv1d
//! over the prefill and a rolling state while decoding), in f32 and in Q8_0, and against
//! llama.cpp's recorded run; the same weights as an HF checkpoint against candle's `lfm2` and
//! loading to the GGUF's model; then the forward's
//! own properties on it: the fused pass gives the candle-ops bits, a prompt prefilled in one
//! chunk, in chunks whose boundaries fall inside the convolution's window, or token by token
//! gives the same logits, and every node of a draft tree the logits of its root path run as a
//! chain (a node convolves its ancestors' inputs, never a sibling's).

use candle_core::quantized::GgmlDType;
use candle_core::{DType, Device};
use candle_transformers::models::quantized_lfm2;
use engine::cpu::attention::AttentionKernel;
use engine::cpu::kv_store::KvDtype;
use engine::model::config::LayerMixer;
use engine::model::testing::{write_tiny_lfm2_gguf, write_tiny_lfm2_hf, TinyLfm2};
use engine::{Model, QuantKernel};

use super::families::{assert_close, compare, compare_within, PROMPT};
use super::forward::prefill_logits;
use super::hybrid_checks::{
    chunked_prefill_gives_token_by_token, fused_gives_candle_bits, matches_llama_cpp_in_chunks,
    tree_nodes_give_root_paths,
};
use super::llamacpp_reference::largest_difference;

/// The tiny LFM2 of these tests: four layers, the second and fourth attending.
pub(crate) fn tiny_lfm2() -> TinyLfm2 {
    TinyLfm2 {
        vocab_size: 300,
        ..TinyLfm2::default()
    }
}

/// `spec` written as a GGUF in `dtype`, loaded dense in f32 (`dense`) or kept quantized.
pub(crate) fn lfm2_model(
    spec: &TinyLfm2,
    dtype: GgmlDType,
    dense: bool,
) -> (tempfile::TempDir, Model) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lfm2.gguf");
    write_tiny_lfm2_gguf(&path, spec, dtype).unwrap();
    let (config, weights) =
        engine::model::gguf::load_gguf_weights(&path, dense.then_some(DType::F32), &Device::Cpu)
            .unwrap();
    (dir, Model::new(config, weights, Device::Cpu).unwrap())
}

/// candle-transformers' LFM2 on the file `ours` was loaded from.
fn reference(dir: &tempfile::TempDir) -> quantized_lfm2::ModelWeights {
    let path = dir.path().join("lfm2.gguf");
    let mut file = std::fs::File::open(&path).unwrap();
    let content = candle_core::quantized::gguf_file::Content::read(&mut file).unwrap();
    quantized_lfm2::ModelWeights::from_gguf(content, &mut file, &Device::Cpu).unwrap()
}

#[test]
fn the_declaration_reads_which_layers_convolve_from_the_file() {
    let (_dir, model) = lfm2_model(&tiny_lfm2(), GgmlDType::F32, true);
    let cfg = model.config();
    let kinds: Vec<LayerMixer> = (0..4).map(|i| cfg.layer_mixer(i)).collect();
    let conv = LayerMixer::ShortConv { kernel: 3 };
    assert_eq!(
        kinds,
        [conv, LayerMixer::Attention, conv, LayerMixer::Attention]
    );
    assert_eq!((cfg.num_kv_heads, cfg.head_dim), (2, 16));
    // The convolution layers read three positions: the model's window.
    assert_eq!(model.kv_window(), Some(3));
    let (full, windowed) = model.kv_bytes_per_position_split();
    // Two attending layers of K and V (2 heads of 16, f16); two rows of 64 f32 inputs.
    assert_eq!((full, windowed), (2 * 2 * 32 * 2, 2 * 64 * 4));
}

#[test]
fn tiny_lfm2_f32_matches_candle_quantized_lfm2() {
    let (dir, ours) = lfm2_model(&tiny_lfm2(), GgmlDType::F32, true);
    let ours = ours.with_kv_dtype(KvDtype::F32);
    let mut theirs = reference(&dir);
    let found = compare(&ours, &PROMPT, |x, pos| theirs.forward(x, pos));
    assert_close("lfm2 f32 vs candle", &found);
}

#[test]
fn tiny_lfm2_q8_0_matches_candle_quantized_lfm2() {
    let (dir, ours) = lfm2_model(&tiny_lfm2(), GgmlDType::Q8_0, false);
    // candle's arithmetic for the products and attention, so that what differs is the
    // convolution's bookkeeping alone.
    let ours = ours
        .with_attention(AttentionKernel::Reference)
        .with_quant_kernel(QuantKernel::Candle)
        .unwrap()
        .with_kv_dtype(KvDtype::F32);
    let mut theirs = reference(&dir);
    let found = compare_within(&ours, &PROMPT, |x, pos| theirs.forward(x, pos), 0.25);
    super::families_gguf::assert_q8_close(&found);
}

/// The tiny LFM2 written as an HF checkpoint, loaded in f32.
fn lfm2_hf(spec: &TinyLfm2) -> (tempfile::TempDir, Model) {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_lfm2_hf(dir.path(), spec).unwrap();
    let (model, _) =
        engine::model::load::load_hf_model(dir.path(), engine::WeightDType::F32, &Device::Cpu)
            .unwrap();
    (dir, model)
}

#[test]
fn lfm2_loads_the_same_model_from_gguf_and_hf() {
    let (_g, gguf) = lfm2_model(&tiny_lfm2(), GgmlDType::F32, true);
    let (_h, hf) = lfm2_hf(&tiny_lfm2());
    let (a, b) = (gguf.config(), hf.config());
    assert_eq!(a.variant.mixers, b.variant.mixers);
    assert_eq!(
        (a.intermediate_size, a.num_kv_heads, a.head_dim),
        (b.intermediate_size, b.num_kv_heads, b.head_dim)
    );
    let found = compare(&hf, &PROMPT, super::families_gguf::as_reference(&gguf));
    assert_close("lfm2 HF vs GGUF", &found);
}

#[test]
fn tiny_lfm2_hf_matches_candle_lfm2() {
    use candle_transformers::models::lfm2;
    let (dir, ours) = lfm2_hf(&tiny_lfm2());
    let ours = ours.with_kv_dtype(KvDtype::F32);
    let text = std::fs::read_to_string(dir.path().join("config.json")).unwrap();
    let cfg: lfm2::Lfm2Config = serde_json::from_str(&text).unwrap();
    let cfg = cfg.into_config(false);
    assert_eq!(cfg.intermediate_size, ours.config().intermediate_size);
    // SAFETY: the file is not changed while mapped.
    let vb = unsafe { super::families::varbuilder(&dir.path().join("model.safetensors")) };
    let theirs = lfm2::Model::new(&cfg, vb).unwrap();
    let mut cache = lfm2::Cache::new(true, DType::F32, &cfg, &Device::Cpu).unwrap();
    let found = compare(&ours, &PROMPT, |x, pos| theirs.forward(x, pos, &mut cache));
    assert_close("lfm2 HF vs candle lfm2", &found);
}

#[test]
fn lfm2_fused_pass_gives_the_candle_ops_bits() {
    let (_dir, model) = lfm2_model(&tiny_lfm2(), GgmlDType::Q8_0, false);
    fused_gives_candle_bits(&model);
}

/// The last position's logits for `prompt` prefilled in one chunk.
fn last_logits(model: &Model, prompt: &[u32]) -> Vec<f32> {
    let all = prefill_logits(model, prompt, prompt.len());
    all[all.len() - model.config().vocab_size..].to_vec()
}

#[test]
fn lfm2_prefill_in_chunks_gives_the_token_by_token_logits() {
    // Chunk boundaries at every offset inside the three-position window, and one chunk.
    let (_dir, model) = lfm2_model(&tiny_lfm2(), GgmlDType::Q8_0, false);
    chunked_prefill_gives_token_by_token(&model, 9);
}

#[test]
fn lfm2_tree_nodes_match_their_root_paths() {
    let (_dir, model) = lfm2_model(&tiny_lfm2(), GgmlDType::Q8_0, false);
    tree_nodes_give_root_paths(&model, 4);
}

#[test]
fn lfm2_a_row_sees_its_window_and_nothing_older() {
    // Two prompts that differ only before the last nine positions: four convolutions of
    // three positions each reach 1 + 4 * 2 = 9 positions back, attention reaches all. With
    // every layer convolving the last rows' logits are equal; with attention they differ.
    let (_dir, model) = lfm2_model(&tiny_lfm2(), GgmlDType::F32, true);
    let last = |prompt: &[u32]| last_logits(&model, prompt);
    let tail = [50, 60, 70, 80, 90, 100, 110, 120, 130];
    let with = |head: &[u32], tail: &[u32]| [head, tail].concat();
    let a = last(&with(&[1, 2, 3, 4], &tail));
    let b = last(&with(&[9, 8, 7, 6], &tail));
    assert!(
        largest_difference(&a, &b) > 1e-3,
        "attention layers see the whole prompt"
    );
    let all_conv = TinyLfm2 {
        attention_layers: Vec::new(),
        ..tiny_lfm2()
    };
    let (_dir, conv_only) = lfm2_model(&all_conv, GgmlDType::F32, true);
    let last = |prompt: &[u32]| last_logits(&conv_only, prompt);
    let (a, b) = (
        last(&with(&[1, 2, 3, 4], &tail)),
        last(&with(&[9, 8, 7, 6], &tail)),
    );
    assert_eq!(
        largest_difference(&a, &b),
        0.0,
        "four convolutions see nine positions"
    );
    let mut moved = tail;
    moved[0] = 51;
    let c = last(&with(&[9, 8, 7, 6], &moved));
    assert!(
        largest_difference(&a, &c) > 1e-3,
        "the oldest position they reach counts"
    );
}

#[test]
fn lfm2_matches_llama_cpp() {
    // llama.cpp's greedy tokens and logits on the same file, recorded by
    // scripts/rope-scaling-reference.py (f32 weights and K/V, the prompt as one batch).
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lfm2.gguf");
    write_tiny_lfm2_gguf(&path, &tiny_lfm2(), GgmlDType::F32).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let (config, weights) =
        engine::model::gguf::load_gguf_weights(&path, Some(DType::F32), &Device::Cpu).unwrap();
    let model = Model::new(config, weights, Device::Cpu)
        .unwrap()
        .with_kv_dtype(KvDtype::F32);
    // Measured: 0.0021 against logits up to 5.4 (ggml's f32 products and norms sum in another
    // order); greedy tokens identical for 32 steps; the prompt prefilled in chunks of 1, 2
    // and 4 ends on llama.cpp's first logits too.
    matches_llama_cpp_in_chunks(
        &model,
        &bytes,
        include_str!("../data/lfm2_llamacpp.json"),
        1e-3,
    );
}

/// Writes the tiny LFM2 of `lfm2_matches_llama_cpp` (f32) where `THICKET_REFERENCE_GGUF` says,
/// for `scripts/rope-scaling-reference.py --case lfm2`.
#[test]
#[ignore = "writes the reference GGUF for scripts/rope-scaling-reference.py"]
fn write_the_reference_gguf() {
    let path = std::env::var("THICKET_REFERENCE_GGUF").expect("THICKET_REFERENCE_GGUF");
    write_tiny_lfm2_gguf(std::path::Path::new(&path), &tiny_lfm2(), GgmlDType::F32).unwrap();
}
