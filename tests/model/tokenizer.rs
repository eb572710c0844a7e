//! The tokenizer rebuilt from GGUF metadata: exact round trips, special tokens matched whole,
//! and SmolLM2's documented pre-tokenization (digits split one by one); Gemma 3's
//! SentencePiece tokenizer against the ids llama.cpp gives for the same texts
//! (`tests/data/gemma3_270m_llamacpp_ids.json`, written by
//! `scripts/gemma3-tokenizer-reference.py`); and the Hugging Face directory `thicket fetch`
//! exports for clients, which the `tokenizers` Python package reads to the same ids on a few
//! hundred strings.

use crate::support::fixtures::{gemma3_tokenizer, smollm2};

/// llama.cpp's ids (BOS included, special tokens parsed) for 42 texts on gemma3-270m, and
/// for the same texts with `add_space_prefix` set (the Llama 2 way).
const GEMMA3_LLAMA_CPP: &str = include_str!("../data/gemma3_270m_llamacpp_ids.json");

const TEXTS: &[&str] = &[
    "Hello, world!",
    "  leading spaces and trailing   ",
    "Numbers: 1234567890 and 3.14159",
    "def f(x):\n\treturn x ** 2  # square\n",
    "Unicode: café, naïve, 日本語, emoji 🎉🚀",
    "<|im_start|>user\nhi<|im_end|>\n",
    "mixed\r\nline\nendings\r",
    "",
];

#[test]
fn smollm2_round_trips_exactly() {
    let tok = &smollm2().tokenizer;
    for text in TEXTS {
        let ids = tok.encode(text).unwrap();
        assert_eq!(&tok.decode(&ids).unwrap(), text, "ids {ids:?}");
    }
}

#[test]
fn smollm2_special_tokens_and_digits() {
    let tok = &smollm2().tokenizer;
    // GGUF metadata: <|endoftext|> = 0, <|im_start|> = 1, <|im_end|> = 2 (control tokens).
    assert_eq!(tok.encode("<|im_start|>").unwrap(), vec![1]);
    assert_eq!(tok.encode("<|im_end|>").unwrap(), vec![2]);
    assert!(tok.eos_ids().contains(&2) && tok.eos_ids().contains(&0));
    // The smollm pre-tokenizer splits every digit.
    assert_eq!(tok.encode("2024").unwrap().len(), 4);
    assert_eq!(
        tok.encode("7").unwrap(),
        vec![tok.token_to_id("7").unwrap()]
    );
    // Byte-level: a leading space is part of the word token.
    let ids = tok.encode(" Paris").unwrap();
    assert_eq!(ids, vec![tok.token_to_id("ĠParis").unwrap()]);
    assert_eq!(tok.vocab_size(), 49_152);
}

#[test]
fn qwen_tokenizer_matches_known_ids() {
    // Only the GGUF header and metadata are read: the tokenizer lives there.
    let (content, _) =
        engine::model::gguf::read_content(&crate::support::fixtures::qwen_path()).unwrap();
    let tok = engine::ModelTokenizer::from_gguf(&content).unwrap();
    assert_eq!(tok.encode("def").unwrap(), vec![750]);
    assert_eq!(tok.encode(" fibonacci").unwrap(), vec![75698]);
    assert_eq!(tok.encode("<|im_end|>").unwrap(), vec![151_645]);
    // The declared end first, then `<|endoftext|>`; `</s>` is an ordinary byte-pair token
    // in this vocabulary (a model writes it in HTML), not an end.
    assert_eq!(tok.eos_ids(), &[151_645, 151_643]);
    assert_eq!(tok.token_to_id("</s>"), Some(128_247));
    // `<tool_call>` is a user-defined token: matched whole, and (unlike the control
    // tokens) part of what a user reads, so tool calls can be parsed from the text.
    let ids = tok
        .encode("<tool_call>\n{}\n</tool_call><|im_end|>")
        .unwrap();
    assert_eq!(ids.first(), Some(&151_657));
    assert!(ids.contains(&151_658));
    assert_eq!(
        tok.decode_skip_special(&ids).unwrap(),
        "<tool_call>\n{}\n</tool_call>"
    );
    for text in TEXTS {
        let ids = tok.encode(text).unwrap();
        assert_eq!(&tok.decode(&ids).unwrap(), text, "ids {ids:?}");
    }
}

#[test]
fn gemma3_encodes_as_llama_cpp_does_and_decodes_back() {
    let tok = gemma3_tokenizer();
    let reference: serde_json::Value = serde_json::from_str(GEMMA3_LLAMA_CPP).unwrap();
    let cases = reference["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 42);
    let mut differ = Vec::new();
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let want: Vec<u32> = serde_json::from_value(case["ids"].clone()).unwrap();
        let ids = tok.encode(text).unwrap();
        if ids != want {
            differ.push(format!(
                "{text:?}\n  thicket   {ids:?}\n  llama.cpp {want:?}"
            ));
        }
        // BOS is special; everything else, special tokens written in the text included,
        // comes back as it was, but for U+2581, which SentencePiece reads as a space (the
        // data file's comment).
        assert_eq!(ids.first(), Some(&2), "{text:?}");
        assert_eq!(
            tok.decode(&ids[1..]).unwrap(),
            text.replace('\u{2581}', " "),
            "ids {ids:?}"
        );
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
fn with_a_space_prefix_it_encodes_as_llama_cpp_does() {
    // Gemma's vocabulary with `tokenizer.ggml.add_space_prefix` set: a space before the text
    // and after every token matched whole, as llama.cpp reads Llama 2's files.
    let (mut content, _) =
        engine::model::gguf::read_content(&crate::support::fixtures::gemma3_path()).unwrap();
    content.metadata.insert(
        "tokenizer.ggml.add_space_prefix".into(),
        candle_core::quantized::gguf_file::Value::Bool(true),
    );
    let tok = engine::ModelTokenizer::from_gguf(&content).unwrap();
    let reference: serde_json::Value = serde_json::from_str(GEMMA3_LLAMA_CPP).unwrap();
    let cases = reference["space_prefix_cases"].as_array().unwrap();
    assert_eq!(cases.len(), 42);
    let mut differ = Vec::new();
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let want: Vec<u32> = serde_json::from_value(case["ids"].clone()).unwrap();
        let ids = tok.encode(text).unwrap();
        if ids != want {
            differ.push(format!(
                "{text:?}\n  thicket   {ids:?}\n  llama.cpp {want:?}"
            ));
        }
    }
    assert!(
        differ.is_empty(),
        "{} of {} texts differ from llama.cpp:\n{}",
        differ.len(),
        cases.len(),
        differ.join("\n")
    );
    // The space put before the text is taken off again.
    let ids = tok.encode_plain("Hello world").unwrap();
    assert_eq!(tok.decode(&ids).unwrap(), "Hello world");
}

#[test]
fn gemma3_special_tokens_and_ends() {
    let tok = gemma3_tokenizer();
    assert_eq!(tok.vocab_size(), 262_144);
    assert_eq!(tok.bos_id(), Some(2));
    // A base model: no chat template in the file.
    assert_eq!(tok.chat_template(), None);
    // <eos> is declared; <end_of_turn> ends a turn. `</s>` is an HTML tag here (a
    // user-defined token), not an end.
    assert_eq!(tok.eos_ids(), &[1, 106]);
    assert_eq!(tok.token_to_id("</s>"), Some(212));
    let turn = "<start_of_turn>user\nHi<end_of_turn>\n";
    let ids = tok.encode_plain(turn).unwrap();
    assert_eq!(ids.first(), Some(&105));
    assert!(ids.contains(&106));
    // Control tokens are left out of what a user reads; user-defined ones are kept.
    assert_eq!(tok.decode_skip_special(&ids).unwrap(), "user\nHi\n");
    let html = tok.encode_plain("<b>x</b>").unwrap();
    assert_eq!(tok.decode_skip_special(&html).unwrap(), "<b>x</b>");
}

#[test]
fn gemma3_output_formats_read_its_pieces_as_text() {
    // llguidance reads each token's bytes from the tokenizer: `▁` must be a space and the
    // `<0xNN>` pieces single bytes, or the format would refuse the model's own spelling.
    use engine::constraint::{ConstraintSpec, Grammars};
    let tok = gemma3_tokenizer();
    let ends = tok.eos_ids().to_vec();
    let grammars = Grammars::new(
        std::sync::Arc::new(tok.clone()),
        tok.vocab_size(),
        ends.clone(),
    );
    let spec = ConstraintSpec::Regex("[0-9]+ apples? \u{13000}".into());
    let mut constraint = grammars.compile(&spec).expect("compiles");
    let ids = tok.encode_plain("42 apples \u{13000}").unwrap();
    assert!(
        ids.contains(&tok.token_to_id("▁apples").unwrap()),
        "{ids:?}"
    );
    assert!(ids.contains(&tok.token_to_id("<0xF0>").unwrap()), "{ids:?}");
    for &id in &ids {
        let mask = constraint.mask().unwrap();
        assert!(mask.allows(id), "token {id} of {ids:?} refused");
        // The same word without its space does not fit after the digits.
        if Some(id) == tok.token_to_id("▁apples") {
            assert!(!mask.allows(tok.token_to_id("apples").unwrap()));
        }
        constraint.advance(id).unwrap();
    }
    let mask = constraint.mask().unwrap();
    assert!(ends.iter().all(|&e| mask.allows(e)), "ends {ends:?}");
}

#[test]
fn incremental_detokenizer_never_emits_a_broken_character() {
    use engine::model::detokenizer::IncrementalDetokenizer;
    // Byte-level BPE splits these characters across tokens; Gemma has most of them as
    // pieces, and spells the rest (a hieroglyph, a control character) in byte pieces.
    for (tokenizer, text) in [
        (
            &smollm2().tokenizer,
            "Grüße aus 東京 😀🎉 — naïve café ∑x² ok",
        ),
        (gemma3_tokenizer(), "Grüße 𓀀 aus 東京 😀 \u{7}𓀁 ok"),
    ] {
        let ids = tokenizer.encode(text).unwrap();
        // The point of the test: some characters really are split across tokens.
        let split = ids
            .iter()
            .filter(|&&id| tokenizer.decode(&[id]).unwrap().contains('\u{FFFD}'))
            .count();
        assert!(split >= 2, "no token splits a character; pick other text");
        let mut detokenizer = IncrementalDetokenizer::new();
        let mut shown = String::new();
        for &id in &ids {
            let piece = detokenizer.push(tokenizer, id).unwrap();
            assert!(!piece.contains('\u{FFFD}'), "broken piece {piece:?}");
            shown.push_str(&piece);
        }
        shown.push_str(&detokenizer.flush(tokenizer).unwrap());
        assert_eq!(shown, text);
    }
}

/// The `tokenizers` Python package clients load the exported directory with.
const PY_TOKENIZERS: &str = "0.23.3";

/// A few hundred strings of many kinds: the fixed texts, each with prefixes, suffixes and
/// case changes, numbers, code, whitespace runs and the models' special tokens.
fn many_texts() -> Vec<String> {
    let mut texts: Vec<String> = Vec::new();
    for (i, text) in TEXTS.iter().enumerate() {
        for variant in [
            text.to_string(),
            text.to_uppercase(),
            format!(" {text}"),
            format!("{text}\n\n{}", TEXTS[(i + 1) % TEXTS.len()]),
            format!("Q{i}: {text}?"),
        ] {
            texts.push(variant);
        }
    }
    for n in 0..120u64 {
        let x = n.wrapping_mul(2654435761) % 100_000;
        texts.push(format!(
            "item {x}: {}{}",
            "ab ".repeat((n % 5) as usize),
            x * 7
        ));
        texts.push(format!(
            "fn f{n}(a: u32) -> u32 {{ a + {x} }}\t// é {}",
            "\u{00e9}".repeat((n % 3) as usize)
        ));
    }
    texts.push("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>assistant\n".into());
    texts.push("<tool_call>\n{\"name\": \"f\"}\n</tool_call>".into());
    texts.push("<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n".into());
    texts.push("<table><tr><td>1</td></tr></table>\n\t\tx    y \u{13000}".into());
    texts
}

#[test]
fn the_exported_tokenizer_encodes_as_thicket_does_in_python() {
    let deps = crate::support::processes::python_packages(
        &format!("tokenizers-{PY_TOKENIZERS}"),
        &[&format!("tokenizers=={PY_TOKENIZERS}")],
        "tokenizers",
    );
    let texts = many_texts();
    assert!(texts.len() >= 200);
    for (alias, tokenizer) in [
        ("smollm2-135m", smollm2().tokenizer.clone()),
        ("qwen2.5-coder-0.5b", {
            let (content, _) =
                engine::model::gguf::read_content(&crate::support::fixtures::qwen_path()).unwrap();
            engine::ModelTokenizer::from_gguf(&content).unwrap()
        }),
        ("gemma3-270m", gemma3_tokenizer().clone()),
    ] {
        // `thicket fetch` writes the directory beside the model.
        let fetch = crate::support::processes::thicket()
            .args(["fetch", alias])
            .output()
            .expect("running thicket fetch");
        assert!(fetch.status.success(), "{fetch:?}");
        let dir = engine::model::fetch::models_dir().join(format!("{alias}.tokenizer"));
        let config: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(dir.join("tokenizer_config.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(config["chat_template"].as_str(), tokenizer.chat_template());
        assert!(config["eos_token"].is_string(), "{config}");

        let input = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(input.path(), serde_json::to_string(&texts).unwrap()).unwrap();
        let script = "import json, sys\n\
            from tokenizers import Tokenizer\n\
            tok = Tokenizer.from_file(sys.argv[1] + '/tokenizer.json')\n\
            texts = json.load(open(sys.argv[2]))\n\
            print(json.dumps([[tok.encode(t, add_special_tokens=s).ids for s in (False, True)]\n\
                              for t in texts]))\n";
        let out = std::process::Command::new("python3")
            .args(["-c", script])
            .arg(&dir)
            .arg(input.path())
            .env("PYTHONPATH", &deps)
            .output()
            .expect("running python3");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // Without special tokens, the ids of the text alone; with them, BOS too where the
        // model wants it (Gemma), as thicket feeds the model.
        let python: Vec<[Vec<u32>; 2]> = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(python.len(), texts.len());
        for (text, [plain, with_special]) in texts.iter().zip(&python) {
            assert_eq!(
                plain,
                &tokenizer.encode_plain(text).unwrap(),
                "{alias}: {text:?}"
            );
            assert_eq!(
                with_special,
                &tokenizer.encode(text).unwrap(),
                "{alias}: {text:?}"
            );
        }
    }
}
