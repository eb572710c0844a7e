//! Shared fixtures: the default model loaded once per test binary, tiny random models in
//! temporary directories, and logits helpers.

use std::sync::OnceLock;

use candle_core::Tensor;
use engine::model::fetch::{resolve_model, ModelSource};
use engine::model::testing::{write_tiny_hf_model, TinyModelSpec};
use engine::{LoadOptions, LoadedModel, Model, PagedKvStore, WeightDType};
use kvcache::{BlockPool, BlockTable};

/// SmolLM2-135M (Q4_1 GGUF), fetched into `$THICKET_MODELS` on first use.
pub fn smollm2() -> &'static LoadedModel {
    static MODEL: OnceLock<LoadedModel> = OnceLock::new();
    MODEL.get_or_init(|| {
        engine::load_model("smollm2-135m", &LoadOptions::default()).expect("load smollm2-135m")
    })
}

/// SmolLM2-135M with weights dequantized to f32 (no 8-bit activation rounding).
pub fn smollm2_f32() -> &'static LoadedModel {
    static MODEL: OnceLock<LoadedModel> = OnceLock::new();
    MODEL.get_or_init(|| {
        let options = LoadOptions {
            dtype: WeightDType::F32,
            ..LoadOptions::default()
        };
        engine::load_model("smollm2-135m", &options).expect("load smollm2-135m as f32")
    })
}

/// The engine thread on SmolLM2 with `config`.
pub fn spawn_smollm2(config: engine::EngineConfig) -> engine::handle::EngineHandle {
    let loaded = smollm2();
    let (handle, _thread) = engine::spawn(
        loaded.model.clone(),
        std::sync::Arc::new(loaded.tokenizer.clone()),
        loaded.tokenizer.eos_ids().to_vec(),
        config,
    )
    .expect("start the engine on smollm2");
    handle
}

/// Path of the SmolLM2 GGUF.
pub fn smollm2_path() -> std::path::PathBuf {
    match resolve_model("smollm2-135m").expect("resolve smollm2-135m") {
        ModelSource::Gguf(path) => path,
        other => panic!("unexpected source {other:?}"),
    }
}

/// A tiny random model written to a fresh temp dir and loaded in f32.
pub fn tiny_model(spec: &TinyModelSpec) -> (tempfile::TempDir, Model) {
    let dir = tempfile::tempdir().expect("tempdir");
    write_tiny_hf_model(dir.path(), spec).expect("write tiny model");
    let (model, _) =
        engine::model::load::load_hf_model(dir.path(), WeightDType::F32, &candle_core::Device::Cpu)
            .expect("load tiny model");
    (dir, model)
}

/// Largest absolute difference between two equally shaped tensors.
pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    let a = a.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let b = b.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    assert_eq!(a.len(), b.len(), "shape mismatch");
    a.iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Prompts of varied kind and length for generation tests.
pub const PROMPTS: &[&str] = &[
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "<|im_start|>user\nWrite a haiku about autumn leaves.<|im_end|>\n<|im_start|>assistant\n",
    "Once upon a time, in a small village at the edge of a dark forest, there lived",
    "Q: If a train travels 60 miles per hour for 2.5 hours, how far does it go?\nA:",
    "1, 2, 3, 5, 8, 13,",
    "Photosynthesis is the process by which",
    "<|im_start|>user\nList three uses of copper.<|im_end|>\n<|im_start|>assistant\n",
];

/// Path of the Qwen2.5-Coder-0.5B GGUF (qwen2 architecture, ~491 MB), fetched on first use.
pub fn qwen_path() -> std::path::PathBuf {
    match resolve_model("qwen2.5-coder-0.5b").expect("resolve qwen2.5-coder-0.5b") {
        ModelSource::Gguf(path) => path,
        other => panic!("unexpected source {other:?}"),
    }
}

/// Path of the Gemma 3 270M GGUF (SentencePiece tokenizer, ~253 MB), fetched on first use.
pub fn gemma3_path() -> std::path::PathBuf {
    match resolve_model("gemma3-270m").expect("resolve gemma3-270m") {
        ModelSource::Gguf(path) => path,
        other => panic!("unexpected source {other:?}"),
    }
}

/// The tokenizer of the Gemma 3 270M GGUF (only its header and metadata are read), built
/// once per test binary.
pub fn gemma3_tokenizer() -> &'static engine::ModelTokenizer {
    static TOKENIZER: OnceLock<engine::ModelTokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        let (content, _) =
            engine::model::gguf::read_content(&gemma3_path()).expect("read the gemma3-270m GGUF");
        engine::ModelTokenizer::from_gguf(&content).expect("build the gemma3-270m tokenizer")
    })
}

/// A block table holding `len` positions (blocks of `block_size`, allocated in order) and a
/// KV store sized for it: the setup of every single-sequence forward test.
pub fn one_sequence(model: &Model, len: usize, block_size: usize) -> (BlockTable, PagedKvStore) {
    let mut pool = BlockPool::new(len.div_ceil(block_size), block_size);
    let mut table = BlockTable::new();
    assert!(table.ensure_capacity(len, &mut pool));
    (table, model.new_kv_store(pool.num_slots()))
}
