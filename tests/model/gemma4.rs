//! Gemma 4 on a tiny random GGUF written as llama.cpp's converter writes it (`TinyGemma4`:
//! windowed layers of 2 KV heads of 16 and global ones of 1 of 32 with a proportional RoPE,
//! a global layer whose values are its keys' projection, the last two layers reading the keys
//! and values of the last two that keep them with MLPs twice as wide, per-layer embeddings,
//! output scales, a soft-cap; a window of 8 so the 38-position run passes it): against
//! llama.cpp's recorded run on the same file (`tests/data/gemma4_llamacpp.json`, made by
//! `scripts/rope-scaling-reference.py --case gemma4`), greedy tokens identical for 32 steps
//! and logits close; and quantized on thicket's kernels, the fused pass gives the candle-ops
//! bits, a prompt prefilled in chunks the token-by-token bits, and every node of a draft tree
//! its root path's bits (nodes past the window, on the layers that read shared keys and
//! values too).

use candle_core::quantized::GgmlDType;
use candle_core::{DType, Device};
use engine::cpu::kv_store::{KvDtype, LayerStorage};
use engine::model::testing::{write_tiny_gemma4_gguf, TinyGemma4};
use engine::{LogitRows, Model, TokenTree, TreeBatch};
use kvcache::{BlockPool, BlockTable};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::hybrid_checks::{
    chunked_prefill_gives_token_by_token, fused_gives_candle_bits, tree_nodes_give_root_paths,
};

fn load(spec: &TinyGemma4, dtype: GgmlDType, dense: Option<DType>) -> (Model, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gemma4.gguf");
    write_tiny_gemma4_gguf(&path, spec, dtype).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let (config, weights) =
        engine::model::gguf::load_gguf_weights(&path, dense, &Device::Cpu).unwrap();
    (Model::new(config, weights, Device::Cpu).unwrap(), bytes)
}

/// Writes the tiny Gemma 4 (f32) where `THICKET_REFERENCE_GGUF` says, for
/// `scripts/rope-scaling-reference.py --case gemma4`.
#[test]
#[ignore = "writes the reference GGUF for scripts/rope-scaling-reference.py"]
fn write_the_reference_gguf() {
    let path = std::env::var("THICKET_REFERENCE_GGUF").expect("THICKET_REFERENCE_GGUF");
    let spec = TinyGemma4::default();
    write_tiny_gemma4_gguf(std::path::Path::new(&path), &spec, GgmlDType::F32).unwrap();
}

/// The same for the tiny mixture, for `--case gemma4_moe`.
#[test]
#[ignore = "writes the reference GGUF for scripts/rope-scaling-reference.py"]
fn write_the_moe_reference_gguf() {
    let path = std::env::var("THICKET_REFERENCE_GGUF").expect("THICKET_REFERENCE_GGUF");
    let spec = TinyGemma4::mixture();
    write_tiny_gemma4_gguf(std::path::Path::new(&path), &spec, GgmlDType::F32).unwrap();
}

#[test]
fn the_file_declares_its_layers_heads_and_shared_keys_and_values() {
    let spec = TinyGemma4::default();
    let (model, _) = load(&spec, GgmlDType::F32, Some(DType::F32));
    let cfg = model.config();
    let windows: Vec<Option<usize>> = (0..cfg.num_layers)
        .map(|i| cfg.layer_attention(i).window)
        .collect();
    let w = Some(8);
    assert_eq!(windows, [w, w, None, w, None, w, None]);
    let heads: Vec<(usize, usize)> = (0..cfg.num_layers).map(|i| cfg.layer_heads(i)).collect();
    let (l, g) = ((2, 16), (1, 32));
    assert_eq!(heads, [l, l, g, l, g, l, g]);
    let sources: Vec<Option<usize>> = (0..cfg.num_layers)
        .map(|i| cfg.layer_attention(i).kv_from)
        .collect();
    assert_eq!(sources, [None, None, None, None, None, Some(3), Some(4)]);
    assert_eq!(cfg.variant.proportional_pairs, Some(4));
    assert_eq!(cfg.variant.attention_scale, Some(1.0));
    assert!(cfg.variant.value_norm);
    assert_eq!(cfg.variant.final_softcap, Some(15.0));
    let widths: Vec<usize> = (0..cfg.num_layers)
        .map(|i| cfg.layer_mlp_width(i))
        .collect();
    assert_eq!(widths, [96, 96, 96, 96, 96, 192, 192]);
    let weights = model.weights();
    assert_eq!(weights.per_layer.as_ref().map(|p| p.width), Some(32));
    assert!(weights.layers.iter().all(|l| l.per_layer_input.is_some()));
    assert!(weights.layers.iter().all(|l| l.output_scale.is_some()));
    // The shared layers keep nothing: the store holds five layers' keys and values, each in
    // its own heads.
    let per_position = 2 * 4 * (3 * 2 * 16 + 2 * 32);
    let model = model.with_kv_dtype(KvDtype::F32);
    assert_eq!(model.kv_bytes_per_position(), per_position);
    let kv = model.new_kv_store_with(64, Some(32));
    assert_eq!(kv.layer_row_width(2), 32);
    assert_eq!(kv.layer_row_width(3), 32);
    assert_eq!(kv.layer_row_width(5), 0);
    let _ = LayerStorage::Shared(3);
}

#[test]
fn gemma4_matches_llama_cpp() {
    // llama.cpp's CPU GELU (of the MLP and of the per-layer inputs' gate) reads a table of
    // f16 values at the input rounded to f16 (`GGML_GELU_FP16` in ggml-cpu's vec.h), so each
    // of its GELUs is off by up to half an f16 step, about 5e-4 of itself; thicket computes
    // them in f32. Measured: 2.2e-3 of the logit scale (0.0124 against logits up to 5.63),
    // greedy tokens identical for 32 steps. With that table emulated in thicket's GELU, the
    // prompt's logits agree within 3.4e-5 and the largest difference halves (it remains where
    // an input crosses an f16 rounding boundary).
    let (model, bytes) = load(&TinyGemma4::default(), GgmlDType::F32, Some(DType::F32));
    let model = model.with_kv_dtype(KvDtype::F32);
    super::hybrid_checks::matches_llama_cpp_in_chunks(
        &model,
        &bytes,
        include_str!("../data/gemma4_llamacpp.json"),
        4e-3,
    );
}

#[test]
fn gemma4_fused_pass_chunks_and_trees_keep_their_bits() {
    let (model, _) = load(&TinyGemma4::default(), GgmlDType::Q8_0, None);
    fused_gives_candle_bits(&model);
    chunked_prefill_gives_token_by_token(&model, 5);
    tree_nodes_give_root_paths(&model, 6);
}

#[test]
fn the_mixture_sits_beside_every_dense_mlp() {
    let (model, _) = load(&TinyGemma4::mixture(), GgmlDType::F32, Some(DType::F32));
    let moe = model.config().variant.moe.as_ref().unwrap();
    assert_eq!(
        (moe.num_experts, moe.experts_per_token, moe.expert_width),
        (8, 3, 32)
    );
    for layer in &model.weights().layers {
        let engine::model::experts::Mlp::Experts(mixture) = &layer.mlp else {
            panic!("a dense layer");
        };
        let beside = mixture.beside.as_ref().unwrap();
        assert_eq!(beside.expert_scales.as_ref().map(Vec::len), Some(8));
        assert!(mixture.shared.as_ref().is_some_and(|s| s.gate.is_none()));
        assert!(layer.per_layer_input.is_none());
    }
}

#[test]
fn gemma4_mixture_matches_llama_cpp() {
    // As `gemma4_matches_llama_cpp`, llama.cpp's GELU reads its f16 table. Measured: 1.5e-3
    // of the logit scale (0.0076 against logits up to 5.27), greedy tokens identical for 32
    // steps.
    let (model, bytes) = load(&TinyGemma4::mixture(), GgmlDType::F32, Some(DType::F32));
    let model = model.with_kv_dtype(KvDtype::F32);
    super::hybrid_checks::matches_llama_cpp_in_chunks(
        &model,
        &bytes,
        include_str!("../data/gemma4_moe_llamacpp.json"),
        4e-3,
    );
}

#[test]
fn gemma4_mixture_fused_pass_chunks_and_trees_keep_their_bits() {
    let (model, _) = load(&TinyGemma4::mixture(), GgmlDType::Q8_0, None);
    fused_gives_candle_bits(&model);
    chunked_prefill_gives_token_by_token(&model, 7);
    tree_nodes_give_root_paths(&model, 8);
}

/// Logits of two steps of three sequences (prompts of 13, 21 and 6 tokens; then a draft tree
/// of 9 nodes, the rest of the second prompt, and one token), where the prompt chunks return
/// the logits `wanted` says (the tree always every node's), by sequence and step.
fn two_steps(model: &Model, wanted: LogitRows) -> Vec<Vec<Vec<u32>>> {
    let bs = 8;
    let vocab = model.config().vocab_size as u32;
    let mut rng = StdRng::seed_from_u64(11);
    let prompts: Vec<Vec<u32>> = [13, 21, 6]
        .iter()
        .map(|&n| (0..n).map(|_| rng.random_range(0..vocab)).collect())
        .collect();
    let tree = super::forward::random_tree(&mut rng, 9, vocab);
    let mut pool = BlockPool::new(24, bs);
    let tables: Vec<BlockTable> = (0..3)
        .map(|_| {
            let mut t = BlockTable::new();
            assert!(t.ensure_capacity(40, &mut pool));
            t
        })
        .collect();
    let mut kv = model.new_kv_store(pool.num_slots());
    let steps: [[(usize, TokenTree, LogitRows); 3]; 2] = [
        [
            (0, TokenTree::chain(&prompts[0]), wanted),
            (0, TokenTree::chain(&prompts[1][..15]), LogitRows::None),
            (0, TokenTree::chain(&prompts[2]), wanted),
        ],
        [
            (13, tree, LogitRows::All),
            (15, TokenTree::chain(&prompts[1][15..]), wanted),
            (6, TokenTree::chain(&[7]), wanted),
        ],
    ];
    let mut out = vec![Vec::new(); 3];
    for (index, step) in steps.into_iter().enumerate() {
        let mut batch = TreeBatch::new(bs);
        let mut ranges = Vec::new();
        for (s, (context, tree, rows)) in step.iter().enumerate() {
            ranges.push(batch.push(*context, &tables[s], tree, *rows).unwrap());
        }
        let logits = model.forward(&batch, &mut kv).unwrap();
        let vocab = vocab as usize;
        let all: Vec<u32> = logits
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
            .into_iter()
            .map(f32::to_bits)
            .collect();
        // Each sequence's logit rows, in the order the batch returns them.
        let mut at = 0;
        for (s, (_, _, rows)) in step.iter().enumerate() {
            let n = match rows {
                LogitRows::None => 0,
                LogitRows::Last | LogitRows::Hidden => 1,
                LogitRows::All => ranges[s].len(),
            };
            let mine = all[at * vocab..(at + n) * vocab].to_vec();
            // Of a prompt chunk's every row, the last (the one the other run returns).
            let tree = index == 1 && s == 0;
            let mine = match wanted == LogitRows::All && n > 0 && !tree {
                true => mine[(n - 1) * vocab..].to_vec(),
                false => mine,
            };
            out[s].push(mine);
            at += n;
        }
    }
    out
}

#[test]
fn the_layers_reading_shared_kv_run_only_for_the_rows_that_give_logits() {
    // Past layer 4, the last that writes, a prompt chunk keeps only its last row (and one
    // that ends no prompt none): the logits are the bits of the run that computes every row,
    // on the fused pass and against candle's, which computes every row.
    let (model, _) = load(&TinyGemma4::default(), GgmlDType::Q8_0, None);
    assert_eq!(model.config().reading_tail(), Some(5));
    let every = two_steps(&model, LogitRows::All);
    let cut = two_steps(&model, LogitRows::Last);
    assert_eq!(cut, every);
    let candle = two_steps(&model.clone().without_fused_pass(), LogitRows::Last);
    assert_eq!(cut, candle);
    // Every sequence gave logits at some step; the tree all nine nodes'.
    assert!(cut.iter().all(|steps| steps.iter().any(|l| !l.is_empty())));
    assert_eq!(cut[0][1].len(), 9 * model.config().vocab_size);
}
