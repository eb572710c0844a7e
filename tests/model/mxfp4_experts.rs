//! A mixture whose stacked experts are MXFP4 (as llama.cpp's `MXFP4_MOE` files and gpt-oss
//! keep them; GGML type 39, which candle cannot read): it loads, its experts run on thicket's
//! MXFP4 kernels read into memory or mapped from the prepared-experts file alike, and it
//! computes what the same model computes with those experts as plain F32 values: bit for bit
//! with dense weights, and each expert's projections on the kernels within what the 8-bit
//! quantization of their input can make them differ. An
//! MXFP4 tensor outside a mixture's experts is refused in one line.

use std::path::Path;

use candle_core::quantized::GgmlDType;
use candle_core::{DType, Device};
use engine::model::config::Architecture;
use engine::model::experts::Mlp;
use engine::model::testing::{quantize_mxfp4, retype_gguf, write_tiny_gguf, Blocks};
use engine::Model;

use super::forward::prompt_then_tree_bits;
use super::moe::tiny_moe;

fn load(path: &Path, dtype: Option<DType>, prepared: Option<&Path>) -> Model {
    let (config, weights) =
        engine::model::gguf::load_gguf_weights_with(path, dtype, &Device::Cpu, prepared).unwrap();
    Model::new(config, weights, Device::Cpu).unwrap()
}

/// MXFP4 expert matrices, and how many of them are mapped from a file.
fn mxfp4_experts(model: &Model) -> (usize, usize) {
    let mut counts = (0, 0);
    for layer in &model.weights().layers {
        if let Mlp::Experts(moe) = &layer.mlp {
            for linear in moe.experts.iter().flat_map(|e| e.projections()) {
                if let Some(m) = linear.packed() {
                    if m.format() == engine::cpu::qgemm::formats::QuantFormat::Mxfp4 {
                        counts.0 += 1;
                        counts.1 += usize::from(m.is_mapped());
                    }
                }
            }
        }
    }
    counts
}

#[test]
fn mxfp4_experts_compute_what_their_values_compute() {
    for arch in [Architecture::Qwen3Moe, Architecture::Mixtral] {
        let dir = tempfile::tempdir().unwrap();
        let q8 = dir.path().join("q8.gguf");
        write_tiny_gguf(&q8, &tiny_moe(arch), GgmlDType::Q8_0).unwrap();
        // The same experts twice: as MXFP4 blocks, and as the F32 values those blocks hold.
        let experts = |name: &str| name.ends_with("_exps.weight");
        let mxfp4 = dir.path().join("mxfp4.gguf");
        retype_gguf(&q8, &mxfp4, |name, values| {
            experts(name).then(|| Blocks::mxfp4(values))
        })
        .unwrap();
        let f32_copy = dir.path().join("f32.gguf");
        retype_gguf(&q8, &f32_copy, |name, values| {
            experts(name).then(|| {
                let blocks = quantize_mxfp4(values);
                let matrix = engine::cpu::qgemm::QuantMatrix::new(
                    engine::cpu::qgemm::formats::QuantFormat::Mxfp4,
                    values.len() / 32,
                    32,
                    blocks,
                )
                .unwrap();
                Blocks::f32(&matrix.dequantize().unwrap())
            })
        })
        .unwrap();

        // Dense weights: the MXFP4 file's experts are exactly the F32 file's.
        let dense = prompt_then_tree_bits(&load(&f32_copy, Some(DType::F32), None));
        let from_mxfp4 = prompt_then_tree_bits(&load(&mxfp4, Some(DType::F32), None));
        assert_eq!(from_mxfp4, dense, "{arch:?}: dense MXFP4 experts");

        // On the kernels, in memory and mapped alike.
        let in_memory = load(&mxfp4, None, None);
        assert_eq!(mxfp4_experts(&in_memory), (3 * 8 * 3, 0), "{arch:?}");
        let kernels = prompt_then_tree_bits(&in_memory);
        let prepared = dir.path().join("prepared");
        let mapped = load(&mxfp4, None, Some(&prepared));
        if engine::cpu::qgemm::process_isa().reads_tiles16() {
            assert_eq!(mxfp4_experts(&mapped), (3 * 8 * 3, 3 * 8 * 3), "{arch:?}");
        }
        assert_eq!(prompt_then_tree_bits(&mapped), kernels, "{arch:?}: mapped");

        // Each expert's projection on the kernels against the same expert's F32 values: off
        // by no more than quantizing the input to 8 bits per block of 32 can make it.
        let dense_model = load(&f32_copy, Some(DType::F32), None);
        let mut checked = 0;
        for (q, d) in in_memory
            .weights()
            .layers
            .iter()
            .zip(&dense_model.weights().layers)
        {
            let (Mlp::Experts(q), Mlp::Experts(d)) = (&q.mlp, &d.mlp) else {
                continue;
            };
            let pairs = q.experts.iter().zip(&d.experts);
            for (q, d) in pairs.flat_map(|(q, d)| q.projections().into_iter().zip(d.projections()))
            {
                let w: Vec<Vec<f32>> = d.dense_weight().unwrap().to_vec2().unwrap();
                let k = w[0].len();
                let x: Vec<f32> = (0..k)
                    .map(|i| ((i * 37 + checked) % 101) as f32 / 50.0 - 1.0)
                    .collect();
                let xt = candle_core::Tensor::from_slice(&x, (1, k), &Device::Cpu).unwrap();
                let got: Vec<f32> = q
                    .forward(&xt)
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1()
                    .unwrap();
                let want: Vec<f32> = d
                    .forward(&xt)
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1()
                    .unwrap();
                let step = x
                    .chunks(32)
                    .map(|b| b.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0);
                let steps: Vec<f32> = step.collect();
                for (row, (a, b)) in w.iter().zip(got.iter().zip(&want)) {
                    let bound: f32 = row
                        .iter()
                        .enumerate()
                        .map(|(i, v)| v.abs() * steps[i / 32])
                        .sum();
                    assert!(
                        (a - b).abs() <= bound + 1e-5,
                        "{arch:?}: {a} vs {b}, bound {bound}"
                    );
                }
                checked += 1;
            }
        }
        assert_eq!(checked, 3 * 8 * 3, "{arch:?}: every expert's projections");
    }
}

#[test]
fn an_mxfp4_tensor_outside_the_experts_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let q8 = dir.path().join("q8.gguf");
    write_tiny_gguf(&q8, &tiny_moe(Architecture::Qwen3Moe), GgmlDType::Q8_0).unwrap();
    let mxfp4 = dir.path().join("mxfp4.gguf");
    retype_gguf(&q8, &mxfp4, |name, values| {
        (name == "blk.1.attn_q.weight").then(|| Blocks::mxfp4(values))
    })
    .unwrap();
    let err = match engine::model::gguf::load_gguf_weights(&mxfp4, None, &Device::Cpu) {
        Ok(_) => panic!("an MXFP4 attention weight is not read"),
        Err(e) => e,
    };
    let message = err.to_string();
    assert!(
        message.contains("tensor 'blk.1.attn_q.weight' is stored as MXFP4 (GGML type 39)")
            && message.contains("only in a mixture's stacked experts"),
        "{message}"
    );
}
