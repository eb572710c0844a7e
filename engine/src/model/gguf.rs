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
use crate::model::config::LayerMixer;
use crate::model::config::{Architecture, ModelConfig, RopeScaling};
use crate::model::experts::load::GgufTensors;
use crate::model::experts::prepared::PreparedExperts;
use crate::model::gguf_header::{self, Header};
use crate::model::gguf_keys::{
    as_f32, as_u64, attending_kv_heads, delta_net_shape, expert_facts, longrope, recurrent_layers,
    rope_scaling, window_pattern,
};
use crate::model::gguf_layers;
use crate::model::linear::Linear;
use crate::model::shapes::{deal_quantized, split_quantized, unfused, Role, Shapes};
use crate::model::tokenizer::ModelTokenizer;
use crate::model::{gguf_keys, gguf_per_layer};
use crate::model::{
    AttentionWeights, DeltaNetWeights, DenseMlp, Embedding, LayerWeights, Mamba2Weights, Mlp,
    ModelWeights, ShortConvWeights, TokenMixer,
};
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

    let embedding_q = tensor("token_embd.weight")?;
    // Kept in its blocks where the weights stay quantized on the CPU; dense otherwise.
    let embedding = if dtype.is_none() && device.is_cpu() {
        Embedding::Quantized(std::sync::Arc::new(tensor("token_embd.weight")?))
    } else {
        Embedding::Dense(embedding_q.dequantize(device)?.to_dtype(DType::F32)?)
    };
    // LFM2's converter names the final norm after the embedding.
    let final_norm = match content.tensor_infos.contains_key("token_embd_norm.weight") {
        true if !content.tensor_infos.contains_key("output_norm.weight") => {
            dense(tensor("token_embd_norm.weight")?)?
        }
        _ => dense(tensor("output_norm.weight")?)?,
    };
    let lm_head_q = if content.tensor_infos.contains_key("output.weight") {
        tensor("output.weight")?
    } else {
        embedding_q
    };
    let lm_head = Linear::from_qtensor(lm_head_q, None, dtype)?;
    let family = config.architecture.family();
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
    let parts = gguf_per_layer::Reader {
        tensor: &tensor,
        has: &has,
        dense: &dense,
        dtype,
        quantized_tables: dtype.is_none() && device.is_cpu(),
    };
    let ple_width = gguf_per_layer::width(&content.metadata, config.architecture.as_str())?;
    let per_layer = gguf_per_layer::per_layer_embedding(&parts, &config, ple_width)?;
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
    let expert_tensors = GgufTensors {
        read: &tensor,
        has: &has,
        blocks: &blocks,
        dtype,
        device,
        prepared: prepared.as_ref(),
    };

    let mut layers = Vec::with_capacity(config.num_layers);
    for i in 0..config.num_layers {
        let p = format!("blk.{i}");
        let shapes = Shapes::of_layer(&config, i);
        let proj = |name: &str, role: Role, biased: bool| -> Result<Linear> {
            let bias = if biased {
                Some(dense(tensor(&format!("{p}.{name}.bias"))?)?)
            } else {
                None
            };
            let full = format!("{p}.{name}.weight");
            let weight = tensor(&full)?;
            shapes.check(&full, role, weight.shape().dims())?;
            Linear::from_qtensor(weight, bias, dtype)
        };
        let bias = config.attention_bias;
        let norm = |name: &str, role: Role| -> Result<Tensor> {
            let full = format!("{p}.{name}.weight");
            let t = dense(tensor(&full)?)?;
            shapes.check(&full, role, t.dims())?;
            Ok(t)
        };
        let attends = config.layer_mixer(i) == LayerMixer::Attention;
        let (mixer, mlp): (Box<dyn TokenMixer>, Mlp) = if family.fused_projections {
            let fused = |name: &str, role: Role| -> Result<Vec<Linear>> {
                let full = format!("{p}.{name}.weight");
                let weight = tensor(&full)?;
                shapes.check(&full, role, weight.shape().dims())?;
                split_quantized(&weight, &shapes.parts(role))?
                    .into_iter()
                    .map(|part| Linear::from_qtensor(part, None, dtype))
                    .collect()
            };
            let qkv = fused("attn_qkv", Role::Qkv)?;
            let gate_up = fused("ffn_up", Role::GateUp)?;
            let (q, k, v, gate, up) = unfused(qkv, gate_up)?;
            let down = proj("ffn_down", Role::Down, false)?;
            let o = proj("attn_output", Role::O, false)?;
            let attention = AttentionWeights {
                qk_norm: None,
                q,
                k,
                v,
                o,
                output_gate: None,
                sinks: None,
            };
            (Box::new(attention), Mlp::Dense(DenseMlp { gate, up, down }))
        } else {
            let mlp = match &config.variant.moe {
                Some(moe) if moe.is_sparse(i) => {
                    let mut mixture = expert_tensors.mixture(&p, moe, config.hidden_size)?;
                    gguf_per_layer::place_beside(&parts, &config, (&p, i), &mut mixture)?;
                    Mlp::Experts(Box::new(mixture))
                }
                _ => Mlp::Dense(DenseMlp {
                    gate: proj("ffn_gate", Role::Up, false)?,
                    up: proj("ffn_up", Role::Up, false)?,
                    down: proj("ffn_down", Role::Down, false)?,
                }),
            };
            let mixer: Box<dyn TokenMixer> = if let Some(source) = config.layer_attention(i).kv_from
            {
                Box::new(gguf_per_layer::shared_attention(
                    &parts,
                    &config,
                    (&p, i, source),
                )?)
            } else if attends {
                let qk_norm = if config.variant.qk_norm {
                    Some((
                        norm("attn_q_norm", Role::HeadNorm)?,
                        norm("attn_k_norm", Role::HeadNorm)?,
                    ))
                } else {
                    None
                };
                let linear = |t: QTensor| Linear::from_qtensor(t, None, dtype);
                let fused_qkv = format!("{p}.attn_qkv.weight");
                let (q, k, v, output_gate) = match config.variant.gated_attention {
                    // Each head's query and gate, then keys and values, in one tensor.
                    true if has(&fused_qkv) => {
                        let weight = tensor(&fused_qkv)?;
                        let kv = config.kv_row_width();
                        let parts = [2 * config.attention_width(), kv, kv];
                        let [qg, k, v] = <[QTensor; 3]>::try_from(split_quantized(
                            &weight, &parts,
                        )?)
                        .map_err(|_| Error::Metadata(format!("{fused_qkv} split wrongly")))?;
                        let [q, gate] = deal_quantized(&qg, config.head_dim)?;
                        (linear(q)?, linear(k)?, linear(v)?, Some(linear(gate)?))
                    }
                    true => {
                        let full = format!("{p}.attn_q.weight");
                        let weight = tensor(&full)?;
                        shapes.check(&full, Role::GatedQ, weight.shape().dims())?;
                        let [q, gate] = deal_quantized(&weight, config.head_dim)?;
                        let (k, v) = (
                            proj("attn_k", Role::Kv, bias)?,
                            proj("attn_v", Role::Kv, bias)?,
                        );
                        (linear(q)?, k, v, Some(linear(gate)?))
                    }
                    false => {
                        let k = proj("attn_k", Role::Kv, bias)?;
                        // Gemma 4's global layers of 26B and 31B read their keys' projection
                        // as values (which are then normed, not rotated).
                        let v = match has(&format!("{p}.attn_v.weight")) {
                            false if config.variant.value_norm => k.clone(),
                            _ => proj("attn_v", Role::Kv, bias)?,
                        };
                        (proj("attn_q", Role::Q, bias)?, k, v, None)
                    }
                };
                // gpt-oss: a bias on the output projection, and a sink logit per query head.
                let o_bias = has(&format!("{p}.attn_output.bias"));
                let sinks_name = format!("{p}.attn_sinks.weight");
                let sinks = match has(&sinks_name) {
                    true => {
                        let values = dense(tensor(&sinks_name)?)?
                            .flatten_all()?
                            .to_vec1::<f32>()?;
                        if values.len() != config.num_heads {
                            return Err(Error::Metadata(format!(
                                "tensor {sinks_name} holds {} sinks for {} query heads",
                                values.len(),
                                config.num_heads
                            )));
                        }
                        Some(values)
                    }
                    false => None,
                };
                Box::new(AttentionWeights {
                    qk_norm,
                    q,
                    k,
                    v,
                    o: proj("attn_output", Role::O, o_bias)?,
                    output_gate,
                    sinks,
                })
            } else if let LayerMixer::DeltaNet(shape) = config.layer_mixer(i) {
                Box::new(DeltaNetWeights::new(
                    shape,
                    expert_tensors.delta_net(&p, shape, &shapes)?,
                )?)
            } else if let LayerMixer::Mamba2(shape) = config.layer_mixer(i) {
                Box::new(Mamba2Weights::new(
                    shape,
                    expert_tensors.mamba2(&p, shape, &shapes)?,
                )?)
            } else {
                let conv = dense(tensor(&format!("{p}.shortconv.conv.weight"))?)?;
                let in_proj = proj("shortconv.in_proj", Role::ConvIn, false)?;
                let out_proj = proj("shortconv.out_proj", Role::ConvOut, false)?;
                let h = config.hidden_size;
                Box::new(ShortConvWeights::new(in_proj, &conv, out_proj, h)?)
            };
            (mixer, mlp)
        };
        let post_norms = if config.variant.post_norms {
            Some((
                norm("post_attention_norm", Role::Norm)?,
                norm("post_ffw_norm", Role::Norm)?,
            ))
        } else {
            None
        };
        let width = (ple_width > 0).then_some(ple_width);
        let (per_layer_input, output_scale) =
            gguf_per_layer::block_parts(&parts, &p, config.hidden_size, width)?;
        layers.push(LayerWeights {
            attn_norm: norm("attn_norm", Role::Norm)?,
            post_norms,
            mixer,
            mlp_norm: match has(&format!("{p}.ffn_norm.weight")) {
                true => norm("ffn_norm", Role::Norm)?,
                // Qwen3.5's converter names the norm before the MLP after the attention.
                false => norm("post_attention_norm", Role::Norm)?,
            },
            mlp,
            per_layer_input,
            output_scale,
        });
    }
    let weights = ModelWeights {
        per_layer,
        embedding,
        layers,
        final_norm,
        lm_head,
    };
    Ok((config, weights))
}
