//! The two places an encoder's tensors come from, both read under transformers' `BertModel`
//! names: a Hugging Face folder's safetensors (with or without the `bert.` prefix a task head
//! adds) and a GGUF file written by llama.cpp's converter (`token_embd`, `blk.N.attn_q`,
//! `blk.N.layer_output_norm`, `cls` and `cls.output` for a reranker's head), dequantized to
//! f32.

use std::cell::RefCell;
use std::fs::File;
use std::io::BufReader;

use candle_core::quantized::gguf_file::Content;
use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};

use super::bert::TensorSource;
use crate::{Error, Result};

/// A Hugging Face folder's safetensors.
pub struct Safetensors {
    st: MmapedSafetensors,
    prefix: &'static str,
}

impl Safetensors {
    /// Over `st`, whose names carry the `bert.` prefix when the checkpoint has a task head.
    pub fn new(st: MmapedSafetensors) -> Self {
        let prefix = match st.get("bert.embeddings.word_embeddings.weight") {
            Ok(_) => "bert.",
            Err(_) => "",
        };
        Self { st, prefix }
    }
}

impl TensorSource for Safetensors {
    fn tensor(&self, name: &str) -> Result<Tensor> {
        let full = match name.starts_with("classifier.") {
            true => name.to_string(),
            false => format!("{}{name}", self.prefix),
        };
        self.st
            .load(&full, &Device::Cpu)
            .map_err(|e| Error::Metadata(format!("tensor {full}: {e}")))?
            .to_dtype(DType::F32)
            .map_err(Error::from)
    }
}

/// A GGUF file's tensors.
pub struct Gguf {
    content: Content,
    reader: RefCell<BufReader<File>>,
}

impl Gguf {
    /// Over a GGUF's header and its open file.
    pub fn new(content: Content, reader: BufReader<File>) -> Self {
        Self {
            content,
            reader: RefCell::new(reader),
        }
    }
}

/// llama.cpp's name for a tensor transformers names `name`.
pub fn gguf_name(name: &str) -> Option<String> {
    let (stem, suffix) = name.rsplit_once('.')?;
    let mapped = match stem {
        "embeddings.word_embeddings" => "token_embd".to_string(),
        "embeddings.position_embeddings" => "position_embd".to_string(),
        "embeddings.token_type_embeddings" => "token_types".to_string(),
        "embeddings.LayerNorm" => "token_embd_norm".to_string(),
        "pooler.dense" => "cls".to_string(),
        "classifier" => "cls.output".to_string(),
        _ => {
            let rest = stem.strip_prefix("encoder.layer.")?;
            let (layer, part) = rest.split_once('.')?;
            let part = match part {
                "attention.self.query" => "attn_q",
                "attention.self.key" => "attn_k",
                "attention.self.value" => "attn_v",
                "attention.output.dense" => "attn_output",
                "attention.output.LayerNorm" => "attn_output_norm",
                "intermediate.dense" => "ffn_up",
                "output.dense" => "ffn_down",
                "output.LayerNorm" => "layer_output_norm",
                _ => return None,
            };
            format!("blk.{layer}.{part}")
        }
    };
    Some(format!("{mapped}.{suffix}"))
}

impl TensorSource for Gguf {
    fn tensor(&self, name: &str) -> Result<Tensor> {
        let gguf = gguf_name(name)
            .ok_or_else(|| Error::Metadata(format!("no GGUF tensor stands for {name}")))?;
        let mut reader = self.reader.borrow_mut();
        let q = self
            .content
            .tensor(&mut *reader, &gguf, &Device::Cpu)
            .map_err(|e| Error::Metadata(format!("tensor {gguf}: {e}")))?;
        Ok(q.dequantize(&Device::Cpu)?.to_dtype(DType::F32)?)
    }
}

#[cfg(test)]
mod tests {
    use super::gguf_name;

    #[test]
    fn transformers_names_map_onto_llama_cpp_s() {
        let cases = [
            ("embeddings.word_embeddings.weight", "token_embd.weight"),
            ("embeddings.LayerNorm.bias", "token_embd_norm.bias"),
            (
                "encoder.layer.3.attention.self.key.weight",
                "blk.3.attn_k.weight",
            ),
            (
                "encoder.layer.0.attention.output.LayerNorm.weight",
                "blk.0.attn_output_norm.weight",
            ),
            ("encoder.layer.11.output.dense.bias", "blk.11.ffn_down.bias"),
            (
                "encoder.layer.5.output.LayerNorm.bias",
                "blk.5.layer_output_norm.bias",
            ),
            ("pooler.dense.weight", "cls.weight"),
            ("classifier.bias", "cls.output.bias"),
        ];
        for (hf, gguf) in cases {
            assert_eq!(gguf_name(hf).as_deref(), Some(gguf), "{hf}");
        }
        assert_eq!(gguf_name("encoder.layer.0.crossattention.weight"), None);
    }
}
