//! The real o200k_harmony tokenizer (gpt-oss's) as GGUF metadata, written as llama.cpp's
//! converter writes it for gpt-oss: byte-level BPE (`gpt2`) with the `gpt-4o` pre-tokenizer,
//! the 199,998 ranked byte strings as GPT-2 byte-to-unicode tokens, the harmony special tokens
//! after them as control tokens (201,088 in all), and the merges derived from the ranks as
//! Hugging Face's tiktoken converter derives them. The ranks and the special tokens come from
//! the data files the `quicktok-v1` Python package ships, so tests check thicket's encoding
//! of gpt-oss against the reference without a downloaded model.

use std::collections::HashMap;
use std::path::Path;
use std::sync::OnceLock;

use candle_core::quantized::gguf_file::Value;

use crate::{Error, Result};

/// Tokens of o200k_harmony: the ranked byte strings, then the special tokens.
pub const O200K_HARMONY_VOCAB: usize = 201_088;
/// Ranked (ordinary) tokens of o200k.
const RANKED: usize = 199_998;
/// `<|startoftext|>`.
const BOS: u32 = 199_998;
/// `<|endoftext|>`.
const PAD: u32 = 199_999;
/// `<|return|>`, the end of a reply.
const EOS: u32 = 200_002;
/// Token type of an ordinary token.
const NORMAL: i32 = 1;
/// Token type of a control token.
const CONTROL: i32 = 3;

/// The `tokenizer.*` metadata of gpt-oss's o200k_harmony tokenizer, read from quicktok's
/// `o200k.vocab` and `o200k_harmony.special` in `quicktok_data`, with `chat_template` as
/// `tokenizer.chat_template` when given.
pub fn o200k_harmony_metadata(
    quicktok_data: &Path,
    chat_template: Option<&str>,
) -> Result<Vec<(String, Value)>> {
    let ranked = read_vocab(&quicktok_data.join("o200k.vocab"))?;
    let special = read_special(&quicktok_data.join("o200k_harmony.special"))?;
    let merges = merges(&ranked)?;

    let mut tokens: Vec<Value> = Vec::with_capacity(O200K_HARMONY_VOCAB);
    tokens.extend(ranked.iter().map(|b| Value::String(byte_level(b))));
    tokens.extend(special.into_iter().map(Value::String));
    let mut types = vec![Value::I32(NORMAL); RANKED];
    types.resize(O200K_HARMONY_VOCAB, Value::I32(CONTROL));

    let text = |s: &str| Value::String(s.to_string());
    let mut metadata = vec![
        ("tokenizer.ggml.model".to_string(), text("gpt2")),
        ("tokenizer.ggml.pre".to_string(), text("gpt-4o")),
        ("tokenizer.ggml.tokens".to_string(), Value::Array(tokens)),
        ("tokenizer.ggml.token_type".to_string(), Value::Array(types)),
        (
            "tokenizer.ggml.merges".to_string(),
            Value::Array(merges.into_iter().map(Value::String).collect()),
        ),
        ("tokenizer.ggml.bos_token_id".to_string(), Value::U32(BOS)),
        ("tokenizer.ggml.eos_token_id".to_string(), Value::U32(EOS)),
        (
            "tokenizer.ggml.padding_token_id".to_string(),
            Value::U32(PAD),
        ),
    ];
    if let Some(template) = chat_template {
        metadata.push(("tokenizer.chat_template".to_string(), text(template)));
    }
    Ok(metadata)
}

/// quicktok's `.vocab`: a u32 count, then per token a u16 length, its bytes and a u32 rank
/// (little-endian). The byte strings by rank, checked to be o200k's ranks 0 to 199,997.
fn read_vocab(path: &Path) -> Result<Vec<Vec<u8>>> {
    let data = std::fs::read(path).map_err(|e| Error::io(format!("{}", path.display()), e))?;
    let mut r = Reader::new(&data, path);
    let count = r.u32()? as usize;
    if count != RANKED {
        return Err(r.bad(&format!("{count} tokens, not {RANKED}")));
    }
    let mut tokens = Vec::with_capacity(count);
    for expected in 0..count {
        let len = usize::from(r.u16()?);
        let bytes = r.bytes(len)?.to_vec();
        let rank = r.u32()? as usize;
        if rank != expected {
            return Err(r.bad(&format!("rank {rank} where {expected} was due")));
        }
        tokens.push(bytes);
    }
    r.end()?;
    Ok(tokens)
}

/// quicktok's `.special`: a u32 count, then per entry a u32 id, a u16 length and the token's
/// UTF-8 text. The texts of ids 199,998 to 201,087 in order; where an id is listed twice (o200k's
/// `<|endofprompt|>` and harmony's `<|reserved_200018|>`), the first is kept.
fn read_special(path: &Path) -> Result<Vec<String>> {
    let data = std::fs::read(path).map_err(|e| Error::io(format!("{}", path.display()), e))?;
    let mut r = Reader::new(&data, path);
    let count = r.u32()?;
    let mut texts: Vec<Option<String>> = vec![None; O200K_HARMONY_VOCAB - RANKED];
    for _ in 0..count {
        let id = r.u32()? as usize;
        let len = usize::from(r.u16()?);
        let text = std::str::from_utf8(r.bytes(len)?)
            .map_err(|_| r.bad(&format!("special token {id} is not UTF-8")))?
            .to_string();
        let slot = id
            .checked_sub(RANKED)
            .and_then(|i| texts.get_mut(i))
            .ok_or_else(|| r.bad(&format!("special id {id} outside the vocabulary")))?;
        slot.get_or_insert(text);
    }
    r.end()?;
    texts
        .into_iter()
        .enumerate()
        .map(|(i, t)| t.ok_or_else(|| r.bad(&format!("no special token {}", RANKED + i))))
        .collect()
}

/// The merges of `ranked` as Hugging Face's tiktoken converter derives them: for each token
/// of two or more bytes, every split into two tokens, ordered by the ranks of the halves,
/// and all of them ordered (stably) by the rank of the token they make. Each merge is
/// "left right" in GPT-2's byte-to-unicode characters.
fn merges(ranked: &[Vec<u8>]) -> Result<Vec<String>> {
    let rank: HashMap<&[u8], u32> = ranked
        .iter()
        .enumerate()
        .map(|(i, b)| u32::try_from(i).map(|i| (b.as_slice(), i)))
        .collect::<std::result::Result<_, _>>()
        .map_err(|_| Error::Metadata("too many o200k tokens".into()))?;
    // The ranks come in order, so walking them in order is the stable sort by made token.
    let mut merges = Vec::with_capacity(460_000);
    let mut local: Vec<(u32, u32, usize)> = Vec::new();
    for token in ranked.iter().filter(|t| t.len() >= 2) {
        local.clear();
        for at in 1..token.len() {
            let (left, right) = token.split_at(at);
            if let (Some(&l), Some(&r)) = (rank.get(left), rank.get(right)) {
                local.push((l, r, at));
            }
        }
        local.sort_unstable();
        for &(_, _, at) in &local {
            let (left, right) = token.split_at(at);
            merges.push(format!("{} {}", byte_level(left), byte_level(right)));
        }
    }
    Ok(merges)
}

/// `bytes` in GPT-2's byte-to-unicode characters: printable Latin-1 bytes stand for
/// themselves, the others (controls, space, soft hyphen) for U+0100 onwards in byte order.
fn byte_level(bytes: &[u8]) -> String {
    static TABLE: OnceLock<[char; 256]> = OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let mut table = ['\0'; 256];
        let mut shifted = 256;
        for b in 0..=255u8 {
            table[usize::from(b)] = if printable(b) {
                char::from(b)
            } else {
                shifted += 1;
                char::from_u32(shifted - 1).unwrap_or(char::REPLACEMENT_CHARACTER)
            };
        }
        table
    });
    bytes.iter().map(|&b| table[usize::from(b)]).collect()
}

/// A little-endian reader over one data file, its errors naming the file.
struct Reader<'a> {
    data: &'a [u8],
    at: usize,
    path: &'a Path,
}

impl<'a> Reader<'a> {
    fn new(data: &'a [u8], path: &'a Path) -> Self {
        Self { data, at: 0, path }
    }

    fn bad(&self, what: &str) -> Error {
        Error::Metadata(format!("{}: {what}", self.path.display()))
    }

    fn bytes(&mut self, n: usize) -> Result<&'a [u8]> {
        let data: &'a [u8] = self.data;
        let end = self.at.checked_add(n).filter(|&e| e <= data.len());
        let Some(end) = end else {
            return Err(self.bad(&format!("ends inside a field at byte {}", self.at)));
        };
        let slice = &data[self.at..end];
        self.at = end;
        Ok(slice)
    }

    fn u16(&mut self) -> Result<u16> {
        let b = self.bytes(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Result<u32> {
        let b = self.bytes(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn end(&self) -> Result<()> {
        if self.at == self.data.len() {
            Ok(())
        } else {
            Err(self.bad(&format!(
                "{} bytes after the last entry",
                self.data.len() - self.at
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::byte_level;

    #[test]
    fn bytes_map_to_gpt2_characters() {
        assert_eq!(byte_level(b" hello"), "\u{120}hello");
        assert_eq!(byte_level(b"\n\t"), "\u{10A}\u{109}");
        assert_eq!(
            byte_level(&[0x00, 0x7F, 0xAD, 0xFF]),
            "\u{100}\u{121}\u{143}\u{FF}"
        );
    }
}
