//! The tokenizer rebuilt from GGUF metadata: exact round trips, special tokens matched whole,
//! and SmolLM2's documented pre-tokenization (digits split one by one).

use crate::common::smollm2;

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
    let (content, _) = engine::gguf::read_content(&crate::common::qwen_path()).unwrap();
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
    use engine::detokenizer::IncrementalDetokenizer;
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
