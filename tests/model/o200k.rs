//! gpt-oss's tokenizer (o200k_harmony, byte-level BPE with the `gpt-4o` pre-tokenizer) as
//! thicket rebuilds it from a GGUF's metadata, on a tiny gpt-oss written with the real
//! vocabulary, merges and special tokens (from quicktok's data, as llama.cpp's converter
//! writes them) and the real chat template: against openai-harmony, the reference, the same
//! ids on a few hundred texts of many kinds (contractions, case, digits, whitespace, code,
//! scripts, emoji, harmony's own markup) and the texts back from them; and its ends
//! (`<|return|>`, `<|call|>`, not `<|end|>`).

use std::sync::OnceLock;

use candle_core::quantized::GgmlDType;
use candle_core::Device;
use engine::model::testing::{
    o200k_harmony_metadata, write_tiny_gptoss_gguf, TinyGptOss, O200K_HARMONY_VOCAB,
};
use engine::ModelTokenizer;

use crate::support::harmony::{harmony, Harmony};

const TEMPLATE: &str = include_str!("../data/gptoss_chat_template.jinja");

/// `<|startoftext|>`.
const BOS: u32 = 199_998;
/// `<|return|>`: the end of a reply.
const RETURN: u32 = 200_002;
/// `<|end|>`: the end of one message of a reply.
const END: u32 = 200_007;
/// `<|call|>`: the end of a tool call.
const CALL: u32 = 200_012;

/// The tiny gpt-oss with the o200k_harmony tokenizer, written once: the reference's paths,
/// the tokenizer read from the file, and the file's vocabulary size as the model reads it.
pub(crate) fn fixture() -> &'static (Harmony, ModelTokenizer, usize) {
    static FIXTURE: OnceLock<(Harmony, ModelTokenizer, usize)> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let harmony = harmony();
        let tokenizer = o200k_harmony_metadata(&harmony.quicktok_data, Some(TEMPLATE)).unwrap();
        let spec = TinyGptOss {
            vocab_size: O200K_HARMONY_VOCAB,
            hidden_size: 32,
            mxfp4: false,
            tokenizer: Some(tokenizer),
            ..TinyGptOss::default()
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gptoss-o200k.gguf");
        write_tiny_gptoss_gguf(&path, &spec, GgmlDType::Q8_0).unwrap();
        let (content, _) = engine::model::gguf::read_content(&path).unwrap();
        let tok = ModelTokenizer::from_gguf(&content).unwrap();
        let (config, _) =
            engine::model::gguf::load_gguf_weights(&path, None, &Device::Cpu).unwrap();
        (harmony, tok, config.vocab_size)
    })
}

/// Texts of many kinds, each also upper-cased, after a space, with trailing spaces, joined
/// to the next by CRLF, and numbered.
const TEXTS: &[&str] = &[
    "Hello, world!",
    "It's the cat's toy; they're sure we've won, I'm told, you'll see, he'd go.",
    "IT'S LOUD, THEY'RE HERE, WE'LL GO, I'D SAY, YOU'VE SEEN, I'M IN",
    "Mixed cAsE: HTTPServer, XMLHttpRequest, camelCaseWord, snake_case_word, iPhone",
    "The Quick Brown Fox Jumps Over The Lazy Dog",
    "Digits 1 12 123 1234 12345 123456 1234567 and 3.14159, 1,000,000, 0x1F, 2024-06-01",
    "  leading spaces and trailing   ",
    "tabs\tand\t\tmore\ttabs \t mixed",
    "line one\r\nline two\r\n\r\nline four\n\n\n   indented\n\ttabbed",
    "def f(x):\n    return x ** 2  # square\n\nprint(f(12))\n",
    "fn main() {\n    let v: Vec<u32> = (0..10).map(|i| i * i).collect();\n}\n",
    "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}",
    "https://example.com/path/to/page?query=1&b=two#frag and /usr/local/bin/",
    "Café, naïve, résumé, Ångström, São Paulo, Zürich, façade, coöperate",
    "Привет, как дела? Москва — столица России.",
    "日本語のテキストと漢字、ひらがな、カタカナ。中文：你好，世界！한국어 문장입니다.",
    "مرحبا بالعالم، هذه جملة عربية.",
    "Emoji 🎉🚀👍🏽 and flags 🇫🇷🇯🇵, family 👨‍👩‍👧‍👦, hearts ❤️💙",
    "Combining: e\u{301} a\u{308} n\u{303} o\u{302}\u{323}, Devanagari नमस्ते",
    "Spaces: a\u{a0}b\u{3000}c\u{2009}d\u{2028}e",
    "<|start|>assistant<|channel|>analysis<|message|>Hi<|end|>",
    "<|start|>user<|message|>What is 2+2?<|end|><|start|>assistant<|channel|>final<|message|>4<|return|>",
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>",
    "<|startoftext|><|endoftext|> text between <|reserved_200013|><|reserved_201087|>",
    "!!! ??? ... --- *** ### @@@ $$$ %%% ^^^ &&& ((( ))) [[[ ]]] {{{ }}}",
    "a/b/c\n/d\r\n//e// x=1;y=2 </div>\n<br/>\r\n",
    "a   \n\n  b  \t\n \n\n\n    c\u{b}\u{c}d  \r\r\n",
    "x'sY'LLz ’re 's 'S Don'T 1234567890123456789 ½ ² ٣٤٥ Ⅻ",
    "",
    " ",
    "\n",
    "x",
];

fn many_texts() -> Vec<String> {
    let mut texts: Vec<String> = Vec::new();
    for (i, text) in TEXTS.iter().enumerate() {
        texts.extend([
            text.to_string(),
            text.to_uppercase(),
            text.to_lowercase(),
            format!(" {text}"),
            format!("{text}   "),
            format!("{text}\r\n{}", TEXTS[(i + 1) % TEXTS.len()]),
            format!("Q{i}: {text}?"),
        ]);
    }
    for n in 0..100u64 {
        let x = n.wrapping_mul(2_654_435_761) % 10_000_000;
        let words = [
            "don't", "WON'T", "She'll", "it'S", "O'Neil", "naïve", "Ωmega",
        ];
        texts.push(format!(
            "item {x}:{}{} {}\t{}",
            " ".repeat((n % 4) as usize),
            words[(n % 7) as usize],
            x * 7,
            "é".repeat((n % 3) as usize)
        ));
        texts.push(format!(
            "fn f{n}(a: u32) -> u32 {{ a + {x} }}{}// 東京 {}",
            "\n".repeat((n % 3) as usize),
            "🙂".repeat((n % 2) as usize)
        ));
    }
    texts
}

#[test]
fn gptoss_encodes_as_openai_harmony_does_and_decodes_back() {
    let (harmony, tok, _) = fixture();
    let texts = many_texts();
    assert!(texts.len() >= 300, "{}", texts.len());
    let input = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(input.path(), serde_json::to_string(&texts).unwrap()).unwrap();
    let script = "import json, sys\n\
        from openai_harmony import load_harmony_encoding, HarmonyEncodingName\n\
        enc = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)\n\
        texts = json.load(open(sys.argv[1], encoding='utf-8'))\n\
        print(json.dumps([enc.encode(t, allowed_special='all') for t in texts]))\n";
    let out = harmony.run(&["-c".as_ref(), script.as_ref(), input.path().as_os_str()]);
    let reference: Vec<Vec<u32>> = serde_json::from_slice(&out).unwrap();
    assert_eq!(reference.len(), texts.len());
    let mut differ = Vec::new();
    for (text, want) in texts.iter().zip(&reference) {
        let ids = tok.encode(text).unwrap();
        if &ids != want {
            differ.push(format!(
                "{text:?}\n  thicket        {ids:?}\n  openai-harmony {want:?}"
            ));
        }
        assert_eq!(&tok.decode(&ids).unwrap(), text, "ids {ids:?}");
    }
    assert!(
        differ.is_empty(),
        "{} of {} texts differ from openai-harmony, the first:\n{}",
        differ.len(),
        texts.len(),
        differ[0]
    );
}

#[test]
fn gptoss_ends_a_reply_and_a_tool_call_but_not_a_message() {
    let (_, tok, model_vocab) = fixture();
    assert_eq!(tok.vocab_size(), O200K_HARMONY_VOCAB);
    assert_eq!(*model_vocab, O200K_HARMONY_VOCAB);
    assert_eq!(tok.bos_id(), Some(BOS));
    assert_eq!(tok.chat_template(), Some(TEMPLATE));
    // The declared end first.
    assert_eq!(tok.eos_ids().first(), Some(&RETURN));
    assert!(tok.eos_ids().contains(&CALL), "{:?}", tok.eos_ids());
    assert!(!tok.eos_ids().contains(&END), "{:?}", tok.eos_ids());
    // Harmony's markers are single control tokens, left out of what a user reads.
    let ids = tok
        .encode("<|start|>assistant<|channel|>final<|message|>Hi<|return|>")
        .unwrap();
    assert_eq!(ids.first(), Some(&200_006));
    assert_eq!(ids.last(), Some(&RETURN));
    assert_eq!(tok.decode_skip_special(&ids).unwrap(), "assistantfinalHi");
    // quicktok's data, like tiktoken's o200k_harmony, gives id 200018 two names: o200k's
    // `<|endofprompt|>` and harmony's `<|reserved_200018|>`. The file keeps the first, so
    // thicket reads `<|endofprompt|>` as that token, where openai-harmony (which knows only
    // the reserved name) reads it as text; no harmony conversation holds either.
    assert_eq!(tok.encode("<|endofprompt|>").unwrap(), [200_018]);
    assert_eq!(tok.token_to_id("<|reserved_200018|>"), None);
}
