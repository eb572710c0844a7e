//! all-MiniLM-L6-v2 against llama.cpp's embedding mode (`tests/data/minilm_llamacpp.json`,
//! made by `scripts/llamacpp-embeddings.py`: llama-server `--embedding --pooling mean` on the
//! GGUF llama.cpp's converter writes from the model's folder): the same ids for every
//! sentence and embeddings within a cosine of 0.99999 (llama.cpp computes GELU from a table
//! of f16 values: components differ by up to 2.4e-4), from the Hugging Face folder and from a
//! `bert` GGUF written as the converter writes one (`write_bert_gguf`), whose vocabulary,
//! metadata and tensor names thicket reads back into the same model.

use engine::encoder::pooling::cosine;
use engine::encoder::{Encoder, EncoderInput, EncoderTask, Pooling, PoolingMode};
use engine::model::testing::write_bert_gguf;
use serde_json::Value;

use super::encoder::minilm_dir;

fn record() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/minilm_llamacpp.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn embeddings(encoder: &Encoder, inputs: &[EncoderInput]) -> Vec<Vec<f32>> {
    let EncoderTask::Embed(pooling) = encoder.task else {
        panic!("an embedding model")
    };
    let states = encoder.model.forward(inputs).unwrap();
    let h = encoder.model.config().hidden_size;
    engine::encoder::bert::spans(inputs)
        .into_iter()
        .map(|span| engine::encoder::pooling::pool(&states, h, span, pooling))
        .collect()
}

/// Each record's text through `encoder`: its ids must be llama.cpp's; its embedding is
/// returned beside llama.cpp's.
fn against_record(encoder: &Encoder) -> Vec<(String, Vec<f32>, Vec<f32>)> {
    let record = record();
    let records = record["records"].as_array().unwrap();
    let inputs: Vec<EncoderInput> = records
        .iter()
        .map(|r| {
            let input = encoder
                .tokenizer
                .text(r["text"].as_str().unwrap(), None)
                .unwrap();
            let ids: Vec<u32> = r["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect();
            assert_eq!(input.ids, ids, "{}", r["text"]);
            input
        })
        .collect();
    embeddings(encoder, &inputs)
        .into_iter()
        .zip(records)
        .map(|(ours, r)| {
            let theirs: Vec<f32> = r["embedding"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect();
            (r["text"].as_str().unwrap().to_string(), ours, theirs)
        })
        .collect()
}

#[test]
fn minilm_agrees_with_llama_cpp_embedding_mode() {
    let encoder = Encoder::load(&minilm_dir(), engine::WeightDType::Auto).unwrap();
    for (text, ours, theirs) in against_record(&encoder) {
        let cos = cosine(&ours, &theirs);
        assert!(cos > 0.99999, "{text:?}: cosine {cos}");
    }
}

#[test]
fn minilm_from_a_bert_gguf_is_the_same_model() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("minilm.gguf");
    write_bert_gguf(&minilm_dir(), &gguf, 1).unwrap();
    assert!(engine::encoder::is_encoder_gguf(&gguf));
    let from_gguf = Encoder::load(&gguf, engine::WeightDType::Auto).unwrap();
    assert_eq!(
        from_gguf.task,
        EncoderTask::Embed(Pooling {
            mode: PoolingMode::Mean,
            normalize: true
        })
    );
    assert_eq!(from_gguf.tokenizer.max_length(), 512);
    let from_dir = Encoder::load(&minilm_dir(), engine::WeightDType::Auto).unwrap();
    assert_eq!(
        from_gguf.model.config().layer_norm_eps as f32,
        from_dir.model.config().layer_norm_eps as f32
    );
    let gguf_side = against_record(&from_gguf);
    let dir_side = against_record(&from_dir);
    for ((text, a, theirs), (_, b, _)) in gguf_side.iter().zip(&dir_side) {
        let diff = a
            .iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        assert!(diff < 1e-6, "{text:?}: GGUF and folder differ by {diff}");
        assert!(cosine(a, theirs) > 0.99999, "{text:?}");
    }
    // CLS pooling read from the file's pooling type.
    write_bert_gguf(&minilm_dir(), &gguf, 2).unwrap();
    let cls = Encoder::load(&gguf, engine::WeightDType::Auto).unwrap();
    assert_eq!(
        cls.task,
        EncoderTask::Embed(Pooling {
            mode: PoolingMode::Cls,
            normalize: true
        })
    );
    write_bert_gguf(&minilm_dir(), &gguf, 0).unwrap();
    let err = Encoder::load(&gguf, engine::WeightDType::Auto)
        .unwrap_err()
        .to_string();
    assert!(err.contains("pooling_type 0"), "{err}");
}
