//! `Encoder`: a loaded encoder checkpoint (weights, what it computes, the longest input it
//! reads) and `EncoderTokenizer`, its WordPiece tokenizer from `tokenizer.json` with the
//! file's own padding and truncation turned off: inputs are packed, never padded, and an
//! input longer than the model reads is refused unless the caller asked to truncate it, which
//! keeps its first tokens and the special tokens around them (sentence-transformers' rule).

use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;

use candle_core::safetensors::MmapedSafetensors;
use candle_core::DType;
use tokenizers::utils::truncation::{
    truncate_encodings, TruncationDirection, TruncationParams, TruncationStrategy,
};
use tokenizers::{Encoding, Tokenizer};

use super::bert::{BertEncoder, EncoderInput};
use super::config::{declared_max_length, read_config, EncoderTask};
use super::decoder::DecoderText;
use super::weights::{Gguf, Safetensors};
use crate::model::linear::WeightDType;
use crate::{Error, Result};

/// Text to token ids for an encoder.
pub struct EncoderTokenizer {
    pub(super) inner: Tokenizer,
    pub(super) max_length: usize,
    pub(super) vocab_size: usize,
    /// How a decoder that pools reads its inputs (`None`: an encoder's WordPiece rules).
    pub(super) decoder: Option<DecoderText>,
}

impl std::fmt::Debug for EncoderTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EncoderTokenizer")
            .field("max_length", &self.max_length)
            .finish()
    }
}

impl EncoderTokenizer {
    /// The longest input, special tokens included.
    pub fn max_length(&self) -> usize {
        self.max_length
    }

    /// One text, with the model's special tokens; `truncate` caps its length (special tokens
    /// included), otherwise a text longer than [`EncoderTokenizer::max_length`] is an error.
    pub fn text(
        &self,
        text: &str,
        truncate: Option<usize>,
    ) -> std::result::Result<EncoderInput, String> {
        match &self.decoder {
            Some(decoder) => decoder.text(self, text, truncate),
            None => self.encode(text, None, truncate),
        }
    }

    /// A pair (query, document) as a cross-encoder reads it, the two segments told apart by
    /// their token types; `truncate` shortens the longer first.
    pub fn pair(
        &self,
        first: &str,
        second: &str,
        truncate: Option<usize>,
    ) -> std::result::Result<EncoderInput, String> {
        self.pair_instructed(first, second, truncate, None)
    }

    /// [`EncoderTokenizer::pair`] judged under `instruction` instead of the template's own,
    /// for a model whose pair template has one ([`EncoderTokenizer::takes_instruction`]).
    pub fn pair_instructed(
        &self,
        first: &str,
        second: &str,
        truncate: Option<usize>,
        instruction: Option<&str>,
    ) -> std::result::Result<EncoderInput, String> {
        match (&self.decoder, instruction) {
            (Some(decoder), _) => decoder.pair(self, first, second, truncate, instruction),
            (None, None) => self.encode(first, Some(second), truncate),
            (None, Some(_)) => {
                Err("this model reads a pair as it is: it takes no instruction".into())
            }
        }
    }

    /// Whether pairs are read under an instruction a request may replace (a decoder
    /// reranker's template).
    pub fn takes_instruction(&self) -> bool {
        self.decoder.as_ref().is_some_and(DecoderText::reads_pairs)
    }

    /// Token ids as given (no special tokens added), checked against the vocabulary and,
    /// unless truncated, the length.
    pub fn ids(
        &self,
        ids: Vec<u32>,
        truncate: Option<usize>,
    ) -> std::result::Result<EncoderInput, String> {
        if let Some(bad) = ids.iter().find(|&&t| t as usize >= self.vocab_size) {
            return Err(format!(
                "token id {bad} is outside the vocabulary of {}",
                self.vocab_size
            ));
        }
        let mut ids = ids;
        let limit = self.limit(truncate)?;
        if ids.len() > limit {
            match truncate {
                Some(_) => ids.truncate(limit),
                None => return Err(self.too_long(ids.len())),
            }
        }
        if ids.is_empty() {
            return Err("an input has no tokens".into());
        }
        Ok(EncoderInput {
            ids,
            types: Vec::new(),
        })
    }

    /// The ids of `text` (with the model's special tokens when `special`), whatever its
    /// length (`/tokenize`).
    pub fn tokenize(&self, text: &str, special: bool) -> std::result::Result<Vec<u32>, String> {
        self.inner
            .encode(text, special)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| e.to_string())
    }

    /// The text of token ids, special tokens left out (`/detokenize`); ids outside the
    /// vocabulary are an error.
    pub fn detokenize(&self, ids: &[u32]) -> std::result::Result<String, String> {
        if let Some(bad) = ids.iter().find(|&&t| t as usize >= self.vocab_size) {
            return Err(format!(
                "token id {bad} outside the vocabulary of {}",
                self.vocab_size
            ));
        }
        self.inner.decode(ids, true).map_err(|e| e.to_string())
    }

    pub(super) fn limit(&self, truncate: Option<usize>) -> std::result::Result<usize, String> {
        match truncate {
            None => Ok(self.max_length),
            Some(0) => Err("truncation must keep at least one token".into()),
            Some(n) if n > self.max_length => Err(format!(
                "truncation to {n} tokens is more than the {} this model reads",
                self.max_length
            )),
            Some(n) => Ok(n),
        }
    }

    pub(super) fn too_long(&self, tokens: usize) -> String {
        format!(
            "an input has {tokens} tokens; this model reads at most {} (truncate_prompt_tokens \
             shortens inputs)",
            self.max_length
        )
    }

    fn encode(
        &self,
        first: &str,
        second: Option<&str>,
        truncate: Option<usize>,
    ) -> std::result::Result<EncoderInput, String> {
        let limit = self.limit(truncate)?;
        let plain = |text: &str| -> std::result::Result<Encoding, String> {
            self.inner.encode(text, false).map_err(|e| e.to_string())
        };
        let (a, b) = (plain(first)?, second.map(plain).transpose()?);
        let added = self.inner.get_post_processor().map_or(0, |p| {
            tokenizers::PostProcessor::added_tokens(p, b.is_some())
        });
        let content = a.len() + b.as_ref().map_or(0, Encoding::len);
        let (a, b) = if content + added > limit {
            if truncate.is_none() {
                return Err(self.too_long(content + added));
            }
            let params = TruncationParams {
                direction: TruncationDirection::Right,
                max_length: limit.saturating_sub(added),
                strategy: TruncationStrategy::LongestFirst,
                stride: 0,
            };
            truncate_encodings(a, b, &params).map_err(|e| e.to_string())?
        } else {
            (a, b)
        };
        let encoding = self
            .inner
            .post_process(a, b, true)
            .map_err(|e| e.to_string())?;
        if encoding.is_empty() {
            return Err("an input has no tokens".into());
        }
        Ok(EncoderInput {
            ids: encoding.get_ids().to_vec(),
            types: encoding.get_type_ids().to_vec(),
        })
    }
}

/// A loaded encoder checkpoint.
#[derive(Debug)]
pub struct Encoder {
    /// The weights and the forward.
    pub model: BertEncoder,
    /// What it computes.
    pub task: EncoderTask,
    /// Its tokenizer (shared with the threads that prepare requests).
    pub tokenizer: Arc<EncoderTokenizer>,
}

impl Encoder {
    /// Loads the encoder at `path`: a GGUF file (`bert`) or a Hugging Face folder.
    pub fn load(path: &Path, dtype: WeightDType) -> Result<Self> {
        match path.is_file() {
            true => Self::load_gguf(path, dtype),
            false => Self::load_dir(path, dtype),
        }
    }

    /// Loads a `bert` GGUF written by llama.cpp's converter (weights dequantized to f32, then
    /// held as `dtype` says).
    pub fn load_gguf(path: &Path, dtype: WeightDType) -> Result<Self> {
        let (content, reader) = crate::model::gguf::read_content(path)?;
        let (config, task) = super::gguf::read_config(&content)?;
        let json = super::gguf::tokenizer_json(&content)?;
        let inner = Tokenizer::from_str(&json.to_string())
            .map_err(|e| Error::Tokenizer(format!("{}: {e}", path.display())))?;
        let max_length = config.max_positions;
        let vocab_size = config.vocab_size;
        let model = BertEncoder::load(&Gguf::new(content, reader), config, task, dense(dtype))?;
        Ok(Self::assemble(model, task, inner, max_length, vocab_size))
    }

    /// Loads the encoder in the Hugging Face directory `dir` (`config.json`, `*.safetensors`,
    /// `tokenizer.json`, and sentence-transformers' module files where there are). Weights
    /// stay f32 unless `dtype` asks for another (`q`: Q8_0).
    pub fn load_dir(dir: &Path, dtype: WeightDType) -> Result<Self> {
        let (config, task) = read_config(dir)?;
        let files: Vec<_> = std::fs::read_dir(dir)
            .map_err(|e| Error::io(format!("read {}", dir.display()), e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
            .collect();
        if files.is_empty() {
            return Err(Error::MissingFile(dir.join("*.safetensors")));
        }
        // SAFETY: the files are mapped read-only and not modified while the model is loaded.
        let st = unsafe { MmapedSafetensors::multi(&files)? };
        let max_length = declared_max_length(dir)
            .unwrap_or(config.max_positions)
            .min(config.max_positions);
        let vocab_size = config.vocab_size;
        let model = BertEncoder::load(&Safetensors::new(st), config, task, dense(dtype))?;
        let path = dir.join("tokenizer.json");
        if !path.is_file() {
            return Err(Error::MissingFile(path));
        }
        let inner = Tokenizer::from_file(&path)
            .map_err(|e| Error::Tokenizer(format!("{}: {e}", path.display())))?;
        Ok(Self::assemble(model, task, inner, max_length, vocab_size))
    }

    fn assemble(
        model: BertEncoder,
        task: EncoderTask,
        mut inner: Tokenizer,
        max_length: usize,
        vocab_size: usize,
    ) -> Self {
        inner.with_padding(None);
        // Clearing truncation cannot fail (only a stride past the length can).
        let _ = inner.with_truncation(None);
        Self {
            model,
            task,
            tokenizer: Arc::new(EncoderTokenizer {
                inner,
                max_length,
                vocab_size,
                decoder: None,
            }),
        }
    }
}

/// The dtype projections are held in: f32 unless `dtype` asks for another (`None`: Q8_0).
fn dense(dtype: WeightDType) -> Option<DType> {
    match dtype {
        WeightDType::Auto => Some(DType::F32),
        other => other.dense(),
    }
}
