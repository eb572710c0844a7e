//! Bad input gives clear errors, never a panic: loading a missing file, a corrupt GGUF header,
//! a GGUF of an unsupported architecture, an HF directory without weights, or a config with an
//! option the family cannot honour (named: an unknown RoPE scaling, activation or layer kind, a
//! missing window, weights that contradict the heads); and running an empty prompt, a token
//! outside the vocabulary or a block table past the KV store.

use crate::support::plain_greedy::{generate_greedy, GreedyOptions};
use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use engine::model::testing::TinyModelSpec;
use engine::{load_model, Error, LoadOptions};

use crate::support::fixtures::tiny_model;

fn load_err(spec: &str) -> Error {
    load_model(spec, &LoadOptions::default()).expect_err("load should fail")
}

#[test]
fn missing_file_is_reported() {
    let err = load_err("/definitely/not/here/model.gguf");
    assert!(matches!(err, Error::ModelNotFound(_)), "{err:?}");
    assert!(err.to_string().contains("/definitely/not/here/model.gguf"));
}

#[test]
fn corrupt_header_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("corrupt.gguf");
    std::fs::write(&path, b"GGUF\x03\x00\x00\x00garbage that is not a header").unwrap();
    let err = load_err(path.to_str().unwrap());
    assert!(matches!(err, Error::InvalidGguf { .. }), "{err:?}");
    let not_gguf = dir.path().join("text.gguf");
    std::fs::write(&not_gguf, b"hello").unwrap();
    assert!(matches!(
        load_err(not_gguf.to_str().unwrap()),
        Error::InvalidGguf { .. }
    ));
}

#[test]
fn unsupported_architecture_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gpt2.gguf");
    let arch = Value::String("gpt2".into());
    let weight = QTensor::quantize(
        &Tensor::zeros((4, 32), candle_core::DType::F32, &Device::Cpu).unwrap(),
        GgmlDType::F32,
    )
    .unwrap();
    let mut file = std::fs::File::create(&path).unwrap();
    gguf_file::write(
        &mut file,
        &[("general.architecture", &arch)],
        &[("token_embd.weight", &weight)],
    )
    .unwrap();
    drop(file);
    let err = load_err(path.to_str().unwrap());
    assert!(
        matches!(err, Error::UnsupportedArchitecture(ref a) if a == "gpt2"),
        "{err:?}"
    );
    assert!(err.to_string().contains("supported: llama, qwen2"));
}

#[test]
fn hf_dir_without_weights_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    engine::model::testing::write_tiny_hf_model(dir.path(), &TinyModelSpec::default()).unwrap();
    std::fs::remove_file(dir.path().join("model.safetensors")).unwrap();
    let err = load_err(dir.path().to_str().unwrap());
    assert!(matches!(err, Error::MissingFile(_)), "{err:?}");
}

#[test]
fn empty_prompt_is_rejected() {
    let (_dir, model) = tiny_model(&TinyModelSpec::default());
    let err =
        generate_greedy(&model, &[vec![1, 2], vec![]], &GreedyOptions::default()).unwrap_err();
    assert!(matches!(err, Error::EmptyPrompt), "{err:?}");
}

#[test]
fn out_of_range_token_is_rejected() {
    let (_dir, model) = tiny_model(&TinyModelSpec::default());
    let err = generate_greedy(&model, &[vec![1, 100_000]], &GreedyOptions::default()).unwrap_err();
    assert!(err.to_string().contains("outside vocabulary"), "{err}");
}

#[test]
fn context_block_outside_the_store_is_rejected() {
    let (_dir, model) = tiny_model(&TinyModelSpec::default());
    let mut kv = model.new_kv_store(8);
    // Block 5 of size 4 holds slots 20..24, past the 8-slot store; the new row fits.
    let table = kvcache::BlockTable::from_blocks(vec![kvcache::BlockId(5), kvcache::BlockId(1)]);
    let mut batch = engine::TreeBatch::new(4);
    batch
        .push(
            4,
            &table,
            &engine::TokenTree::chain(&[1]),
            engine::LogitRows::Last,
        )
        .unwrap();
    let err = model.forward(&batch, &mut kv).unwrap_err();
    assert!(err.to_string().contains("outside KV store"), "{err}");
}

/// Writes `spec`'s HF checkpoint with `edit` applied to its config, and loads it.
fn load_edited(spec: &TinyModelSpec, edit: impl Fn(&mut serde_json::Value)) -> Error {
    let dir = tempfile::tempdir().unwrap();
    engine::model::testing::write_tiny_hf_model(dir.path(), spec).unwrap();
    let path = dir.path().join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut config);
    std::fs::write(&path, config.to_string()).unwrap();
    engine::model::load::load_hf_model(dir.path(), engine::WeightDType::F32, &Device::Cpu)
        .expect_err("load should fail")
}

#[test]
fn options_a_family_cannot_honour_are_named_at_load() {
    let llama = TinyModelSpec::default();
    let gemma3 = crate::model::families::tiny_gemma3();
    let qwen3 = crate::model::families::tiny_qwen3();
    let cases: Vec<(Error, &str)> = vec![
        (
            load_edited(&llama, |c| {
                c["rope_scaling"] = serde_json::json!({"rope_type": "dynamic", "factor": 4.0})
            }),
            "rope_scaling type 'dynamic'",
        ),
        (
            load_edited(&llama, |c| {
                c["rope_scaling"] = serde_json::json!({"rope_type": "yarn"})
            }),
            "rope_scaling.factor is missing",
        ),
        (
            // transformers 5 writes the scaling in `rope_parameters`.
            load_edited(
                &llama,
                |c| {
                    c["rope_parameters"] = serde_json::json!({"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4})
                },
            ),
            "rope_scaling type 'dynamic'",
        ),
        (
            load_edited(&llama, |c| {
                c["rope_scaling"] = serde_json::json!({"rope_type": "llama3", "factor": 8.0})
            }),
            "rope_scaling.low_freq_factor",
        ),
        (
            load_edited(&llama, |c| {
                c["rope_scaling"] = serde_json::json!({
                    "type": "longrope", "short_factor": vec![1.0; 8], "long_factor": vec![2.0; 8]
                })
            }),
            "original_max_position_embeddings is missing",
        ),
        (
            load_edited(&llama, |c| {
                c["rope_scaling"] = serde_json::json!({
                    "type": "longrope", "short_factor": vec![1.0; 8], "long_factor": vec![2.0; 7],
                    "original_max_position_embeddings": 256
                })
            }),
            "rope_factors_long holds 7 factors for 8 frequencies",
        ),
        (
            load_edited(&llama, |c| {
                c["rope_scaling"] = serde_json::json!({
                    "type": "longrope", "short_factor": "x", "long_factor": vec![2.0; 8],
                    "original_max_position_embeddings": 256
                })
            }),
            "rope_scaling.short_factor is missing or not a list of numbers",
        ),
        (
            load_edited(&llama, |c| c["hidden_act"] = "gelu".into()),
            "hidden_act = 'gelu'",
        ),
        (
            load_edited(&llama, |c| c["partial_rotary_factor"] = 0.35.into()),
            "partial_rotary_factor 0.35 gives 5 rotated dimensions of 16",
        ),
        (
            load_edited(&gemma3, |c| {
                c.as_object_mut().unwrap().remove("sliding_window");
            }),
            "missing the sliding window length",
        ),
        (
            load_edited(&gemma3, |c| {
                c["layer_types"] = serde_json::json!(["sliding_attention", "chunked_attention"])
            }),
            "layer_types: 'chunked_attention'",
        ),
        (
            load_edited(&qwen3, |c| c["use_sliding_window"] = true.into()),
            "a sliding window is set, but this family has none",
        ),
        // The config's heads contradict the weights: the tensor is named.
        (
            load_edited(&qwen3, |c| c["head_dim"] = 16.into()),
            "tensor model.layers.0.self_attn.q_norm.weight has shape [32], but the config \
             implies [16]",
        ),
    ];
    for (err, wanted) in cases {
        assert!(
            matches!(err, Error::Metadata(_)) && err.to_string().contains(wanted),
            "{err} (wanted {wanted:?})"
        );
    }
}
