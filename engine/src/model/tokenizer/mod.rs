//! `ModelTokenizer`: text <-> token ids for one model, with the facts generation needs
//! beside the vocabulary (BOS and whether to add it, the EOS ids, the chat template).
//!
//! GGUF files carry no `tokenizer.json`, so the tokenizer is rebuilt here from
//! `tokenizer.ggml.*` metadata (`metadata`) with the `tokenizers` crate, by the kind
//! `tokenizer.ggml.model` names: "gpt2" byte-level BPE (`bpe`; Qwen2.5, SmolLM2, gpt-oss),
//! "llama" SentencePiece (`spm`; Gemma 3) or "gemma4" BPE over `▁`-escaped text (`gemma4`). Tokens of type 3 (control) and 2 (unknown) become
//! special added tokens and tokens of type 4 (user-defined, such as Qwen2.5's `<tool_call>`
//! or Gemma's runs of spaces and HTML tags) plain added ones, as upstream marks them: both
//! are matched whole in text, and only the special ones are left out of what a user reads.
//! When the file asks for BOS, the exported `tokenizer.json` adds it too (a post-processor),
//! so a client encoding with special tokens gets the ids thicket feeds the model.

mod bpe;
mod gemma4;
mod metadata;
mod spm;

use std::path::Path;

use candle_core::quantized::gguf_file::Content;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, Tokenizer};

use self::metadata::{bool_or, optional_string, string, GgufVocab, CONTROL, UNKNOWN, USER_DEFINED};
use crate::{Error, Result};

/// Token names treated as end-of-sequence in addition to the declared EOS id, when the
/// tokenizer has them as special tokens: Gemma's `</s>` is a user-defined HTML tag, and in
/// Qwen's vocabulary `</s>` is an ordinary byte-pair token that a model writes in HTML or
/// code, not an end. gpt-oss (harmony) ends a reply with `<|return|>` and a tool call with
/// `<|call|>`; its `<|end|>` only closes one message (the analysis before the final answer),
/// so it is not an end. Gemma 4 closes its turn with `<turn|>`.
const END_TOKENS: &[&str] = &[
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "</s>",
    "<end_of_turn>",
    "<|return|>",
    "<|call|>",
    "<turn|>",
];

/// A model's tokenizer and its special-token facts.
#[derive(Clone)]
pub struct ModelTokenizer {
    inner: Tokenizer,
    bos_id: Option<u32>,
    add_bos: bool,
    /// Whether the model's inputs end with its end token (GGUF's `add_eos_token`, HF's
    /// `add_eos_token`): what an embedding model reads, not a chat prompt.
    add_eos: bool,
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
        let kind = string(md, "tokenizer.ggml.model")?;
        let vocab = GgufVocab::read(md)?;
        // llama.cpp's defaults when the file does not say: SentencePiece models add BOS.
        let (mut inner, bos_by_default) = match kind.as_str() {
            "gpt2" => (bpe::build(md, &vocab)?, false),
            "llama" => (spm::build(md, &vocab)?, true),
            "gemma4" => (gemma4::build(md, &vocab)?, true),
            other => {
                return Err(Error::Tokenizer(format!(
                    "tokenizer model '{other}' is not supported (supported: 'gpt2' BPE, \
                     'llama' SentencePiece, 'gemma4' BPE)"
                )))
            }
        };
        let added = |kind: i32, special: bool| -> Vec<AddedToken> {
            vocab
                .of_type(kind)
                .map(|tok| AddedToken::from(tok.clone(), special).normalized(false))
                .collect()
        };
        let mut special = added(UNKNOWN, true);
        special.extend(added(CONTROL, true));
        inner
            .add_special_tokens(special)
            .map_err(|e| Error::Tokenizer(e.to_string()))?;
        inner
            .add_tokens(added(USER_DEFINED, false))
            .map_err(|e| Error::Tokenizer(e.to_string()))?;

        let bos_id = vocab.token_id(md, "tokenizer.ggml.bos_token_id")?;
        let add_bos = bool_or(md, "tokenizer.ggml.add_bos_token", bos_by_default)?;
        if let (true, Some(bos)) = (add_bos, bos_id) {
            inner.with_post_processor(Some(bos_processor(&vocab.tokens[bos as usize], bos)?));
        }
        let declared_eos = vocab.token_id(md, "tokenizer.ggml.eos_token_id")?;
        let chat_template = optional_string(md, "tokenizer.chat_template").cloned();
        let mut tokenizer = Self::assemble(
            inner,
            bos_id,
            add_bos,
            declared_eos.into_iter().collect(),
            chat_template,
        );
        tokenizer.add_eos = bool_or(md, "tokenizer.ggml.add_eos_token", false)?;
        Ok(tokenizer)
    }

    /// Loads `tokenizer.json` (and `tokenizer_config.json` and `chat_template.jinja` when
    /// present) from an HF directory.
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
        // transformers writes the template beside the config since 4.43 (gpt-oss, Qwen3.5).
        let chat_template = match config["chat_template"].as_str() {
            Some(template) => Some(template.to_string()),
            None => match std::fs::read_to_string(dir.join("chat_template.jinja")) {
                Ok(template) => Some(template),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => return Err(Error::io("read chat_template.jinja", e)),
            },
        };
        let mut tokenizer = Self::assemble(inner, bos_id, add_bos, eos, chat_template);
        tokenizer.add_eos = config["add_eos_token"].as_bool().unwrap_or(false);
        Ok(tokenizer)
    }

    fn assemble(
        inner: Tokenizer,
        bos_id: Option<u32>,
        add_bos: bool,
        mut eos_ids: Vec<u32>,
        chat_template: Option<String>,
    ) -> Self {
        let special: Vec<String> = inner
            .get_added_tokens_decoder()
            .into_values()
            .filter(|t| t.special)
            .map(|t| t.content)
            .collect();
        eos_ids.extend(
            END_TOKENS
                .iter()
                .filter(|t| special.iter().any(|s| s == *t))
                .filter_map(|t| inner.token_to_id(t)),
        );
        // The declared end first (templates and exported configs name it), then the others
        // in id order, each once.
        if let Some((_, others)) = eos_ids.split_first_mut() {
            others.sort_unstable();
        }
        let mut seen = Vec::with_capacity(eos_ids.len());
        eos_ids.retain(|&id| {
            let new = !seen.contains(&id);
            seen.push(id);
            new
        });
        Self {
            inner,
            bos_id,
            add_bos,
            add_eos: false,
            eos_ids,
            chat_template,
        }
    }

    /// The tokens the model's inputs start with (its BOS, where it adds one).
    pub fn input_start(&self) -> Vec<u32> {
        match (self.add_bos, self.bos_id) {
            (true, Some(bos)) => vec![bos],
            _ => Vec::new(),
        }
    }

    /// The tokens the model's inputs end with: its first end token where its metadata says
    /// inputs end with one (an embedding model's), none otherwise.
    pub fn input_end(&self) -> Vec<u32> {
        match (self.add_eos, self.eos_ids.first()) {
            (true, Some(&eos)) => vec![eos],
            _ => Vec::new(),
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
            "add_eos_token": self.add_eos,
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

/// Adds `<bos>` before a sequence (and before the second of a pair), as Hugging Face's
/// Llama and Gemma tokenizers do when they add BOS. Built from its serialized form, which
/// takes any token text (the template syntax would split one holding `:` or a space).
fn bos_processor(bos: &str, id: u32) -> Result<TemplateProcessing> {
    let token = |type_id: u32| serde_json::json!({"SpecialToken": {"id": bos, "type_id": type_id}});
    let sequence =
        |seq: &str, type_id: u32| serde_json::json!({"Sequence": {"id": seq, "type_id": type_id}});
    serde_json::from_value(serde_json::json!({
        "type": "TemplateProcessing",
        "single": [token(0), sequence("A", 0)],
        "pair": [token(0), sequence("A", 0), token(1), sequence("B", 1)],
        "special_tokens": {bos: {"id": bos, "ids": [id], "tokens": [bos]}},
    }))
    .map_err(|e| Error::Tokenizer(format!("BOS post-processor: {e}")))
}
