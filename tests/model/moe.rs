//! Mixtures of experts against implementations that are not thicket's, on tiny random-weight
//! checkpoints written at test time: Qwen3-MoE, Mixtral and Qwen2-MoE (with its gated shared
//! expert) against candle-transformers' f32 `qwen3_moe`, `mixtral` and `qwen2_moe` on the
//! same safetensors (prefill and 32 greedy steps: logits within a tolerance of their scale,
//! the same greedy token at every step); Qwen3-MoE with dense layers between the mixtures and
//! without normalized weights; each family's GGUF (experts stacked as llama.cpp's converter
//! stacks them) loading to the model its HF checkpoint loads to; and the forward's properties
//! on a quantized mixture whose rows route to different experts: a tree node computes what
//! its root path computes as a chain, and the fused CPU pass gives the candle-ops bits.

use candle_core::quantized::{gguf_file, GgmlDType};
use candle_core::{DType, Device};
use candle_transformers::models::{mixtral, qwen2_moe, qwen3_moe};
use engine::cpu::kv_store::KvDtype;
use engine::model::config::Architecture;
use engine::model::experts::Mlp;
use engine::model::testing::{write_tiny_gguf, TinyExperts, TinyModelSpec};
use engine::Model;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::families::{assert_close, compare, varbuilder, PROMPT};
use super::families_gguf::as_reference;
use super::forward::{prompt_then_tree_bits, quantized_tiny, random_tree, tree_vs_chains};
use crate::support::fixtures::tiny_model;

/// A tiny mixture of `arch`: 8 experts of 32 over a residual of 64, 2 per token, three layers.
pub fn tiny_moe(arch: Architecture) -> TinyModelSpec {
    TinyModelSpec {
        architecture: arch,
        vocab_size: 300,
        hidden_size: 64,
        intermediate_size: 96,
        num_layers: 3,
        num_heads: 4,
        num_kv_heads: 2,
        // Qwen3's heads are wider than the residual.
        head_dim: Some(if arch == Architecture::Qwen3Moe {
            32
        } else {
            16
        }),
        tie_word_embeddings: false,
        seed: 11,
        experts: Some(TinyExperts {
            count: 8,
            used: 2,
            width: 32,
            shared_width: (arch == Architecture::Qwen2Moe).then_some(48),
            normalize: arch == Architecture::Qwen3Moe,
            dense_layers: Vec::new(),
        }),
        ..TinyModelSpec::default()
    }
}

fn config_text(dir: &tempfile::TempDir) -> String {
    std::fs::read_to_string(dir.path().join("config.json")).unwrap()
}

/// `ours` (with f32 K/V) against the candle model `build` makes from the checkpoint in `dir`,
/// its `config.json` as `edit` leaves it: the prefill and `STEPS` greedy steps, fed the same
/// tokens, must agree (`assert_close`).
fn assert_matches_candle<C: serde::de::DeserializeOwned, M>(
    name: &str,
    dir: &tempfile::TempDir,
    ours: Model,
    edit: impl FnOnce(&mut serde_json::Value),
    build: impl FnOnce(&C, candle_nn::VarBuilder<'static>) -> candle_core::Result<M>,
    forward: impl Fn(&mut M, &candle_core::Tensor, usize) -> candle_core::Result<candle_core::Tensor>,
) {
    let ours = ours.with_kv_dtype(KvDtype::F32);
    let mut json: serde_json::Value = serde_json::from_str(&config_text(dir)).unwrap();
    edit(&mut json);
    let cfg: C = serde_json::from_value(json).unwrap();
    let vb = unsafe { varbuilder(&dir.path().join("model.safetensors")) };
    let mut reference = build(&cfg, vb).unwrap();
    let found = compare(&ours, &PROMPT, |x, pos| forward(&mut reference, x, pos));
    assert_close(name, &found);
}

/// How many experts the first mixture's router picks across `rows` random rows: a mixture
/// whose rows all pick the same experts would test little of the grouping.
fn experts_used(model: &Model, rows: usize) -> usize {
    let moe = model
        .weights()
        .layers
        .iter()
        .find_map(|l| match &l.mlp {
            Mlp::Experts(moe) => Some(moe),
            Mlp::Dense(_) => None,
        })
        .expect("a mixture");
    let mut rng = StdRng::seed_from_u64(3);
    let h: Vec<f32> = (0..rows * moe.hidden())
        .map(|_| rng.random_range(-1.0..1.0))
        .collect();
    let routes = moe.route(&h);
    let distinct: std::collections::HashSet<_> = routes.experts.iter().collect();
    distinct.len()
}

#[test]
fn tiny_qwen3moe_matches_candle_qwen3_moe() {
    let (dir, ours) = tiny_model(&tiny_moe(Architecture::Qwen3Moe));
    assert_eq!(
        ours.config().variant.moe.as_ref().map(|m| m.normalize),
        Some(true)
    );
    assert!(experts_used(&ours, 16) > 4);
    assert_matches_candle(
        "qwen3moe",
        &dir,
        ours,
        |_| {},
        qwen3_moe::ModelForCausalLM::new,
        qwen3_moe::ModelForCausalLM::forward,
    );
}

#[test]
fn tiny_qwen3moe_with_dense_layers_and_plain_weights_matches_candle() {
    // Layers 0 and 2 dense (`mlp_only_layers`), the chosen weights not normalized. candle
    // reads the same split from `decoder_sparse_step = 2` (it has no `mlp_only_layers`).
    let mut spec = tiny_moe(Architecture::Qwen3Moe);
    if let Some(moe) = spec.experts.as_mut() {
        moe.dense_layers = vec![0, 2];
        moe.normalize = false;
    }
    let (dir, ours) = tiny_model(&spec);
    let kinds: Vec<bool> = ours
        .weights()
        .layers
        .iter()
        .map(|l| matches!(l.mlp, Mlp::Experts(_)))
        .collect();
    assert_eq!(kinds, [false, true, false]);
    assert_matches_candle(
        "qwen3moe with dense layers",
        &dir,
        ours,
        |c| c["decoder_sparse_step"] = 2.into(),
        qwen3_moe::ModelForCausalLM::new,
        qwen3_moe::ModelForCausalLM::forward,
    );
}

#[test]
fn tiny_mixtral_matches_candle_mixtral() {
    let (dir, ours) = tiny_model(&tiny_moe(Architecture::Mixtral));
    assert!(experts_used(&ours, 16) > 4);
    // candle's Mixtral config wants a window and its flash-attention switch.
    assert_matches_candle(
        "mixtral",
        &dir,
        ours,
        |c| {
            c["use_flash_attn"] = false.into();
            c["sliding_window"] = 4096.into();
        },
        mixtral::Model::new,
        mixtral::Model::forward,
    );
}

#[test]
fn tiny_qwen2moe_with_its_shared_expert_matches_candle_qwen2_moe() {
    let (dir, ours) = tiny_model(&tiny_moe(Architecture::Qwen2Moe));
    let moe = ours.config().variant.moe.clone().unwrap();
    assert_eq!((moe.shared_width, moe.normalize), (Some(48), false));
    assert_matches_candle(
        "qwen2moe",
        &dir,
        ours,
        |_| {},
        qwen2_moe::Model::new,
        qwen2_moe::Model::forward,
    );
}

#[test]
fn every_mixture_loads_the_same_model_from_gguf_and_hf() {
    for arch in [
        Architecture::Qwen3Moe,
        Architecture::Mixtral,
        Architecture::Qwen2Moe,
    ] {
        let spec = tiny_moe(arch);
        let (_hf_dir, hf) = tiny_model(&spec);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny.gguf");
        write_tiny_gguf(&path, &spec, GgmlDType::F32).unwrap();
        let (config, weights) =
            engine::model::gguf::load_gguf_weights(&path, Some(DType::F32), &Device::Cpu).unwrap();
        let gguf = Model::new(config, weights, Device::Cpu).unwrap();
        // Mixtral's GGUF says llama, and llama with experts is Mixtral's mixture.
        let family = match arch {
            Architecture::Mixtral => Architecture::Llama,
            other => other,
        };
        assert_eq!(gguf.config().architecture, family);
        assert_eq!(
            gguf.config().variant.moe,
            hf.config().variant.moe,
            "{arch:?}"
        );
        let found = compare(&gguf, &PROMPT, as_reference(&hf));
        assert_close(&format!("{arch:?} GGUF vs HF"), &found);
    }
}

#[test]
fn tree_nodes_route_as_their_chains_do_on_quantized_mixtures() {
    // Trees of 24 nodes: their rows route to different experts in one step, each expert's
    // rows multiplied together, and every node must still compute its chain's bits.
    for arch in [Architecture::Qwen3Moe, Architecture::Qwen2Moe] {
        let spec = tiny_moe(arch);
        let (_dir, model) = quantized_tiny(&spec);
        let vocab = spec.vocab_size as u32;
        let mut rng = StdRng::seed_from_u64(21);
        let prefix: Vec<u32> = (0..11).map(|_| rng.random_range(0..vocab)).collect();
        for _ in 0..2 {
            let tree = random_tree(&mut rng, 24, vocab);
            let worst = tree_vs_chains(&model, &prefix, &tree);
            assert_eq!(
                worst, 0.0,
                "{arch:?}: tree vs chain logits differ by {worst}"
            );
        }
    }
}

#[test]
fn the_fused_pass_gives_the_candle_ops_bits_on_mixtures() {
    for arch in [
        Architecture::Qwen3Moe,
        Architecture::Mixtral,
        Architecture::Qwen2Moe,
    ] {
        let (_dir, model) = quantized_tiny(&tiny_moe(arch));
        assert!(model.is_fused(), "{arch:?}: the fused pass does not apply");
        let reference = model.clone().without_fused_pass();
        let (fused, candle) = (
            prompt_then_tree_bits(&model),
            prompt_then_tree_bits(&reference),
        );
        let differ = fused.iter().zip(&candle).filter(|(a, b)| a != b).count();
        assert_eq!(
            differ,
            0,
            "{arch:?}: {differ} of {} logits differ",
            fused.len()
        );
    }
}

/// The load error of a tiny Qwen3-MoE whose `config.json` is changed by `edit`.
fn load_error(edit: impl Fn(&mut serde_json::Value)) -> String {
    let dir = tempfile::tempdir().unwrap();
    engine::model::testing::write_tiny_hf_model(dir.path(), &tiny_moe(Architecture::Qwen3Moe))
        .unwrap();
    let mut json: serde_json::Value = serde_json::from_str(&config_text(&dir)).unwrap();
    edit(&mut json);
    std::fs::write(dir.path().join("config.json"), json.to_string()).unwrap();
    match engine::model::load::load_hf_model(dir.path(), engine::WeightDType::F32, &Device::Cpu) {
        Ok(_) => panic!("loaded a model it should refuse"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn routing_thicket_does_not_implement_is_refused_by_name() {
    let e = load_error(|c| c["scoring_func"] = "sigmoid".into());
    assert!(e.contains("scoring_func = 'sigmoid'"), "{e}");
    let e = load_error(|c| c["n_group"] = 4.into());
    assert!(e.contains("n_group"), "{e}");
    let e = load_error(|c| c["routed_scaling_factor"] = 2.5.into());
    assert!(e.contains("routed_scaling_factor"), "{e}");
    let e = load_error(|c| c["num_experts_per_tok"] = 9.into());
    assert!(e.contains("9 experts used of 8"), "{e}");
    let e = load_error(|c| c["mlp_only_layers"] = serde_json::json!([5]));
    assert!(e.contains("mlp_only_layers names layer 5"), "{e}");
    // A mixture wider than its tensors: the tensor is named.
    let e = load_error(|c| c["moe_intermediate_size"] = 40.into());
    assert!(
        e.contains("model.layers.0.mlp.experts.0.gate_proj.weight"),
        "{e}"
    );
    // A family with no experts refuses a file that declares them.
    let e = load_error(|c| {
        c["architectures"] = serde_json::json!(["Qwen3ForCausalLM"]);
    });
    assert!(
        e.contains("declares 8 experts, but this family has none"),
        "{e}"
    );
}

/// The load error of a tiny Qwen3-MoE GGUF rewritten with `extra` metadata and without the
/// tensor `drop` names.
fn gguf_load_error(extra: &[(&str, gguf_file::Value)], drop: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    write_tiny_gguf(&path, &tiny_moe(Architecture::Qwen3Moe), GgmlDType::Q8_0).unwrap();
    let mut file = std::fs::File::open(&path).unwrap();
    let content = gguf_file::Content::read(&mut file).unwrap();
    let mut metadata: Vec<(String, gguf_file::Value)> =
        content.metadata.clone().into_iter().collect();
    metadata.extend(extra.iter().map(|(k, v)| (k.to_string(), v.clone())));
    let tensors: Vec<(String, candle_core::quantized::QTensor)> = content
        .tensor_infos
        .keys()
        .filter(|name| name.as_str() != drop)
        .map(|name| {
            (
                name.clone(),
                content.tensor(&mut file, name, &Device::Cpu).unwrap(),
            )
        })
        .collect();
    let edited = dir.path().join("edited.gguf");
    let mut out = std::fs::File::create(&edited).unwrap();
    let metadata: Vec<(&str, &gguf_file::Value)> =
        metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensors: Vec<(&str, &candle_core::quantized::QTensor)> =
        tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    gguf_file::write(&mut out, &metadata, &tensors).unwrap();
    match engine::model::gguf::load_gguf_weights(&edited, None, &Device::Cpu) {
        Ok(_) => panic!("loaded a GGUF it should refuse"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_gguf_mixture_thicket_cannot_run_is_refused_by_name() {
    let e = gguf_load_error(
        &[("qwen3moe.expert_gating_func", gguf_file::Value::U32(2))],
        "",
    );
    assert!(
        e.contains("qwen3moe.expert_gating_func = 2 (sigmoid)"),
        "{e}"
    );
    let e = gguf_load_error(
        &[("qwen3moe.expert_weights_scale", gguf_file::Value::F32(2.5))],
        "",
    );
    assert!(e.contains("qwen3moe.expert_weights_scale"), "{e}");
    let e = gguf_load_error(&[], "blk.1.ffn_up_exps.weight");
    assert!(e.contains("missing tensor blk.1.ffn_up_exps.weight"), "{e}");
    let e = gguf_load_error(&[("qwen3moe.expert_count", gguf_file::Value::U32(6))], "");
    assert!(e.contains("blk.0.ffn_gate_inp.weight"), "{e}");
}

#[test]
fn transformers_5_stacked_experts_load_as_the_per_expert_checkpoint_does() {
    // The same tiny mixtures saved the way transformers 5 keeps experts: one `gate_up_proj`
    // (gate rows first) and one `down_proj` per layer, under `mlp` (Mixtral's
    // `block_sparse_moe` renamed).
    for arch in [Architecture::Qwen3Moe, Architecture::Mixtral] {
        let spec = tiny_moe(arch);
        let (dir, per_expert) = tiny_model(&spec);
        let file = dir.path().join("model.safetensors");
        let mut tensors = candle_core::safetensors::load(&file, &Device::Cpu).unwrap();
        let (block, names) = match arch {
            Architecture::Mixtral => ("block_sparse_moe", ["w1", "w3", "w2"]),
            _ => ("mlp", ["gate_proj", "up_proj", "down_proj"]),
        };
        let count = spec.experts.as_ref().unwrap().count;
        for i in 0..spec.num_layers {
            let p = format!("model.layers.{i}");
            let mut take = |e: usize, k: usize| {
                tensors
                    .remove(&format!("{p}.{block}.experts.{e}.{}.weight", names[k]))
                    .unwrap()
            };
            let (mut gate_up, mut down) = (Vec::new(), Vec::new());
            for e in 0..count {
                let (gate, up) = (take(e, 0), take(e, 1));
                gate_up.push(candle_core::Tensor::cat(&[gate, up], 0).unwrap());
                down.push(take(e, 2));
            }
            let stack = |ts: Vec<candle_core::Tensor>| candle_core::Tensor::stack(&ts, 0).unwrap();
            tensors.insert(format!("{p}.mlp.experts.gate_up_proj"), stack(gate_up));
            tensors.insert(format!("{p}.mlp.experts.down_proj"), stack(down));
            let router = tensors.remove(&format!("{p}.{block}.gate.weight")).unwrap();
            tensors.insert(format!("{p}.mlp.gate.weight"), router);
        }
        candle_core::safetensors::save(&tensors, &file).unwrap();
        let (stacked, _) =
            engine::model::load::load_hf_model(dir.path(), engine::WeightDType::F32, &Device::Cpu)
                .unwrap();
        let found = compare(&stacked, &PROMPT, as_reference(&per_expert));
        assert_eq!(found.worst, 0.0, "{arch:?}: the layouts give other logits");
        assert_close(&format!("{arch:?} stacked"), &found);
    }
}
