//! Qwen3.5's forward on its own terms (tiny random weights written at test time,
//! `engine::model::testing::write_tiny_qwen35_gguf`): which layers the declaration makes
//! Gated DeltaNet and what each sequence's state costs; the fused pass gives the candle-ops
//! bits; a prompt prefilled in one chunk, in chunks whose boundaries fall anywhere in the
//! convolution's window, or token by token gives the same logits; every node of a draft
//! tree gives what its root path gives run as a chain (a node runs from its parent's state,
//! never a sibling's); a tree verified and not kept leaves the state where it was, and an
//! accepted path is folded into it from the kept inputs; a state slot is per sequence.

use candle_core::quantized::GgmlDType;
use candle_core::{DType, Device};
use engine::cpu::kv_store::KvDtype;
use engine::model::config::LayerMixer;
use engine::model::testing::{write_tiny_qwen35_gguf, TinyQwen35};
use engine::{LogitRows, Model, SeqState, TokenTree, TreeBatch};
use kvcache::{KvGroup, KvMove};

use super::families::{KEPT, VERIFIED};
use super::hybrid_checks::{
    chunked_prefill_gives_token_by_token, fused_gives_candle_bits, tree_nodes_give_root_paths,
};
use super::qwen35::{tiny_qwen35, tiny_qwen35moe};
use super::qwen3next::tiny_qwen3next;
use crate::support::fixtures::one_sequence;

/// The tiny mixture with a shared expert wide enough for Q8_0's blocks of 32 (the f32
/// reference's is 48).
pub(crate) fn tiny_qwen35moe_q8() -> TinyQwen35 {
    let mut spec = tiny_qwen35moe();
    if let Some(experts) = &mut spec.experts {
        experts.shared_width = Some(64);
    }
    spec
}

/// `spec` written as a GGUF in `dtype`, loaded dense in f32 (`dense`) or kept quantized.
pub(crate) fn qwen35_model(
    spec: &TinyQwen35,
    dtype: GgmlDType,
    dense: bool,
) -> (tempfile::TempDir, Model) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("qwen35.gguf");
    write_tiny_qwen35_gguf(&path, spec, dtype).unwrap();
    let (config, weights) =
        engine::model::gguf::load_gguf_weights(&path, dense.then_some(DType::F32), &Device::Cpu)
            .unwrap();
    (dir, Model::new(config, weights, Device::Cpu).unwrap())
}

#[test]
fn the_declaration_makes_every_other_layer_a_gated_delta_net() {
    for spec in [tiny_qwen35(), tiny_qwen35moe_q8()] {
        let (_dir, model) = qwen35_model(&spec, GgmlDType::Q8_0, false);
        let cfg = model.config();
        let kinds: Vec<bool> = cfg
            .variant
            .mixers
            .iter()
            .map(|m| matches!(m, LayerMixer::DeltaNet(_)))
            .collect();
        assert_eq!(kinds, [true, false, true, false]);
        assert!(cfg.variant.gated_attention);
        assert_eq!(cfg.rotary_dim(), spec.rotary_dim);
        let LayerMixer::DeltaNet(shape) = cfg.layer_mixer(0) else {
            unreachable!()
        };
        assert_eq!(
            (
                shape.key_heads,
                shape.value_heads,
                shape.key_dim,
                shape.value_dim
            ),
            (
                spec.linear_key_heads,
                spec.linear_value_heads,
                spec.linear_key_head_dim,
                spec.linear_value_head_dim
            )
        );
        // One state per value head and recurrent layer, f32, whatever the length.
        let state =
            2 * spec.linear_value_heads * spec.linear_key_head_dim * spec.linear_value_head_dim * 4;
        assert_eq!(model.state_bytes_per_sequence(), state);
        assert!(model.is_recurrent());
        assert_eq!(cfg.variant.moe.is_some(), spec.experts.is_some());
    }
}

#[test]
fn qwen35_fused_pass_gives_the_candle_ops_bits() {
    for spec in [tiny_qwen35(), tiny_qwen35moe_q8(), tiny_qwen3next()] {
        let (_dir, model) = qwen35_model(&spec, GgmlDType::Q8_0, false);
        fused_gives_candle_bits(&model);
    }
}

#[test]
fn qwen35_prefill_in_chunks_gives_the_token_by_token_logits() {
    // Chunk boundaries at every offset inside the four-position convolution, and one chunk.
    let (_dir, model) = qwen35_model(&tiny_qwen35(), GgmlDType::Q8_0, false);
    chunked_prefill_gives_token_by_token(&model, 9);
}

#[test]
fn qwen35_tree_nodes_match_their_root_paths() {
    for spec in [tiny_qwen35(), tiny_qwen35moe_q8(), tiny_qwen3next()] {
        let (_dir, model) = qwen35_model(&spec, GgmlDType::Q8_0, false);
        tree_nodes_give_root_paths(&model, 4);
    }
}

#[test]
fn an_accepted_path_is_folded_into_the_state_without_another_pass() {
    // A prompt, then a verified tree of which one path is accepted (moved into place as the
    // engine's compaction moves it), then the next token: the same logits as the prompt and
    // the path run as one chain.
    let (_dir, model) = qwen35_model(&tiny_qwen35(), GgmlDType::F32, true);
    let model = model.with_kv_dtype(KvDtype::F32);
    let prompt: Vec<u32> = (0..13).map(|i| (i * 37 + 5) % 300).collect();
    // Root 7 with children 8 and 9; 9 has children 10 and 11. Accept 7, 9, 11.
    let tree = TokenTree::new(
        vec![7, 8, 9, 10, 11],
        vec![None, Some(0), Some(0), Some(2), Some(2)],
    )
    .unwrap();
    let accepted = [0usize, 2, 4];
    let next = 42u32;
    let n = prompt.len();
    let (table, mut kv) = one_sequence(&model, n + tree.len() + 1, 4);
    let mut batch = TreeBatch::new(4);
    batch
        .push(0, &table, &TokenTree::chain(&prompt), LogitRows::None)
        .unwrap();
    batch.set_state(0, KEPT).unwrap();
    model.forward(&batch, &mut kv).unwrap();
    let mut batch = TreeBatch::new(4);
    batch.push(n, &table, &tree, LogitRows::All).unwrap();
    batch.set_state(0, VERIFIED).unwrap();
    model.forward(&batch, &mut kv).unwrap();
    // Compaction: node i was written at position n + i; the accepted path moves to n, n + 1..
    let moves: Vec<KvMove> = accepted
        .iter()
        .enumerate()
        .filter(|&(to, &from)| to != from)
        .map(|(to, &from)| KvMove {
            from: table.slot(n + from, 4).unwrap(),
            to: table.slot(n + to, 4).unwrap(),
            group: KvGroup::Full,
        })
        .collect();
    kv.apply_moves(&moves).unwrap();
    let mut batch = TreeBatch::new(4);
    batch
        .push(
            n + accepted.len(),
            &table,
            &TokenTree::chain(&[next]),
            LogitRows::Last,
        )
        .unwrap();
    batch.set_state(0, KEPT).unwrap();
    let folded = model.forward(&batch, &mut kv).unwrap();

    let path: Vec<u32> = accepted.iter().map(|&i| tree.tokens()[i]).collect();
    let whole = [prompt.clone(), path, vec![next]].concat();
    let (table, mut kv) = one_sequence(&model, whole.len(), 4);
    let mut batch = TreeBatch::new(4);
    batch
        .push(0, &table, &TokenTree::chain(&whole), LogitRows::Last)
        .unwrap();
    batch.set_state(0, KEPT).unwrap();
    let chain = model.forward(&batch, &mut kv).unwrap();
    let (a, b) = (
        folded.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
        chain.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
    );
    let worst = super::llamacpp_reference::largest_difference(&a, &b);
    assert!(worst < 1e-4, "folded {worst} away from the chain");
}

#[test]
fn a_sequence_with_context_needs_its_state_slot_and_slots_are_per_sequence() {
    let (_dir, model) = qwen35_model(&tiny_qwen35(), GgmlDType::Q8_0, false);
    let (table, mut kv) = one_sequence(&model, 16, 4);
    let mut batch = TreeBatch::new(4);
    batch
        .push(0, &table, &TokenTree::chain(&[1, 2, 3]), LogitRows::Last)
        .unwrap();
    batch.set_state(0, KEPT).unwrap();
    let first = model.forward(&batch, &mut kv).unwrap();
    // No slot named with a context: a clear error, not another sequence's state.
    let mut batch = TreeBatch::new(4);
    batch
        .push(3, &table, &TokenTree::chain(&[4]), LogitRows::Last)
        .unwrap();
    let err = model.forward(&batch, &mut kv).unwrap_err().to_string();
    assert!(err.contains("state slot"), "{err}");
    // A fresh sequence in another slot starts from zero: the same first logits.
    let mut batch = TreeBatch::new(4);
    batch
        .push(0, &table, &TokenTree::chain(&[1, 2, 3]), LogitRows::Last)
        .unwrap();
    batch
        .set_state(
            0,
            SeqState {
                slot: 5,
                commits: true,
                resume: None,
            },
        )
        .unwrap();
    let again = model.forward(&batch, &mut kv).unwrap();
    assert_eq!(
        first.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
        again.flatten_all().unwrap().to_vec1::<f32>().unwrap()
    );
    // A branching tree cannot be kept whole.
    let tree = TokenTree::new(vec![1, 2, 3], vec![None, Some(0), Some(0)]).unwrap();
    let mut batch = TreeBatch::new(4);
    batch.push(0, &table, &tree, LogitRows::All).unwrap();
    assert!(batch.set_state(0, KEPT).is_err());
}
