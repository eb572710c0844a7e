//! Loading a GGUF of any family in `crate::model::arch`: hyper-parameters from `{arch}.*`
//! metadata resolved through the family's declaration, weights by llama.cpp's tensor names
//! (`blk.N.attn_q.weight`, `attn_q_norm`, `post_attention_norm`, ...) checked against the
//! shapes the config implies, kept quantized or dequantized to the requested dtype. GGUF llama
//! weights are permuted for interleaved RoPE; the other families keep the halves layout; norm
//! weights are stored as the forward multiplies them (Gemma's `1 + w` is added at conversion).

use std::fs::File;
use std::io::BufReader;
use std::path::Path;

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::QTensor;
use candle_core::{DType, Device, Tensor};

use crate::model::arch::FileFacts;
use crate::model::config::{Architecture, ModelConfig, RopeScaling};
use crate::model::experts::prepared::PreparedExperts;
use crate::model::gguf_assemble::{assemble, Source};
use crate::model::gguf_header::{self, Header};
use crate::model::gguf_keys::{
    as_f32, as_u64, attending_kv_heads, delta_net_shape, expert_facts, longrope, recurrent_layers,
    rope_scaling, window_pattern,
};
use crate::model::gguf_layers;
use crate::model::tokenizer::ModelTokenizer;
use crate::model::ModelWeights;
use crate::model::{gguf_keys, gguf_per_layer};
use crate::{Error, Result};

/// Reads a GGUF header and metadata, with errors that name the file; a tensor no loader
/// takes (a type thicket does not read) is refused by name and type.
pub fn read_content(path: &Path) -> Result<(Content, BufReader<File>)> {
    let (header, reader) = read_header(path)?;
    Ok((header.content, reader))
}

/// `read_content`, with the tensors candle does not read kept aside (MXFP4 experts).
pub fn read_header(path: &Path) -> Result<(Header, BufReader<File>)> {
    let file = File::open(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::MissingFile(path.to_path_buf()),
        _ => Error::io(format!("open {}", path.display()), e),
    })?;
    let mut reader = BufReader::new(file);
    let header = gguf_header::read(&mut reader).map_err(|reason| Error::InvalidGguf {
        path: path.to_path_buf(),
        reason,
    })?;
    if let Some(reason) = header.unreadable() {
        return Err(Error::UnreadableTensor {
            path: path.to_path_buf(),
            reason,
        });
    }
    Ok((header, reader))
}

/// Hyper-parameters from GGUF metadata, with the family's declaration resolved.
pub fn config_from_gguf(content: &Content) -> Result<ModelConfig> {
    let md = &content.metadata;
    let arch_name = md
        .get("general.architecture")
        .and_then(|v| v.to_string().ok())
        .ok_or_else(|| Error::Metadata("missing general.architecture".into()))?;
    let architecture = Architecture::parse(arch_name)?;
    let family = architecture.family();
    let key = |k: &str| format!("{arch_name}.{k}");
    let get = |k: &str| {
        md.get(&key(k))
            .ok_or_else(|| Error::Metadata(format!("missing {}", key(k))))
    };
    let usize_of = |k: &str| -> Result<usize> { Ok(as_u64(get(k)?, &key(k))? as usize) };
    // Present keys must parse; absent optional keys are `None`.
    let optional_usize = |k: &str| -> Result<Option<usize>> {
        md.get(&key(k))
            .map(|v| as_u64(v, &key(k)).map(|x| x as usize))
            .transpose()
    };
    let optional_f32 = |k: &str| -> Result<Option<f32>> {
        md.get(&key(k)).map(|v| as_f32(v, &key(k))).transpose()
    };
    // Granite's µP factors: 0 or absent means none.
    let scale = |k: &str| -> Result<Option<f32>> { Ok(optional_f32(k)?.filter(|&x| x != 0.0)) };
    let hidden_size = usize_of("embedding_length")?;
    let num_heads = usize_of("attention.head_count")?;
    let vocab_size = match usize_of("vocab_size") {
        Ok(v) => v,
        Err(_) => md
            .get("tokenizer.ggml.tokens")
            .and_then(|v| v.to_vec().ok())
            .map(Vec::len)
            .ok_or_else(|| Error::Metadata("missing vocabulary size".into()))?,
    };
    // Qwen3.5's and Qwen3-Next's converters append their multi-token-prediction blocks.
    let block_count = usize_of("block_count")?;
    let mtp = optional_usize("nextn_predict_layers")?.unwrap_or(0);
    if mtp >= block_count {
        return Err(Error::Metadata(format!(
            "{} = {mtp} of {block_count} blocks leaves no decoder",
            key("nextn_predict_layers")
        )));
    }
    if mtp > 0 {
        tracing::info!(
            "skipping the file's {mtp} multi-token-prediction block(s) (not used as a draft \
             source yet)"
        );
    }
    let num_layers = block_count - mtp;
    let (windowed_layers, window_period) = window_pattern(md, &key, num_layers)?;
    let mlp_widths = gguf_layers::mlp_widths(md, &key, num_layers)?;
    let split = match &windowed_layers {
        Some(kinds) => gguf_layers::split_heads(md, &key, kinds)?,
        None => None,
    };
    let kv_heads_per_layer = match md.get(&key("attention.head_count_kv")) {
        Some(Value::Array(list)) if split.is_none() => Some(
            list.iter()
                .map(|v| as_u64(v, &key("attention.head_count_kv")).map(|x| x as usize))
                .collect::<Result<Vec<usize>>>()?,
        ),
        _ => None,
    };
    let num_kv_heads = match (&kv_heads_per_layer, split) {
        (_, Some(split)) => split.kv_heads,
        (Some(list), None) => {
            attending_kv_heads(list, &key("attention.head_count_kv"))?.unwrap_or(num_heads)
        }
        (None, None) => optional_usize("attention.head_count_kv")?.unwrap_or(num_heads),
    };
    let head_dim = match (split, optional_usize("attention.key_length")?) {
        (Some(split), _) => split.head_dim,
        (None, Some(d)) => d,
        (None, None) => {
            optional_usize("rope.dimension_count")?.unwrap_or(hidden_size / num_heads.max(1))
        }
    };
    let global_dim = split.map_or(head_dim, |s| s.global.1);
    if let Some(v) = optional_usize("attention.value_length")?.filter(|_| split.is_none()) {
        if v != head_dim {
            return Err(Error::Metadata(format!(
                "{} is {v} but {} is {head_dim}: value heads of another width are not supported",
                key("attention.value_length"),
                key("attention.key_length")
            )));
        }
    }
    let rotary_dim = match optional_usize("rope.dimension_count")? {
        Some(rot) if rot == global_dim => None,
        Some(rot) if rot > 0 && rot < head_dim && rot.is_multiple_of(2) => Some(rot),
        Some(rot) => {
            return Err(Error::Metadata(format!(
                "{} is {rot} for heads of {head_dim}: it must be even and at most the head",
                key("rope.dimension_count")
            )))
        }
        None => None,
    };
    let facts = FileFacts {
        num_layers,
        hidden_size,
        window: optional_usize("attention.sliding_window")?,
        windowed_layers,
        window_period,
        local_rope_theta: optional_f32("rope.freq_base_swa")?,
        attention_scale: family
            .gguf_residual_query_scale_at
            .contains(&num_layers)
            .then(|| (1.0 / ((hidden_size / num_heads.max(1)) as f64).sqrt()) as f32)
            .or(scale("attention.scale")?),
        attention_softcap: optional_f32("attn_logit_softcapping")?,
        final_softcap: optional_f32("final_logit_softcapping")?,
        rope_scaling: rope_scaling(md, &key)?,
        rotary_dim,
        experts: expert_facts(md, &key, family)?,
        kv_heads_per_layer,
        conv_kernel: optional_usize("shortconv.l_cache")?,
        delta_net: delta_net_shape(md, &key)?,
        recurrent_layers: recurrent_layers(md, &key)?,
        full_attention_interval: optional_usize("full_attention_interval")?,
        // The family's layout: llama.cpp's converters tile Qwen3.5's, keep Qwen3-Next's.
        key_heads_of_values: None,
        no_rope: family.gguf_rope_switch
            && matches!(
                md.get(&key("rope.scaling.finetuned")),
                Some(Value::Bool(false))
            ),
        embedding_scale: scale("embedding_scale")?,
        residual_scale: scale("residual_scale")?,
        logit_scale: scale("logit_scale")?,
        global_heads: split
            .map(|s| s.global)
            .filter(|&g| g != (num_kv_heads, head_dim)),
        proportional_pairs: None,
        shared_kv_layers: optional_usize("attention.shared_kv_layers")?.unwrap_or(0),
        mlp_widths: mlp_widths.clone(),
    };
    let feed_forward = match &mlp_widths {
        Some(widths) => widths.first().copied(),
        None => optional_usize("feed_forward_length")?,
    };
    let intermediate_size = match (&facts.experts, feed_forward) {
        (_, Some(width)) => width,
        // Every layer is a mixture: no dense MLP needs the width.
        (Some(experts), None) => experts.width,
        (None, None) => usize_of("feed_forward_length")?,
    };
    Ok(ModelConfig {
        architecture,
        vocab_size,
        hidden_size,
        intermediate_size,
        num_layers,
        num_heads,
        num_kv_heads,
        head_dim,
        rope_theta: optional_f32("rope.freq_base")?.unwrap_or(10_000.0),
        rope_style: family.gguf_rope_style,
        rms_norm_eps: f64::from(as_f32(
            get("attention.layer_norm_rms_epsilon")?,
            &key("attention.layer_norm_rms_epsilon"),
        )?),
        max_position_embeddings: optional_usize("context_length")?.unwrap_or(4096),
        attention_bias: family.attention_bias,
        variant: family.variant(&facts)?,
    })
}

/// Loads weights and tokenizer from a GGUF. `dtype = None` keeps quantized weights.
pub fn load_gguf(
    path: &Path,
    dtype: Option<DType>,
    device: &Device,
) -> Result<(ModelConfig, ModelWeights, ModelTokenizer)> {
    load_gguf_with(path, dtype, device, None)
}

/// `load_gguf`, mapping a mixture's experts from a file prepared for the SIMD kernels in
/// `prepared_experts` (written there on first use; see `experts::prepared`) where the weights
/// stay quantized on the CPU.
pub fn load_gguf_with(
    path: &Path,
    dtype: Option<DType>,
    device: &Device,
    prepared_experts: Option<&Path>,
) -> Result<(ModelConfig, ModelWeights, ModelTokenizer)> {
    let (header, reader) = read_header(path)?;
    // The family and its keys first: an unsupported model is named as such.
    config_from_gguf(&header.content)?;
    let tokenizer = ModelTokenizer::from_gguf(&header.content)?;
    let (config, weights) = weights_from(path, &header, reader, dtype, device, prepared_experts)?;
    Ok((config, weights, tokenizer))
}

/// Loads config and weights only (a file whose tokenizer is not needed, or absent).
pub fn load_gguf_weights(
    path: &Path,
    dtype: Option<DType>,
    device: &Device,
) -> Result<(ModelConfig, ModelWeights)> {
    load_gguf_weights_with(path, dtype, device, None)
}

/// `load_gguf_weights` with a directory of prepared experts (see `load_gguf_with`).
pub fn load_gguf_weights_with(
    path: &Path,
    dtype: Option<DType>,
    device: &Device,
    prepared_experts: Option<&Path>,
) -> Result<(ModelConfig, ModelWeights)> {
    let (header, reader) = read_header(path)?;
    weights_from(path, &header, reader, dtype, device, prepared_experts)
}

fn weights_from(
    path: &Path,
    header: &Header,
    reader: BufReader<File>,
    dtype: Option<DType>,
    device: &Device,
    prepared_experts: Option<&Path>,
) -> Result<(ModelConfig, ModelWeights)> {
    let content = &header.content;
    let mut config = config_from_gguf(content)?;
    let reader = std::cell::RefCell::new(reader);
    let tensor = |name: &str| -> Result<QTensor> {
        if !content.tensor_infos.contains_key(name) {
            return Err(Error::Metadata(format!(
                "missing tensor {name} in {}",
                path.display()
            )));
        }
        content
            .tensor(&mut *reader.borrow_mut(), name, device)
            .map_err(|e| Error::InvalidGguf {
                path: path.to_path_buf(),
                reason: format!("tensor {name}: {e}"),
            })
    };
    let dense = |t: QTensor| -> Result<Tensor> { Ok(t.dequantize(device)?.to_dtype(DType::F32)?) };

    let declared_longrope = content
        .metadata
        .get(&format!(
            "{}.rope.scaling.type",
            config.architecture.as_str()
        ))
        .and_then(|v| v.to_string().ok())
        .is_some_and(|t| t == "longrope");
    if declared_longrope
        && !content
            .tensor_infos
            .contains_key("rope_factors_long.weight")
    {
        return Err(Error::Metadata(format!(
            "{}: LongRoPE is declared but rope_factors_long.weight is missing",
            path.display()
        )));
    }
    if content
        .tensor_infos
        .contains_key("rope_factors_long.weight")
    {
        config.variant.rope_scaling = longrope(&content.metadata, &config, &|name| {
            Ok(dense(tensor(name)?)?.to_vec1::<f32>()?)
        })?;
    }
    if content.tensor_infos.contains_key("rope_freqs.weight") {
        // Llama 3.1's scaling, as per-frequency divisors; Gemma 4's proportional RoPE, as
        // divisors so large that the trailing pairs do not turn.
        let factors = dense(tensor("rope_freqs.weight")?)?.to_vec1::<f32>()?;
        let (pairs, factors) = gguf_keys::turning_factors(factors)?;
        config.variant.proportional_pairs = pairs;
        config.variant.rope_scaling = match factors.iter().all(|&f| f == 1.0) && pairs.is_some() {
            true => RopeScaling::None,
            false => RopeScaling::Factors(factors),
        };
    }
    let has = |name: &str| header.has(name);
    let ple_width = gguf_per_layer::width(&content.metadata, config.architecture.as_str())?;
    let blocks = |name: &str| {
        header.blocks(&mut *reader.borrow_mut(), name).map(|read| {
            read.map_err(|reason| Error::InvalidGguf {
                path: path.to_path_buf(),
                reason,
            })
        })
    };
    let prepared = match prepared_experts {
        Some(dir) if dtype.is_none() && device.is_cpu() && config.variant.moe.is_some() => {
            PreparedExperts::open_or_prepare(dir, path, header, &mut reader.borrow_mut())
        }
        _ => None,
    };
    let source = Source {
        tensor: &tensor,
        has: &has,
        dense: &dense,
        blocks: &blocks,
        dtype,
        device,
        quantized_tables: dtype.is_none() && device.is_cpu(),
        prepared: prepared.as_ref(),
        per_layer_width: ple_width,
    };
    let weights = assemble(&config, &source)?;
    Ok((config, weights))
}
