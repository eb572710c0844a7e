//! Loading a llama / qwen2 GGUF: hyper-parameters from `{arch}.*` metadata, weights by
//! llama.cpp's tensor names (`blk.N.attn_q.weight`, ...), kept quantized or dequantized to
//! the requested dtype. GGUF llama weights are permuted for interleaved RoPE; qwen2 keeps the
//! halves layout.

use std::fs::File;
use std::io::BufReader;
use std::path::Path;

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::QTensor;
use candle_core::{DType, Device, Tensor};

use crate::model::config::{Architecture, ModelConfig, RopeStyle};
use crate::model::linear::Linear;
use crate::model::tokenizer::ModelTokenizer;
use crate::model::{LayerWeights, ModelWeights};
use crate::{Error, Result};

/// Reads a GGUF header and metadata, with errors that name the file.
pub fn read_content(path: &Path) -> Result<(Content, BufReader<File>)> {
    let file = File::open(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::MissingFile(path.to_path_buf()),
        _ => Error::io(format!("open {}", path.display()), e),
    })?;
    let mut reader = BufReader::new(file);
    let content = Content::read(&mut reader).map_err(|e| Error::InvalidGguf {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    Ok((content, reader))
}

/// Hyper-parameters from GGUF metadata.
pub fn config_from_gguf(content: &Content) -> Result<ModelConfig> {
    let md = &content.metadata;
    let arch_name = md
        .get("general.architecture")
        .and_then(|v| v.to_string().ok())
        .ok_or_else(|| Error::Metadata("missing general.architecture".into()))?;
    let architecture = Architecture::parse(arch_name)?;
    let key = |k: &str| format!("{arch_name}.{k}");
    let get = |k: &str| {
        md.get(&key(k))
            .ok_or_else(|| Error::Metadata(format!("missing {}", key(k))))
    };
    let usize_of = |k: &str| -> Result<usize> { Ok(as_u64(get(k)?, &key(k))? as usize) };
    let hidden_size = usize_of("embedding_length")?;
    let num_heads = usize_of("attention.head_count")?;
    let num_kv_heads = usize_of("attention.head_count_kv").unwrap_or(num_heads);
    let head_dim = usize_of("rope.dimension_count").unwrap_or(hidden_size / num_heads.max(1));
    let vocab_size = match usize_of("vocab_size") {
        Ok(v) => v,
        Err(_) => md
            .get("tokenizer.ggml.tokens")
            .and_then(|v| v.to_vec().ok())
            .map(Vec::len)
            .ok_or_else(|| Error::Metadata("missing vocabulary size".into()))?,
    };
    Ok(ModelConfig {
        architecture,
        vocab_size,
        hidden_size,
        intermediate_size: usize_of("feed_forward_length")?,
        num_layers: usize_of("block_count")?,
        num_heads,
        num_kv_heads,
        head_dim,
        rope_theta: get("rope.freq_base")
            .and_then(|v| as_f32(v, "rope.freq_base"))
            .unwrap_or(10_000.0),
        rope_style: match architecture {
            Architecture::Llama => RopeStyle::Interleaved,
            Architecture::Qwen2 => RopeStyle::Halves,
        },
        rms_norm_eps: f64::from(as_f32(get("attention.layer_norm_rms_epsilon")?, "rms eps")?),
        max_position_embeddings: usize_of("context_length").unwrap_or(4096),
        attention_bias: architecture == Architecture::Qwen2,
    })
}

/// Loads weights and tokenizer from a GGUF. `dtype = None` keeps quantized weights.
pub fn load_gguf(
    path: &Path,
    dtype: Option<DType>,
    device: &Device,
) -> Result<(ModelConfig, ModelWeights, ModelTokenizer)> {
    let (content, mut reader) = read_content(path)?;
    let config = config_from_gguf(&content)?;
    let tokenizer = ModelTokenizer::from_gguf(&content)?;
    let mut tensor = |name: &str| -> Result<QTensor> {
        if !content.tensor_infos.contains_key(name) {
            return Err(Error::Metadata(format!(
                "missing tensor {name} in {}",
                path.display()
            )));
        }
        content
            .tensor(&mut reader, name, device)
            .map_err(|e| Error::InvalidGguf {
                path: path.to_path_buf(),
                reason: format!("tensor {name}: {e}"),
            })
    };
    let dense = |t: QTensor| -> Result<Tensor> { Ok(t.dequantize(device)?.to_dtype(DType::F32)?) };

    let embedding_q = tensor("token_embd.weight")?;
    let embedding = embedding_q.dequantize(device)?.to_dtype(DType::F32)?;
    let final_norm = dense(tensor("output_norm.weight")?)?;
    let lm_head_q = if content.tensor_infos.contains_key("output.weight") {
        tensor("output.weight")?
    } else {
        embedding_q
    };
    let lm_head = Linear::from_qtensor(lm_head_q, None, dtype)?;

    let mut layers = Vec::with_capacity(config.num_layers);
    for i in 0..config.num_layers {
        let p = format!("blk.{i}");
        let mut proj = |name: &str, biased: bool| -> Result<Linear> {
            let bias = if biased {
                Some(dense(tensor(&format!("{p}.{name}.bias"))?)?)
            } else {
                None
            };
            Linear::from_qtensor(tensor(&format!("{p}.{name}.weight"))?, bias, dtype)
        };
        let bias = config.attention_bias;
        let q = proj("attn_q", bias)?;
        let k = proj("attn_k", bias)?;
        let v = proj("attn_v", bias)?;
        let o = proj("attn_output", false)?;
        let gate = proj("ffn_gate", false)?;
        let up = proj("ffn_up", false)?;
        let down = proj("ffn_down", false)?;
        layers.push(LayerWeights {
            attn_norm: dense(tensor(&format!("{p}.attn_norm.weight"))?)?,
            q,
            k,
            v,
            o,
            mlp_norm: dense(tensor(&format!("{p}.ffn_norm.weight"))?)?,
            gate,
            up,
            down,
        });
    }
    let weights = ModelWeights {
        embedding,
        layers,
        final_norm,
        lm_head,
    };
    Ok((config, weights, tokenizer))
}

fn as_u64(v: &Value, key: &str) -> Result<u64> {
    let r = match v {
        Value::U8(x) => Ok(u64::from(*x)),
        Value::U16(x) => Ok(u64::from(*x)),
        Value::U32(x) => Ok(u64::from(*x)),
        Value::U64(x) => Ok(*x),
        Value::I32(x) => u64::try_from(*x).map_err(|_| ()),
        Value::I64(x) => u64::try_from(*x).map_err(|_| ()),
        _ => Err(()),
    };
    r.map_err(|_| Error::Metadata(format!("{key} is not a non-negative integer")))
}

fn as_f32(v: &Value, key: &str) -> Result<f32> {
    match v {
        Value::F32(x) => Ok(*x),
        Value::F64(x) => Ok(*x as f32),
        _ => Err(Error::Metadata(format!("{key} is not a float"))),
    }
}
