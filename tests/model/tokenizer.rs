//! The tokenizer rebuilt from GGUF metadata: exact round trips, special tokens matched whole,
//! and SmolLM2's documented pre-tokenization (digits split one by one); and the Hugging Face
//! directory `thicket fetch` exports for clients, which the `tokenizers` Python package reads
//! to the same ids on a few hundred strings.

use crate::support::fixtures::smollm2;

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
    assert!(tok.eos_ids().contains(&151_645));
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
fn incremental_detokenizer_never_emits_a_broken_character() {
    use engine::model::detokenizer::IncrementalDetokenizer;
    let tokenizer = &smollm2().tokenizer;
    let text = "Grüße aus 東京 😀🎉 — naïve café ∑x² ok";
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
            print(json.dumps([tok.encode(t, add_special_tokens=False).ids for t in texts]))\n";
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
        let python: Vec<Vec<u32>> = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(python.len(), texts.len());
        for (text, ids) in texts.iter().zip(&python) {
            assert_eq!(
                ids,
                &tokenizer.encode_plain(text).unwrap(),
                "{alias}: {text:?}"
            );
        }
    }
}
