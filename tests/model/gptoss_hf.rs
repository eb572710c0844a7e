//! gpt-oss as Hugging Face checkpoints (`GptOssForCausalLM`): the tiny models of
//! `tests/model/gptoss.rs` written by `engine::model::testing::write_tiny_gptoss_hf` (the same
//! weights as the GGUFs, laid out as the released checkpoints), against transformers' greedy
//! tokens and logits on the same files (recorded by `scripts/transformers-reference.py` in
//! `tests/data/gptoss*_transformers.json`): dense experts, MXFP4 blocks and scales, and YaRN
//! with its ramp unrounded in transformers 5's `rope_parameters` as gpt-oss's configs ask;
//! MXFP4 experts kept on thicket's kernels as the GGUF's are; a directory with its template
//! beside the tokenizer loading as `thicket serve --model DIR` loads it; and what thicket does
//! not compute refused by name.

use candle_core::quantized::GgmlDType;
use candle_core::DType;
use engine::model::config::RopeScaling;
use engine::model::experts::Mlp;
use engine::model::testing::{write_tiny_gptoss_hf, GptOssHfConfig, TinyGptOss};
use engine::{Model, WeightDType};

use super::gptoss::{load, tiny_f32};

/// The dense case, the MXFP4 one, and the MXFP4 one with YaRN unrounded.
fn cases() -> [(TinyGptOss, GptOssHfConfig); 3] {
    let untruncated = GptOssHfConfig {
        untruncated: true,
        rope_parameters: true,
    };
    [
        (tiny_f32(), GptOssHfConfig::default()),
        (TinyGptOss::default(), GptOssHfConfig::default()),
        (TinyGptOss::default(), untruncated),
    ]
}

fn write_reference(case: usize) {
    let dir = std::env::var("THICKET_REFERENCE_HF").expect("THICKET_REFERENCE_HF");
    let (spec, how) = &cases()[case];
    write_tiny_gptoss_hf(std::path::Path::new(&dir), spec, *how).unwrap();
}

/// Writes the tiny gpt-oss (dense experts) as an HF checkpoint where `THICKET_REFERENCE_HF`
/// says, for `scripts/transformers-reference.py --case gptoss`.
#[test]
#[ignore = "writes the reference checkpoint for scripts/transformers-reference.py"]
fn write_the_hf_reference() {
    write_reference(0);
}

/// Its MXFP4 twin, for `--case gptoss_mxfp4`.
#[test]
#[ignore = "writes the reference checkpoint for scripts/transformers-reference.py"]
fn write_the_mxfp4_hf_reference() {
    write_reference(1);
}

/// The MXFP4 one with YaRN unrounded, for `--case gptoss_untruncated`.
#[test]
#[ignore = "writes the reference checkpoint for scripts/transformers-reference.py"]
fn write_the_untruncated_hf_reference() {
    write_reference(2);
}

/// Case `case` as an HF checkpoint loaded with `dtype` (an f32 KV cache).
fn hf(case: usize, dtype: WeightDType) -> (tempfile::TempDir, Model) {
    let (spec, how) = &cases()[case];
    let dir = tempfile::tempdir().unwrap();
    write_tiny_gptoss_hf(dir.path(), spec, *how).unwrap();
    let (model, _) =
        engine::model::load::load_hf_model(dir.path(), dtype, &candle_core::Device::Cpu).unwrap();
    (dir, f32_kv(model))
}

/// Case `case` in f32 against transformers' recorded run on the same file.
fn matches_transformers(case: usize, reference: &str) {
    let (dir, model) = hf(case, WeightDType::F32);
    let bytes = std::fs::read(dir.path().join("model.safetensors")).unwrap();
    super::llamacpp_reference::check_recorded(reference, &bytes, |_| model.clone(), 1e-4);
}

#[test]
fn gptoss_from_hf_matches_transformers() {
    matches_transformers(0, include_str!("../data/gptoss_transformers.json"));
}

#[test]
fn mxfp4_gptoss_from_hf_matches_transformers() {
    matches_transformers(1, include_str!("../data/gptoss_mxfp4_transformers.json"));
}

#[test]
fn unrounded_yarn_from_rope_parameters_matches_transformers() {
    let (_dir, model) = hf(2, WeightDType::F32);
    assert!(matches!(
        model.config().variant.rope_scaling,
        RopeScaling::Yarn {
            truncate: false,
            original: 256,
            ..
        }
    ));
    matches_transformers(
        2,
        include_str!("../data/gptoss_untruncated_transformers.json"),
    );
}

#[test]
fn gptoss_loads_the_same_model_from_gguf_and_hf() {
    let (_dir, hf) = hf(0, WeightDType::F32);
    let gguf = f32_kv(load(&tiny_f32(), GgmlDType::F32, Some(DType::F32)).0);
    let (a, b) = (gguf.config(), hf.config());
    assert_eq!(a.variant.rope_scaling, b.variant.rope_scaling);
    let windows = |m: &Model| -> Vec<Option<usize>> {
        (0..m.config().num_layers)
            .map(|i| m.config().layer_attention(i).window)
            .collect()
    };
    assert_eq!(windows(&hf), [Some(16), None, Some(16), None]);
    assert_eq!(windows(&gguf), windows(&hf));
    let found = super::families::compare(
        &hf,
        &super::families::PROMPT,
        super::families_gguf::as_reference(&gguf),
    );
    // The same weights, the same kernels: the same bits.
    assert_eq!(found.worst, 0.0, "gpt-oss HF vs GGUF");
    assert!(found.scale > 1.0);
}

fn f32_kv(model: Model) -> Model {
    model.with_kv_dtype(engine::cpu::kv_store::KvDtype::F32)
}

/// The bytes one expert's gate reads: MXFP4's 17 a block of 32 where it stays MXFP4.
fn gate_bytes(model: &Model) -> usize {
    let Mlp::Experts(moe) = &model.weights().layers[0].mlp else {
        panic!("a dense layer")
    };
    moe.experts[0].gate.weight_bytes()
}

#[test]
fn mxfp4_experts_stay_on_thicket_kernels_and_compute_what_the_gguf_does() {
    let spec = TinyGptOss::default();
    let (_dir, packed) = hf(1, WeightDType::Auto);
    // 64 rows of 64 values.
    assert_eq!(gate_bytes(&packed), 64 * 64 / 32 * 17);
    let (_dir, dense) = hf(1, WeightDType::F32);
    assert_eq!(gate_bytes(&dense), 64 * 64 * 4);
    let gguf = f32_kv(load(&spec, GgmlDType::F32, None).0);
    assert_eq!(gate_bytes(&gguf), gate_bytes(&packed));
    let found = super::families::compare(
        &packed,
        &super::families::PROMPT,
        super::families_gguf::as_reference(&gguf),
    );
    // MXFP4 blocks regrouped from the checkpoint's layout are the GGUF's own bits.
    assert_eq!(found.worst, 0.0, "MXFP4 gpt-oss HF vs GGUF");
    assert!(found.scale > 1.0);
}

#[test]
fn a_directory_with_its_template_beside_the_tokenizer_loads_as_serve_loads_it() {
    let (spec, how) = &cases()[1];
    let dir = tempfile::tempdir().unwrap();
    write_tiny_gptoss_hf(dir.path(), spec, *how).unwrap();
    engine::model::testing::write_tiny_tokenizer(dir.path(), spec.vocab_size).unwrap();
    let template = include_str!("../data/gptoss_chat_template.jinja");
    std::fs::write(dir.path().join("chat_template.jinja"), template).unwrap();
    let loaded = engine::model::load::load_model(
        dir.path().to_str().unwrap(),
        &engine::model::load::LoadOptions::default(),
    )
    .unwrap();
    assert_eq!(loaded.tokenizer.chat_template(), Some(template));
    assert_eq!(
        loaded.model.config().architecture,
        engine::model::config::Architecture::GptOss
    );
    assert_eq!(gate_bytes(&loaded.model), 64 * 64 / 32 * 17);
}

/// `config.json` of case `case` with `key` set to `value`, then the loader's error.
fn refusal(case: usize, key: &str, value: serde_json::Value) -> String {
    let (spec, how) = &cases()[case];
    let dir = tempfile::tempdir().unwrap();
    write_tiny_gptoss_hf(dir.path(), spec, *how).unwrap();
    let path = dir.path().join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    config[key] = value;
    std::fs::write(&path, config.to_string()).unwrap();
    load_error(dir.path(), &format!("{key} = {}", config[key]))
}

/// The loader's error on the checkpoint in `dir`, which must not load (`what` says why).
fn load_error(dir: &std::path::Path, what: &str) -> String {
    match engine::model::load::load_hf_model(dir, WeightDType::Auto, &candle_core::Device::Cpu) {
        Ok(_) => panic!("{what} was read"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn what_thicket_does_not_compute_is_refused_by_name() {
    for (key, value, named) in [
        ("swiglu_limit", serde_json::json!(5.0), "swiglu_limit = 5"),
        ("swiglu_alpha", serde_json::json!(1.0), "swiglu_alpha = 1"),
        (
            "quantization_config",
            serde_json::json!({"quant_method": "fp8"}),
            "quant_method = 'fp8'",
        ),
        // A shape the blocks do not have.
        ("intermediate_size", serde_json::json!(96), "gate_up_proj"),
    ] {
        let err = refusal(1, key, value);
        assert!(err.contains(named), "{key}: {err}");
    }
    // Another family's quantized checkpoint is refused the same way.
    let dir = tempfile::tempdir().unwrap();
    engine::model::testing::write_tiny_hf_model(dir.path(), &Default::default()).unwrap();
    let path = dir.path().join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    config["quantization_config"] = serde_json::json!({"quant_method": "awq", "bits": 4});
    std::fs::write(&path, config.to_string()).unwrap();
    let err = load_error(dir.path(), "an AWQ checkpoint");
    assert!(err.contains("quant_method = 'awq'"), "{err}");
}
