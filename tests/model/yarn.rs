//! YaRN, as Qwen2.5 and Qwen3 configs enable it for long contexts: a tiny random Qwen3 with a
//! factor of 4 over an original context of 256, written as llama.cpp's converter writes it
//! (`rope.scaling.type = yarn`, factor, original context). Against llama.cpp on that very file
//! (`tests/data/qwen3_yarn_llamacpp.json`, made by `scripts/rope-scaling-reference.py`): greedy
//! tokens identical for 32 steps and logits within 2e-3 of their scale; plain RoPE gives other
//! logits, so the scaling is checked. The HF checkpoint loads to the model the GGUF loads to.

use engine::cpu::kv_store::KvDtype;
use engine::model::config::RopeScaling;
use engine::model::testing::{write_tiny_gguf, TinyModelSpec};
use engine::{LogitRows, TokenTree, TreeBatch};

use super::families::{assert_close, compare, tiny_qwen3, PROMPT};
use super::llamacpp_reference::{check_recorded, largest_difference};
use super::longrope::gguf_model;
use crate::support::fixtures::{one_sequence, tiny_model};

/// The tiny YaRN Qwen3.
fn tiny_qwen3_yarn(seed: u64) -> TinyModelSpec {
    TinyModelSpec {
        seed,
        rope_scaling: Some(serde_json::json!({
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 256,
        })),
        ..tiny_qwen3()
    }
}

/// A seed whose greedy path in llama.cpp has no near-tie: no two top logits within 0.08.
const SEED: u64 = 18;

/// Writes the GGUF the reference was made from to `$THICKET_REFERENCE_GGUF` (run by
/// `scripts/rope-scaling-reference.py`).
#[test]
#[ignore = "writes the reference script's input; run by scripts/rope-scaling-reference.py"]
fn write_the_reference_gguf() {
    let path = std::env::var("THICKET_REFERENCE_GGUF").expect("THICKET_REFERENCE_GGUF");
    write_tiny_gguf(
        std::path::Path::new(&path),
        &tiny_qwen3_yarn(SEED),
        candle_core::quantized::GgmlDType::F32,
    )
    .unwrap();
}

#[test]
fn qwen3_yarn_matches_llama_cpp() {
    let dir = tempfile::tempdir().unwrap();
    let (model, bytes) = gguf_model(&dir, &tiny_qwen3_yarn(SEED));
    assert!(matches!(
        model.config().variant.rope_scaling,
        RopeScaling::Yarn {
            factor: 4.0,
            original: 256,
            ..
        }
    ));
    let runs = check_recorded(
        include_str!("../data/qwen3_yarn_llamacpp.json"),
        &bytes,
        |_| model.clone().with_kv_dtype(KvDtype::F32),
        2e-3,
    );
    // Without the scaling the prompt's logits differ: the test sees YaRN.
    let spec = TinyModelSpec {
        rope_scaling: None,
        ..tiny_qwen3_yarn(SEED)
    };
    let dir = tempfile::tempdir().unwrap();
    let (plain, _) = gguf_model(&dir, &spec);
    let plain = plain.with_kv_dtype(KvDtype::F32);
    let (table, mut kv) = one_sequence(&plain, PROMPT.len(), 4);
    let mut batch = TreeBatch::new(4);
    batch
        .push(0, &table, &TokenTree::chain(&PROMPT), LogitRows::Last)
        .unwrap();
    let logits = plain.forward(&batch, &mut kv).unwrap();
    let logits = logits.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let apart = largest_difference(&logits, &runs[0][0]);
    assert!(apart > 0.01, "plain RoPE is {apart} from YaRN's logits");
}

#[test]
fn qwen3_yarn_loads_alike_from_hf_and_gguf() {
    let spec = tiny_qwen3_yarn(SEED);
    let (_hf_dir, hf) = tiny_model(&spec);
    let dir = tempfile::tempdir().unwrap();
    let (gguf, _) = gguf_model(&dir, &spec);
    assert_eq!(
        hf.config().variant.rope_scaling,
        gguf.config().variant.rope_scaling
    );
    let found = compare(&gguf, &PROMPT, super::families_gguf::as_reference(&hf));
    assert_close("YaRN GGUF vs HF", &found);
}
