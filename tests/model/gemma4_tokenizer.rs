//! Gemma 4's tokenizer (`tokenizer.ggml.model = "gemma4"`: BPE over `▁`-escaped raw UTF-8,
//! split only at newline runs, byte fallback) as thicket rebuilds it from a GGUF's metadata,
//! on llama.cpp's own Gemma 4 vocabulary (`models/ggml-vocab-gemma-4.gguf`, 262,144 tokens and
//! their merges, from the pinned llama-cpp-python 0.3.36 sdist): every text of llama.cpp's
//! tokenizer test for it (`.inp`) gives the ids that test expects (`.out`) and decodes back,
//! as do texts of runs of newlines, code and scripts that `llama-tokenize` encoded on the same
//! file (`tests/data/gemma4_tokenizer_llamacpp.json`, by
//! `scripts/gemma4-tokenizer-reference.py`); BOS is added, and the turn and tool markers are
//! single tokens.

use std::sync::OnceLock;

use engine::ModelTokenizer;

use crate::support::llamacpp_sdist::llamacpp_files;

const VOCAB: &str = "models/ggml-vocab-gemma-4.gguf";
const INPUTS: &str = "models/ggml-vocab-gemma-4.gguf.inp";
const OUTPUTS: &str = "models/ggml-vocab-gemma-4.gguf.out";

/// Texts with their ids.
type Cases = Vec<(String, Vec<u32>)>;

/// The tokenizer of llama.cpp's Gemma 4 vocabulary, and its test's texts with their ids.
fn fixture() -> &'static (ModelTokenizer, Cases) {
    static FIXTURE: OnceLock<(ModelTokenizer, Cases)> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let dir = llamacpp_files(&[VOCAB, INPUTS, OUTPUTS]);
        let (content, _) = engine::model::gguf::read_content(&dir.join(VOCAB)).unwrap();
        let tokenizer = ModelTokenizer::from_gguf(&content).unwrap();
        // As llama.cpp's test-tokenizer-0 reads them: texts between separators, one line of
        // ids each.
        let inputs = std::fs::read_to_string(dir.join(INPUTS)).unwrap();
        let outputs = std::fs::read_to_string(dir.join(OUTPUTS)).unwrap();
        let texts: Vec<&str> = inputs.split("\n__ggml_vocab_test__\n").collect();
        let ids: Vec<Vec<u32>> = outputs
            .lines()
            .map(|l| l.split_whitespace().map(|x| x.parse().unwrap()).collect())
            .collect();
        assert_eq!(texts.len(), ids.len(), "the test's files disagree");
        let cases = texts.into_iter().map(String::from).zip(ids).collect();
        (tokenizer, cases)
    })
}

#[test]
fn gemma4_encodes_as_llama_cpp_expects_and_decodes_back() {
    let (tok, cases) = fixture();
    assert!(cases.len() >= 40, "{} cases", cases.len());
    let mut differ = Vec::new();
    for (text, want) in cases {
        let ids = tok.encode_plain(text).unwrap();
        if &ids != want {
            differ.push(format!(
                "{text:?}\n  thicket   {ids:?}\n  llama.cpp {want:?}"
            ));
        }
        assert_eq!(&tok.decode(&ids).unwrap(), text, "ids {ids:?}");
    }
    assert!(
        differ.is_empty(),
        "{} of {} texts differ from llama.cpp:\n{}",
        differ.len(),
        cases.len(),
        differ.join("\n")
    );
}

#[test]
fn newline_runs_code_and_scripts_encode_as_llama_tokenize_does() {
    let (tok, _) = fixture();
    let record: serde_json::Value =
        serde_json::from_str(include_str!("../data/gemma4_tokenizer_llamacpp.json")).unwrap();
    let dir = llamacpp_files(&[VOCAB]);
    let vocab = std::fs::read(dir.join(VOCAB)).unwrap();
    assert_eq!(
        record["vocab_sha256"].as_str().unwrap(),
        format!("{:x}", <sha2::Sha256 as sha2::Digest>::digest(&vocab))
    );
    let cases = record["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 134);
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let want: Vec<u32> = serde_json::from_value(case["ids"].clone()).unwrap();
        let ids = tok.encode_plain(text).unwrap();
        assert_eq!(ids, want, "{text:?}");
        assert_eq!(tok.decode(&ids).unwrap(), text);
    }
}

#[test]
fn gemma4_adds_bos_and_reads_its_markers_whole() {
    let (tok, _) = fixture();
    assert_eq!(tok.bos_id(), Some(2));
    assert_eq!(tok.encode("Hi").unwrap().first(), Some(&2));
    // Control tokens (special) and the user-defined tool and thinking markers.
    for (text, id) in [
        ("<|turn>", 105),
        ("<turn|>", 106),
        ("<|channel>", 100),
        ("<channel|>", 101),
        ("<|tool_call>", 48),
        ("<tool_call|>", 49),
        ("<|\"|>", 52),
    ] {
        assert_eq!(tok.token_to_id(text), Some(id), "{text}");
    }
    let ids = tok
        .encode_plain("<|turn>user\nHi<turn|>\n<|tool_call>call:f{a:<|\"|>x<|\"|>}<tool_call|>")
        .unwrap();
    for id in [105, 106, 48, 52, 49] {
        assert!(ids.contains(&id), "{id} in {ids:?}");
    }
    // `<turn|>` ends a reply, as `<eos>` does.
    assert!(tok.eos_ids().contains(&106) && tok.eos_ids().contains(&1));
    // What a user reads keeps the user-defined markers and drops the special ones.
    let shown = tok.decode_skip_special(&ids).unwrap();
    assert!(
        !shown.contains("<|turn>") && shown.contains("<|tool_call>"),
        "{shown}"
    );
}
