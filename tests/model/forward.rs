//! Properties of the paged tree-attention forward: a tree node computes what its root path
//! computes as a chain; a sequence's greedy output does not depend on its batch mates; a
//! scrambled, non-contiguous block table gives what a contiguous one gives.

use crate::support::plain_greedy::{
    cache_config_for, generate_greedy, generate_greedy_with, GreedyOptions, KvCache,
};
use candle_core::{IndexOp, Tensor};
use engine::cpu::attention::AttentionKernel;
use engine::model::testing::TinyModelSpec;
use engine::{LogitRows, Model, PagedKvStore, SeqState, TokenTree, TreeBatch};

use super::families::{KEPT, VERIFIED};
use kvcache::{BlockId, BlockPool, BlockTable, ManagerConfig};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::support::fixtures::{
    max_abs_diff, one_sequence, qwen_path, smollm2, smollm2_f32, tiny_model, PROMPTS,
};

/// A random tree: node i > 0 hangs under a uniformly chosen earlier node.
pub(crate) fn random_tree(rng: &mut StdRng, nodes: usize, vocab: u32) -> TokenTree {
    let tokens = (0..nodes).map(|_| rng.random_range(0..vocab)).collect();
    let parents = (0..nodes)
        .map(|i| (i > 0).then(|| rng.random_range(0..i)))
        .collect();
    TokenTree::new(tokens, parents).unwrap()
}

/// Logits of every tree node, and of each node's root path run as a plain chain over the
/// same cached prefix; returns the largest difference.
pub(crate) fn tree_vs_chains(model: &Model, prefix: &[u32], tree: &TokenTree) -> f32 {
    let bs = 8;
    let (table, mut kv) = one_sequence(model, prefix.len() + tree.len(), bs);
    let mut batch = TreeBatch::new(bs);
    batch
        .push(0, &table, &TokenTree::chain(prefix), LogitRows::None)
        .unwrap();
    batch.set_state(0, KEPT).unwrap();
    model.forward(&batch, &mut kv).unwrap();

    let mut batch = TreeBatch::new(bs);
    batch
        .push(prefix.len(), &table, tree, LogitRows::All)
        .unwrap();
    batch.set_state(0, VERIFIED).unwrap();
    let tree_logits = model.forward(&batch, &mut kv).unwrap();

    let mut worst = 0.0f32;
    for node in 0..tree.len() {
        let path: Vec<u32> = tree
            .path_to(node)
            .iter()
            .map(|&i| tree.tokens()[i])
            .collect();
        let mut batch = TreeBatch::new(bs);
        batch
            .push(
                prefix.len(),
                &table,
                &TokenTree::chain(&path),
                LogitRows::Last,
            )
            .unwrap();
        batch.set_state(0, VERIFIED).unwrap();
        let chain_logits = model.forward(&batch, &mut kv).unwrap();
        let diff = max_abs_diff(&tree_logits.i(node).unwrap(), &chain_logits.i(0).unwrap());
        worst = worst.max(diff);
    }
    worst
}

#[test]
fn tree_nodes_match_their_root_paths_on_smollm2() {
    let loaded = smollm2();
    let prefix = loaded.tokenizer.encode(PROMPTS[3]).unwrap();
    let mut rng = StdRng::seed_from_u64(3);
    let tree = random_tree(&mut rng, 24, 49_152);
    assert_eq!(loaded.model.attention(), AttentionKernel::Fused);
    let worst = tree_vs_chains(&loaded.model, &prefix, &tree);
    // Quantized matmuls and the fused attention are batch-invariant: expect bit equality.
    assert_eq!(worst, 0.0, "tree vs chain logits differ by {worst}");
}

#[test]
fn tree_nodes_match_their_root_paths_over_a_long_context_on_smollm2() {
    // 1020 cached positions: the tree's deeper nodes see 1024 keys or more, so their
    // attention takes its softmax in two runs, and still computes their root paths' bits.
    let loaded = smollm2();
    let mut prefix = Vec::new();
    for prompt in PROMPTS.iter().cycle() {
        if prefix.len() >= 1020 {
            break;
        }
        prefix.extend(loaded.tokenizer.encode(prompt).unwrap());
    }
    prefix.truncate(1020);
    let mut rng = StdRng::seed_from_u64(4);
    let tree = random_tree(&mut rng, 24, 49_152);
    let deepest = (0..tree.len())
        .map(|i| tree.path_to(i).len())
        .max()
        .unwrap();
    assert!(1020 + deepest > 1024, "the tree reaches past 1024 keys");
    let worst = tree_vs_chains(&loaded.model, &prefix, &tree);
    assert_eq!(worst, 0.0, "tree vs chain logits differ by {worst}");
}

#[test]
fn tree_nodes_match_their_root_paths_on_qwen2_5_coder_in_every_instruction_set() {
    // Q5_0, Q8_0, Q4_K and Q6_K weights: every one on thicket's kernels and the fused pass,
    // in whichever instruction set this process runs (`THICKET_ISA`), so a verified tree's
    // rows carry their root paths' bits and greedy speculation is exactly plain decoding.
    let loaded = engine::load_model(
        qwen_path().to_str().unwrap(),
        &engine::LoadOptions::default(),
    )
    .unwrap();
    assert!(
        loaded.model.is_fused(),
        "{} runs candle's ops",
        engine::cpu::qgemm::process_isa().name()
    );
    let prefix = loaded.tokenizer.encode("def quicksort(arr):\n").unwrap();
    let mut rng = StdRng::seed_from_u64(6);
    let tree = random_tree(&mut rng, 12, 151_000);
    let worst = tree_vs_chains(&loaded.model, &prefix, &tree);
    assert_eq!(worst, 0.0, "tree vs chain logits differ by {worst}");
}

/// `spec` written and loaded with its projections quantized to Q8_0 (thicket's kernel).
pub(crate) fn quantized_tiny(spec: &TinyModelSpec) -> (tempfile::TempDir, Model) {
    let dir = tempfile::tempdir().unwrap();
    engine::model::testing::write_tiny_hf_model(dir.path(), spec).unwrap();
    let (model, _) = engine::model::load::load_hf_model(
        dir.path(),
        engine::WeightDType::Quantized,
        &candle_core::Device::Cpu,
    )
    .unwrap();
    (dir, model)
}

#[test]
fn tree_nodes_match_their_root_paths_on_windowed_gemma3_and_qwen3_shapes() {
    // Windows of 8 keys and trees of 40 nodes over a prefix of 13: most nodes lie past the
    // window, which they count from their own position, as their chains do.
    for spec in [
        crate::model::families::tiny_gemma3(),
        crate::model::families::tiny_qwen3(),
    ] {
        let (_dir, model) = quantized_tiny(&spec);
        let vocab = spec.vocab_size as u32;
        let mut rng = StdRng::seed_from_u64(9);
        let prefix: Vec<u32> = (0..13).map(|_| rng.random_range(0..vocab)).collect();
        for _ in 0..3 {
            let tree = random_tree(&mut rng, 40, vocab);
            let worst = tree_vs_chains(&model, &prefix, &tree);
            assert_eq!(
                worst, 0.0,
                "{:?}: tree vs chain logits differ by {worst}",
                spec.architecture
            );
        }
    }
}

#[test]
fn tree_nodes_match_their_root_paths_on_tiny_f32_model() {
    let (_dir, model) = tiny_model(&TinyModelSpec::default());
    let mut rng = StdRng::seed_from_u64(5);
    let prefix: Vec<u32> = (0..13).map(|_| rng.random_range(0..256)).collect();
    for kernel in [AttentionKernel::Fused, AttentionKernel::Reference] {
        let model = model.clone().with_attention(kernel);
        for _ in 0..3 {
            let tree = random_tree(&mut rng, 40, 256);
            let worst = tree_vs_chains(&model, &prefix, &tree);
            // f32 matmul takes another path for a single row (~1e-5 differences), and the
            // reference kernel sums over masked keys too; both stay well under 1e-4.
            assert!(
                worst < 1e-4,
                "{kernel:?}: tree vs chain logits differ by {worst}"
            );
        }
    }
}

#[test]
fn reference_kernel_trees_stay_close_on_smollm2_f32() {
    // The reference kernel is not tree-exact (see AttentionKernel); on f32 weights, where no
    // activation is rounded to 8 bits, its tree logits must still agree closely.
    let loaded = smollm2_f32();
    let model = loaded
        .model
        .clone()
        .with_attention(AttentionKernel::Reference);
    let prefix = loaded.tokenizer.encode(PROMPTS[6]).unwrap();
    let tree = random_tree(&mut StdRng::seed_from_u64(9), 20, 49_152);
    let worst = tree_vs_chains(&model, &prefix, &tree);
    assert!(worst < 2e-3, "tree vs chain logits differ by {worst}");
}

#[test]
fn greedy_output_does_not_depend_on_batch_mates() {
    let loaded = smollm2();
    let prompts: Vec<Vec<u32>> = PROMPTS
        .iter()
        .map(|p| loaded.tokenizer.encode(p).unwrap())
        .collect();
    let lens: Vec<usize> = prompts.iter().map(Vec::len).collect();
    assert!(
        lens.iter().any(|&l| l != lens[0]),
        "prompts must differ in length"
    );
    let options = GreedyOptions {
        max_tokens: 32,
        ..GreedyOptions::default()
    };
    for kernel in [AttentionKernel::Fused, AttentionKernel::Reference] {
        let model = loaded.model.clone().with_attention(kernel);
        let together = generate_greedy(&model, &prompts, &options).unwrap();
        for (prompt, joint) in prompts.iter().zip(&together) {
            let alone = generate_greedy(&model, std::slice::from_ref(prompt), &options).unwrap();
            assert_eq!(
                joint.token_ids, alone[0].token_ids,
                "{kernel:?}: prompt {prompt:?}"
            );
        }
    }
}

#[test]
fn scrambled_block_table_matches_contiguous_one() {
    let loaded = smollm2();
    let model = &loaded.model;
    let prompt = loaded.tokenizer.encode(PROMPTS[1]).unwrap();
    let bs = 4;
    let blocks = (prompt.len() + 8).div_ceil(bs);
    let total = blocks * 3;
    let contiguous = BlockTable::from_blocks((0..blocks as u32).map(BlockId).collect());
    // Every third block, from the far end of a pool three times larger.
    let scrambled = BlockTable::from_blocks(
        (0..blocks as u32)
            .map(|i| BlockId(total as u32 - 1 - 3 * i))
            .collect(),
    );
    let run = |table: &BlockTable| -> Tensor {
        let mut kv = model.new_kv_store(total * bs);
        let mut batch = TreeBatch::new(bs);
        batch
            .push(
                0,
                table,
                &TokenTree::chain(&prompt[..prompt.len() - 3]),
                LogitRows::All,
            )
            .unwrap();
        let first = model.forward(&batch, &mut kv).unwrap();
        let mut batch = TreeBatch::new(bs);
        let tail = &prompt[prompt.len() - 3..];
        batch
            .push(
                prompt.len() - 3,
                table,
                &TokenTree::chain(tail),
                LogitRows::All,
            )
            .unwrap();
        let second = model.forward(&batch, &mut kv).unwrap();
        Tensor::cat(&[first, second], 0).unwrap()
    };
    let diff = max_abs_diff(&run(&contiguous), &run(&scrambled));
    assert_eq!(diff, 0.0, "paging changed logits by {diff}");

    // Greedy decoding through a fragmented pool (every other block held by another
    // sequence, so tables are non-contiguous and descending) matches a fresh pool.
    let options = GreedyOptions {
        max_tokens: 24,
        ..GreedyOptions::default()
    };
    let prompts = std::slice::from_ref(&prompt);
    let plain = generate_greedy(model, prompts, &options).unwrap();
    let config = cache_config_for(prompts, &options, bs, false);
    let mut cache = KvCache::new(
        model,
        ManagerConfig {
            num_blocks: config.num_blocks * 3,
            ..config
        },
    );
    let mut fillers = Vec::new();
    loop {
        let seq = cache.new_seq_id();
        match cache.admit(seq, &[1], bs).unwrap() {
            Some(_) => fillers.push(seq),
            None => break,
        }
    }
    for &seq in fillers.iter().step_by(2) {
        cache.release(seq).unwrap();
    }
    let fragmented = generate_greedy_with(&mut cache, prompts, &options).unwrap();
    assert_eq!(plain[0].token_ids, fragmented[0].token_ids);
}

#[test]
fn sequences_in_one_batch_do_not_see_each_other() {
    // Two sequences with identical tokens but different cached contexts must differ; the same
    // sequence placed first or second in a batch must not.
    let (_dir, model) = tiny_model(&TinyModelSpec::default());
    let bs = 4;
    let mut pool = BlockPool::new(16, bs);
    let mut a = BlockTable::new();
    let mut b = BlockTable::new();
    assert!(a.ensure_capacity(12, &mut pool) && b.ensure_capacity(12, &mut pool));
    let mut kv = model.new_kv_store(pool.num_slots());
    let mut batch = TreeBatch::new(bs);
    batch
        .push(0, &a, &TokenTree::chain(&[1, 2, 3, 4, 5]), LogitRows::None)
        .unwrap();
    batch
        .push(0, &b, &TokenTree::chain(&[9, 8, 7]), LogitRows::None)
        .unwrap();
    model.forward(&batch, &mut kv).unwrap();

    let step = |order_ab: bool, kv: &mut PagedKvStore| -> (Tensor, Tensor) {
        let mut batch = TreeBatch::new(bs);
        let tree = TokenTree::new(vec![42, 43, 44], vec![None, Some(0), Some(0)]).unwrap();
        if order_ab {
            batch.push(5, &a, &tree, LogitRows::All).unwrap();
            batch.push(3, &b, &tree, LogitRows::All).unwrap();
        } else {
            batch.push(3, &b, &tree, LogitRows::All).unwrap();
            batch.push(5, &a, &tree, LogitRows::All).unwrap();
        }
        let logits = model.forward(&batch, kv).unwrap();
        let (first, second) = (
            logits.narrow(0, 0, 3).unwrap(),
            logits.narrow(0, 3, 3).unwrap(),
        );
        if order_ab {
            (first, second)
        } else {
            (second, first)
        }
    };
    let (a1, b1) = step(true, &mut kv);
    let (a2, b2) = step(false, &mut kv);
    assert_eq!(max_abs_diff(&a1, &a2), 0.0);
    assert_eq!(max_abs_diff(&b1, &b2), 0.0);
    assert!(
        max_abs_diff(&a1, &b1) > 1e-3,
        "different contexts gave the same logits"
    );
}

/// Logits of a prompt chain and then of a tree over it (two sequences in each batch, so rows
/// of different sequences and positions share every product), as bit patterns.
pub(crate) fn prompt_then_tree_bits(model: &Model) -> Vec<u32> {
    let bs = 8;
    let vocab = model.config().vocab_size as u32;
    let mut rng = StdRng::seed_from_u64(5);
    let prompts: Vec<Vec<u32>> = [13, 21]
        .iter()
        .map(|&n| (0..n).map(|_| rng.random_range(0..vocab)).collect())
        .collect();
    let trees: Vec<TokenTree> = [9, 17]
        .iter()
        .map(|&n| random_tree(&mut rng, n, vocab))
        .collect();
    let mut pool = BlockPool::new(16, bs);
    let tables: Vec<BlockTable> = (0..2)
        .map(|_| {
            let mut t = BlockTable::new();
            assert!(t.ensure_capacity(40, &mut pool));
            t
        })
        .collect();
    let mut kv = model.new_kv_store(pool.num_slots());
    let mut bits = Vec::new();
    for step in 0..2 {
        let mut batch = TreeBatch::new(bs);
        for s in 0..2 {
            let (context, tree) = match step {
                0 => (0, TokenTree::chain(&prompts[s])),
                _ => (prompts[s].len(), trees[s].clone()),
            };
            batch
                .push(context, &tables[s], &tree, LogitRows::All)
                .unwrap();
            // Recurrent layers: each sequence keeps its prompt, not its tree.
            let state = SeqState {
                slot: s,
                commits: step == 0,
                resume: None,
            };
            batch.set_state(s, state).unwrap();
        }
        let logits = model.forward(&batch, &mut kv).unwrap();
        bits.extend(
            logits
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
                .iter()
                .map(|v| v.to_bits()),
        );
    }
    bits
}

#[test]
fn fused_cpu_pass_gives_the_candle_ops_bits() {
    let dir = tempfile::tempdir().unwrap();
    let qwen = TinyModelSpec {
        architecture: engine::Architecture::Qwen2,
        ..TinyModelSpec::default()
    };
    engine::model::testing::write_tiny_hf_model(dir.path(), &qwen).unwrap();
    let (tiny_qwen, _) = engine::model::load::load_hf_model(
        dir.path(),
        engine::WeightDType::Quantized,
        &candle_core::Device::Cpu,
    )
    .unwrap();
    let families: Vec<(tempfile::TempDir, Model)> = [
        crate::model::families::tiny_qwen3(),
        crate::model::families::tiny_gemma3(),
    ]
    .iter()
    .map(quantized_tiny)
    .collect();
    for (name, model) in [
        ("smollm2 Q4_1", &smollm2().model),
        ("tiny qwen2 Q8_0", &tiny_qwen),
        ("tiny qwen3 Q8_0", &families[0].1),
        ("tiny gemma3 Q8_0 (windows of 8)", &families[1].1),
    ] {
        assert!(model.is_fused(), "{name}: the fused pass does not apply");
        let reference = model.clone().without_fused_pass();
        assert!(!reference.is_fused());
        let (fused, candle) = (
            prompt_then_tree_bits(model),
            prompt_then_tree_bits(&reference),
        );
        assert_eq!(fused.len(), candle.len());
        let differ = fused.iter().zip(&candle).filter(|(a, b)| a != b).count();
        assert_eq!(
            differ,
            0,
            "{name}: {differ} of {} logits differ",
            fused.len()
        );
    }
}

#[test]
fn the_backend_a_model_gets_runs_its_forward_bit_for_bit() {
    let spec = TinyModelSpec::default();
    let (_dir, tiny_f32) = tiny_model(&spec);
    let tiny_ops = tiny_f32.clone().without_fused_pass();
    for (name, model, path) in [
        ("smollm2 Q4_1", &smollm2().model, "fused CPU pass"),
        ("tiny f32", &tiny_f32, "fused CPU pass"),
        ("tiny f32 through candle ops", &tiny_ops, "candle ops"),
    ] {
        let bs = 4;
        let prompt: Vec<u32> = (0..9).map(|i| (i * 5 + 1) % 64).collect();
        let (table, mut kv) = one_sequence(model, prompt.len() + 3, bs);
        let mut backend = engine::backend::for_model(model.clone(), kv.num_slots()).unwrap();
        assert_eq!(backend.num_slots(), kv.num_slots());
        let description = backend.describe();
        assert!(
            description.starts_with("cpu, ") && description.contains(path),
            "{name}: {description}"
        );
        // A prompt, then a tree over it: the same logits from the model and its backend.
        let tree = TokenTree::new(vec![3, 4, 5], vec![None, Some(0), Some(0)]).unwrap();
        for (context, fed) in [(0, TokenTree::chain(&prompt)), (prompt.len(), tree)] {
            let mut batch = TreeBatch::new(bs);
            batch.push(context, &table, &fed, LogitRows::All).unwrap();
            let ours = model.forward(&batch, &mut kv).unwrap();
            let ours = ours.to_vec2::<f32>().unwrap();
            let theirs = backend.forward(&batch).unwrap();
            assert_eq!(ours.len(), theirs.len(), "{name}");
            for (a, b) in ours.iter().zip(&theirs) {
                let same = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(same, "{name}: the backend's logits differ from the model's");
            }
        }
    }
}

/// The cost curve measures sizes of a few rows in rounds of their own, before the larger
/// ones: every size asked for still gets one point, in the order asked, however the two
/// groups interleave in it.
#[test]
fn the_cost_curve_has_one_point_per_size_in_the_order_asked() {
    let (_dir, model) = tiny_model(&TinyModelSpec::default());
    let sizes = [16, 1, 9, 4, 8, 2];
    let points = engine::calibration::forward_cost(&model, 8, &sizes, 2).unwrap();
    let measured: Vec<usize> = points.iter().map(|p| p.new_tokens).collect();
    assert_eq!(measured, sizes);
    assert!(points
        .iter()
        .all(|p| p.seconds.is_finite() && p.seconds > 0.0));
}

#[test]
fn several_backends_each_get_every_size_of_the_curve() {
    // Each backend runs its sizes in a turn of its own within each round (after re-reading
    // its weights for a while): every size still gets a point per backend, in order.
    let (_dir, model) = tiny_model(&TinyModelSpec::default());
    let sizes = [1, 3, 2, 12];
    let curves = engine::calibration::forward_costs(&[&model, &model], 8, &sizes, 2).unwrap();
    assert_eq!(curves.len(), 2);
    for curve in &curves {
        let measured: Vec<usize> = curve.points.iter().map(|p| p.new_tokens).collect();
        assert_eq!(measured, sizes, "{}", curve.backend);
        assert!(curve
            .points
            .iter()
            .all(|p| p.seconds.is_finite() && p.seconds > 0.0));
        assert_eq!(curve.parts.len(), sizes.len());
    }
}

/// Every position's logits for `prompt` prefilled in chunks of `chunk` tokens, one sequence
/// (a recurrent layer's state in slot 0, kept from chunk to chunk).
pub(crate) fn prefill_logits(model: &Model, prompt: &[u32], chunk: usize) -> Vec<f32> {
    let (table, mut kv) = one_sequence(model, prompt.len(), 4);
    let mut all = Vec::new();
    for (i, part) in prompt.chunks(chunk).enumerate() {
        let mut batch = TreeBatch::new(4);
        batch
            .push(i * chunk, &table, &TokenTree::chain(part), LogitRows::All)
            .unwrap();
        batch.set_state(0, KEPT).unwrap();
        let logits = model.forward(&batch, &mut kv).unwrap();
        all.extend(logits.flatten_all().unwrap().to_vec1::<f32>().unwrap());
    }
    all
}
