//! `ModelTokenizer`: text <-> token ids for one model, with the facts generation needs
//! beside the vocabulary (BOS and whether to add it, the EOS ids, the chat template).
//!
//! GGUF files carry no `tokenizer.json`, so the BPE tokenizer is rebuilt here from
//! `tokenizer.ggml.*` metadata with the `tokenizers` crate; the pre-tokenizer is chosen by
//! `tokenizer.ggml.pre` to match what the upstream `tokenizer.json` declares. Tokens of type
//! 3 (control) become special added tokens and tokens of type 4 (user-defined, such as
//! Qwen2.5's `<tool_call>`) plain added ones, as upstream marks them: both are matched whole
//! in text, and only the special ones are left out of what a user reads.

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::gguf_file::{Content, Value};
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::BPE;
use tokenizers::normalizers::unicode::NFC;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior, Tokenizer};

use crate::{Error, Result};

/// The Qwen2 pre-tokenizer split pattern, as in its upstream tokenizer.json.
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Token names treated as end-of-sequence in addition to the declared EOS id.
const END_TOKENS: &[&str] = &["<|im_end|>", "<|endoftext|>", "<|eot_id|>", "</s>"];

/// A model's tokenizer and its special-token facts.
#[derive(Clone)]
pub struct ModelTokenizer {
    inner: Tokenizer,
    bos_id: Option<u32>,
    add_bos: bool,
    eos_ids: Vec<u32>,
    chat_template: Option<String>,
}

impl std::fmt::Debug for ModelTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelTokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("bos_id", &self.bos_id)
            .field("eos_ids", &self.eos_ids)
            .finish()
    }
}

impl ModelTokenizer {
    /// Builds the tokenizer from GGUF metadata.
    pub fn from_gguf(content: &Content) -> Result<Self> {
        let md = &content.metadata;
        let model = string_md(md, "tokenizer.ggml.model")?;
        if model != "gpt2" {
            return Err(Error::Tokenizer(format!(
                "tokenizer model '{model}' is not supported (only BPE 'gpt2')"
            )));
        }
        let tokens = string_array_md(md, "tokenizer.ggml.tokens")?;
        let merges = string_array_md(md, "tokenizer.ggml.merges")?;
        let token_types: Vec<i64> = match md.get("tokenizer.ggml.token_type") {
            Some(v) => v
                .to_vec()?
                .iter()
                .map(|t| t.to_i32().map(i64::from))
                .collect::<candle_core::Result<_>>()?,
            None => vec![1; tokens.len()],
        };
        let pre = md
            .get("tokenizer.ggml.pre")
            .and_then(|v| v.to_string().ok())
            .map(String::as_str)
            .unwrap_or("default");

        let vocab: tokenizers::models::bpe::Vocab = tokens
            .iter()
            .enumerate()
            .map(|(id, tok)| (tok.clone(), id as u32))
            .collect();
        let merges = merges
            .iter()
            .map(|m| {
                m.split_once(' ')
                    .map(|(a, b)| (a.to_string(), b.to_string()))
                    .ok_or_else(|| Error::Tokenizer(format!("malformed merge '{m}'")))
            })
            .collect::<Result<Vec<_>>>()?;
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .build()
            .map_err(|e| Error::Tokenizer(e.to_string()))?;

        let mut inner = Tokenizer::new(bpe);
        inner.with_pre_tokenizer(Some(pre_tokenizer(pre)?));
        if pre == "qwen2" {
            inner
                .with_normalizer(Some(NFC))
                .map_err(|e| Error::Tokenizer(e.to_string()))?;
        }
        inner.with_decoder(Some(ByteLevelDecoder::default()));
        let added = |kind: i64, special: bool| -> Vec<AddedToken> {
            tokens
                .iter()
                .zip(&token_types)
                .filter(|(_, &ty)| ty == kind)
                .map(|(tok, _)| AddedToken::from(tok.clone(), special).normalized(false))
                .collect()
        };
        inner
            .add_special_tokens(added(3, true))
            .map_err(|e| Error::Tokenizer(e.to_string()))?;
        inner
            .add_tokens(added(4, false))
            .map_err(|e| Error::Tokenizer(e.to_string()))?;

        let id_md = |key: &str| md.get(key).and_then(|v| v.to_u32().ok());
        let bos_id = id_md("tokenizer.ggml.bos_token_id");
        let add_bos = md
            .get("tokenizer.ggml.add_bos_token")
            .and_then(|v| v.to_bool().ok())
            .unwrap_or(false);
        let declared_eos = id_md("tokenizer.ggml.eos_token_id");
        let chat_template = md
            .get("tokenizer.chat_template")
            .and_then(|v| v.to_string().ok())
            .cloned();
        Ok(Self::assemble(
            inner,
            bos_id,
            add_bos,
            declared_eos.into_iter().collect(),
            chat_template,
        ))
    }

    /// Loads `tokenizer.json` (and `tokenizer_config.json` when present) from an HF directory.
    pub fn from_hf_dir(dir: &Path, config_eos: Vec<u32>) -> Result<Self> {
        let path = dir.join("tokenizer.json");
        if !path.is_file() {
            return Err(Error::MissingFile(path));
        }
        let inner = Tokenizer::from_file(&path).map_err(|e| Error::Tokenizer(e.to_string()))?;
        let config: serde_json::Value =
            match std::fs::read_to_string(dir.join("tokenizer_config.json")) {
                Ok(text) => serde_json::from_str(&text)
                    .map_err(|e| Error::Tokenizer(format!("tokenizer_config.json: {e}")))?,
                Err(_) => serde_json::Value::Null,
            };
        let token_id = |key: &str| {
            let v = &config[key];
            let name = v.as_str().or_else(|| v["content"].as_str())?;
            inner.token_to_id(name)
        };
        let bos_id = token_id("bos_token");
        let add_bos = config["add_bos_token"].as_bool().unwrap_or(false);
        let mut eos = config_eos;
        eos.extend(token_id("eos_token"));
        let chat_template = config["chat_template"].as_str().map(str::to_string);
        Ok(Self::assemble(inner, bos_id, add_bos, eos, chat_template))
    }

    fn assemble(
        inner: Tokenizer,
        bos_id: Option<u32>,
        add_bos: bool,
        mut eos_ids: Vec<u32>,
        chat_template: Option<String>,
    ) -> Self {
        eos_ids.extend(END_TOKENS.iter().filter_map(|t| inner.token_to_id(t)));
        eos_ids.sort_unstable();
        eos_ids.dedup();
        Self {
            inner,
            bos_id,
            add_bos,
            eos_ids,
            chat_template,
        }
    }

    /// Token ids of `text`; special tokens written in the text are recognised, and BOS is
    /// prepended when the model asks for it.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let encoding = self
            .inner
            .encode(text, false)
            .map_err(|e| Error::Tokenizer(e.to_string()))?;
        let mut ids = Vec::with_capacity(encoding.len() + 1);
        if let (true, Some(bos)) = (self.add_bos, self.bos_id) {
            ids.push(bos);
        }
        ids.extend_from_slice(encoding.get_ids());
        Ok(ids)
    }

    /// Token ids of `text` without BOS (for text that already carries the model's special
    /// tokens, such as a rendered chat template).
    pub fn encode_plain(&self, text: &str) -> Result<Vec<u32>> {
        let encoding = self
            .inner
            .encode(text, false)
            .map_err(|e| Error::Tokenizer(e.to_string()))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Text of `ids`, special tokens included (so decode(encode(s)) == s).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner
            .decode(ids, false)
            .map_err(|e| Error::Tokenizer(e.to_string()))
    }

    /// Text of `ids` without special tokens (what a user reads).
    pub fn decode_skip_special(&self, ids: &[u32]) -> Result<String> {
        self.inner
            .decode(ids, true)
            .map_err(|e| Error::Tokenizer(e.to_string()))
    }

    /// Ids that end generation.
    pub fn eos_ids(&self) -> &[u32] {
        &self.eos_ids
    }

    /// The BOS id, if the model has one.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos_id
    }

    /// The model's Jinja chat template, if it ships one.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// Writes this tokenizer as a Hugging Face tokenizer directory (`tokenizer.json` and
    /// `tokenizer_config.json` with the chat template and the BOS/EOS tokens), so clients
    /// without a hub (load generators, routers, `AutoTokenizer.from_pretrained(dir)`) encode
    /// exactly as thicket does.
    pub fn export_hf(&self, dir: &Path) -> Result<()> {
        let failed =
            |e: &dyn std::fmt::Display| Error::Tokenizer(format!("{}: {e}", dir.display()));
        std::fs::create_dir_all(dir).map_err(|e| failed(&e))?;
        // Each file is written aside and renamed into place, so a client (or another
        // `thicket fetch`) reading the directory meanwhile never sees half a file.
        let partial = |name: &str| dir.join(format!("{name}.partial-{}", std::process::id()));
        let place =
            |name: &str| std::fs::rename(partial(name), dir.join(name)).map_err(|e| failed(&e));
        self.inner
            .save(partial("tokenizer.json"), false)
            .map_err(|e| failed(&e))?;
        place("tokenizer.json")?;
        let text = |id: Option<u32>| id.and_then(|i| self.inner.id_to_token(i));
        let config = serde_json::json!({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": text(self.bos_id),
            "eos_token": text(self.eos_ids.first().copied()),
            "add_bos_token": self.add_bos,
            "add_eos_token": false,
            "clean_up_tokenization_spaces": false,
            "chat_template": self.chat_template,
        });
        std::fs::write(partial("tokenizer_config.json"), config.to_string())
            .map_err(|e| failed(&e))?;
        place("tokenizer_config.json")
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Id of one token string.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The underlying `tokenizers` tokenizer.
    pub fn inner(&self) -> &Tokenizer {
        &self.inner
    }
}

fn pre_tokenizer(pre: &str) -> Result<Sequence> {
    let parts: Vec<PreTokenizerWrapper> = match pre {
        "qwen2" => {
            let split = Split::new(
                SplitPattern::Regex(QWEN2_SPLIT.to_string()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(|e| Error::Tokenizer(e.to_string()))?;
            vec![split.into(), ByteLevel::new(false, false, false).into()]
        }
        "smollm" => vec![
            Digits::new(true).into(),
            ByteLevel::new(false, true, true).into(),
        ],
        // GPT-2's own behaviour: byte-level with its regex.
        "default" | "gpt2" => vec![ByteLevel::new(false, true, true).into()],
        other => {
            return Err(Error::Tokenizer(format!(
                "pre-tokenizer '{other}' is not supported (supported: qwen2, smollm, gpt2)"
            )))
        }
    };
    Ok(Sequence::new(parts))
}

fn string_md<'a>(md: &'a HashMap<String, Value>, key: &str) -> Result<&'a String> {
    md.get(key)
        .ok_or_else(|| Error::Metadata(format!("missing {key}")))?
        .to_string()
        .map_err(|e| Error::Metadata(format!("{key}: {e}")))
}

fn string_array_md(md: &HashMap<String, Value>, key: &str) -> Result<Vec<String>> {
    md.get(key)
        .ok_or_else(|| Error::Metadata(format!("missing {key}")))?
        .to_vec()
        .map_err(|e| Error::Metadata(format!("{key}: {e}")))?
        .iter()
        .map(|v| {
            v.to_string()
                .cloned()
                .map_err(|e| Error::Metadata(format!("{key}: {e}")))
        })
        .collect()
}
