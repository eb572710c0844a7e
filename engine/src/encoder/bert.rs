//! `BertEncoder`: a BERT encoder's weights and its forward over a packed batch. Every
//! sequence's tokens sit in one `[tokens, hidden]` matrix, so each projection is one matmul
//! for the whole batch with no padding; attention is bidirectional within a sequence and never
//! across, computed row by row on the CPU; nothing is cached between calls. A cross-encoder
//! adds BERT's pooler (`tanh` of a projection of `[CLS]`) and its classifier.

use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};
use rayon::prelude::*;

use super::config::{EncoderActivation, EncoderConfig, EncoderTask};
use crate::model::linear::Linear;
use crate::{Error, Result};

/// One input: its token ids and, for a pair, each token's segment (0 or 1).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EncoderInput {
    /// Token ids, special tokens included.
    pub ids: Vec<u32>,
    /// Segment of each token (empty: all 0).
    pub types: Vec<u32>,
}

struct Norm {
    weight: Tensor,
    bias: Tensor,
}

struct Layer {
    /// Query, key and value projections stacked: `[3 hidden, hidden]`.
    qkv: Linear,
    out: Linear,
    attention_norm: Norm,
    up: Linear,
    down: Linear,
    output_norm: Norm,
}

struct Classifier {
    pooler: Linear,
    classifier: Linear,
}

/// A loaded BERT encoder.
pub struct BertEncoder {
    config: EncoderConfig,
    words: Tensor,
    positions: Tensor,
    types: Option<Tensor>,
    embedding_norm: Norm,
    layers: Vec<Layer>,
    classifier: Option<Classifier>,
}

impl std::fmt::Debug for BertEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BertEncoder")
            .field("config", &self.config)
            .field("classifier", &self.classifier.is_some())
            .finish()
    }
}

/// Reads tensors under BERT's names, with or without the `bert.` prefix a task head adds.
struct Names<'a> {
    st: &'a MmapedSafetensors,
    prefix: &'static str,
}

impl Names<'_> {
    fn tensor(&self, name: &str) -> Result<Tensor> {
        let full = format!("{}{name}", self.prefix);
        self.raw(&full)
    }

    fn raw(&self, name: &str) -> Result<Tensor> {
        self.st
            .load(name, &Device::Cpu)
            .map_err(|e| Error::Metadata(format!("tensor {name}: {e}")))?
            .to_dtype(DType::F32)
            .map_err(Error::from)
    }

    fn norm(&self, name: &str) -> Result<Norm> {
        Ok(Norm {
            weight: self.tensor(&format!("{name}.weight"))?,
            bias: self.tensor(&format!("{name}.bias"))?,
        })
    }

    fn linear(&self, name: &str, dtype: Option<DType>) -> Result<Linear> {
        Linear::from_dense(
            self.tensor(&format!("{name}.weight"))?,
            Some(self.tensor(&format!("{name}.bias"))?),
            dtype,
        )
    }
}

impl BertEncoder {
    /// Loads the weights of `config` from `st`; dense weights in `dtype`, or Q8_0 where
    /// `dtype` is `None`.
    pub fn load(
        st: &MmapedSafetensors,
        config: EncoderConfig,
        task: EncoderTask,
        dtype: Option<DType>,
    ) -> Result<Self> {
        let prefix = if st.get("bert.embeddings.word_embeddings.weight").is_ok() {
            "bert."
        } else {
            ""
        };
        let names = Names { st, prefix };
        let words = names.tensor("embeddings.word_embeddings.weight")?;
        let positions = names.tensor("embeddings.position_embeddings.weight")?;
        let types = match config.type_vocab_size {
            0 => None,
            _ => Some(names.tensor("embeddings.token_type_embeddings.weight")?),
        };
        let expect = |t: &Tensor, rows: usize, what: &str| -> Result<()> {
            match t.dims() {
                [r, h] if *r >= rows && *h == config.hidden_size => Ok(()),
                dims => Err(Error::Metadata(format!(
                    "{what} has shape {dims:?}, expected [{rows}, {}]",
                    config.hidden_size
                ))),
            }
        };
        expect(&words, config.vocab_size, "the word embeddings")?;
        expect(&positions, config.max_positions, "the position embeddings")?;
        let mut layers = Vec::with_capacity(config.num_layers);
        for i in 0..config.num_layers {
            let at = |s: &str| format!("encoder.layer.{i}.{s}");
            let part = |s: &str| names.tensor(&at(s));
            let qkv_weight = Tensor::cat(
                &[
                    part("attention.self.query.weight")?,
                    part("attention.self.key.weight")?,
                    part("attention.self.value.weight")?,
                ],
                0,
            )?;
            let qkv_bias = Tensor::cat(
                &[
                    part("attention.self.query.bias")?,
                    part("attention.self.key.bias")?,
                    part("attention.self.value.bias")?,
                ],
                0,
            )?;
            layers.push(Layer {
                qkv: Linear::from_dense(qkv_weight, Some(qkv_bias), dtype)?,
                out: names.linear(&at("attention.output.dense"), dtype)?,
                attention_norm: names.norm(&at("attention.output.LayerNorm"))?,
                up: names.linear(&at("intermediate.dense"), dtype)?,
                down: names.linear(&at("output.dense"), dtype)?,
                output_norm: names.norm(&at("output.LayerNorm"))?,
            });
        }
        let classifier = match task {
            EncoderTask::Embed(_) => None,
            EncoderTask::Classify { labels } => {
                let classifier = Linear::from_dense(
                    names.raw("classifier.weight")?,
                    Some(names.raw("classifier.bias")?),
                    Some(DType::F32),
                )?;
                if classifier.rows() != labels {
                    return Err(Error::Metadata(format!(
                        "the classifier gives {} logits, the config names {labels} labels",
                        classifier.rows()
                    )));
                }
                Some(Classifier {
                    pooler: names.linear("pooler.dense", Some(DType::F32))?,
                    classifier,
                })
            }
        };
        Ok(Self {
            embedding_norm: names.norm("embeddings.LayerNorm")?,
            config,
            words,
            positions,
            types,
            layers,
            classifier,
        })
    }

    /// The geometry.
    pub fn config(&self) -> &EncoderConfig {
        &self.config
    }

    /// Bytes of weights.
    pub fn weight_bytes(&self) -> usize {
        let tables = [
            Some(&self.words),
            Some(&self.positions),
            self.types.as_ref(),
        ]
        .into_iter()
        .flatten()
        .map(|t| t.elem_count() * 4)
        .sum::<usize>();
        tables
            + self
                .layers
                .iter()
                .map(|l| {
                    l.qkv.weight_bytes()
                        + l.out.weight_bytes()
                        + l.up.weight_bytes()
                        + l.down.weight_bytes()
                })
                .sum::<usize>()
    }

    /// Checks one input against the tables: ids inside the vocabulary, segments inside the
    /// token types, no more tokens than positions.
    pub fn check(&self, input: &EncoderInput) -> std::result::Result<(), String> {
        if input.ids.is_empty() {
            return Err("an input has no tokens".into());
        }
        if input.ids.len() > self.config.max_positions {
            return Err(format!(
                "an input has {} tokens; this model reads at most {}",
                input.ids.len(),
                self.config.max_positions
            ));
        }
        if let Some(bad) = input
            .ids
            .iter()
            .find(|&&t| t as usize >= self.config.vocab_size)
        {
            return Err(format!(
                "token id {bad} is outside the vocabulary of {}",
                self.config.vocab_size
            ));
        }
        let types = self.config.type_vocab_size.max(1);
        if let Some(bad) = input.types.iter().find(|&&t| t as usize >= types) {
            return Err(format!("token type {bad} is outside the {types} types"));
        }
        if !input.types.is_empty() && input.types.len() != input.ids.len() {
            return Err("token types do not match the tokens".into());
        }
        Ok(())
    }

    /// The last layer's state of every token of `inputs`, packed: `[sum of lengths, hidden]`.
    /// Inputs must have passed [`BertEncoder::check`].
    pub fn forward(&self, inputs: &[EncoderInput]) -> Result<Tensor> {
        let spans = spans(inputs);
        let total = spans.last().map_or(0, |&(start, len)| start + len);
        if total == 0 {
            return Err(Error::InvalidBatch("no tokens to encode".into()));
        }
        let ids: Vec<u32> = inputs.iter().flat_map(|i| i.ids.iter().copied()).collect();
        let positions: Vec<u32> = spans.iter().flat_map(|&(_, len)| 0..len as u32).collect();
        let device = Device::Cpu;
        let mut x = self
            .words
            .index_select(&Tensor::new(ids.as_slice(), &device)?, 0)?
            .add(
                &self
                    .positions
                    .index_select(&Tensor::new(positions.as_slice(), &device)?, 0)?,
            )?;
        if let Some(table) = &self.types {
            let types: Vec<u32> = inputs
                .iter()
                .flat_map(|i| match i.types.is_empty() {
                    true => vec![0; i.ids.len()],
                    false => i.types.clone(),
                })
                .collect();
            x = x.add(&table.index_select(&Tensor::new(types.as_slice(), &device)?, 0)?)?;
        }
        let eps = self.config.layer_norm_eps as f32;
        let norm = |x: &Tensor, n: &Norm| -> Result<Tensor> {
            Ok(candle_nn::ops::layer_norm(
                &x.contiguous()?,
                &n.weight,
                &n.bias,
                eps,
            )?)
        };
        x = norm(&x, &self.embedding_norm)?;
        for layer in &self.layers {
            let qkv = layer.qkv.forward(&x)?.flatten_all()?.to_vec1::<f32>()?;
            let context = attention(&qkv, &spans, &self.config);
            let context = Tensor::from_vec(context, (total, self.config.hidden_size), &device)?;
            x = norm(
                &layer.out.forward(&context)?.add(&x)?,
                &layer.attention_norm,
            )?;
            let up = layer.up.forward(&x)?;
            let up = match self.config.activation {
                EncoderActivation::Gelu => up.gelu_erf()?,
                EncoderActivation::GeluTanh => up.gelu()?,
                EncoderActivation::Relu => up.relu()?,
            };
            x = norm(&layer.down.forward(&up)?.add(&x)?, &layer.output_norm)?;
        }
        Ok(x)
    }

    /// A cross-encoder's logits for each input (`[inputs, labels]`) from the packed states
    /// [`BertEncoder::forward`] gave; `None` for a model without a classifier.
    pub fn classify(&self, states: &Tensor, inputs: &[EncoderInput]) -> Result<Option<Tensor>> {
        let Some(head) = &self.classifier else {
            return Ok(None);
        };
        let firsts: Vec<u32> = spans(inputs).iter().map(|&(s, _)| s as u32).collect();
        let cls = states.index_select(&Tensor::new(firsts.as_slice(), &Device::Cpu)?, 0)?;
        let pooled = head.pooler.forward(&cls)?.tanh()?;
        Ok(Some(head.classifier.forward(&pooled)?))
    }
}

/// `(first row, length)` of each input in the packed matrix.
pub fn spans(inputs: &[EncoderInput]) -> Vec<(usize, usize)> {
    let mut start = 0;
    inputs
        .iter()
        .map(|i| {
            let span = (start, i.ids.len());
            start += i.ids.len();
            span
        })
        .collect()
}

/// Bidirectional attention within each span: `qkv` holds each row's query, key and value
/// (`[rows, 3 hidden]`); returns `[rows, hidden]`.
fn attention(qkv: &[f32], spans: &[(usize, usize)], config: &EncoderConfig) -> Vec<f32> {
    let hidden = config.hidden_size;
    let d = config.head_dim();
    let scale = 1.0 / (d as f32).sqrt();
    let rows: usize = spans.iter().map(|s| s.1).sum();
    let mut out = vec![0f32; rows * hidden];
    let owner: Vec<(usize, usize)> = spans
        .iter()
        .flat_map(|&span| std::iter::repeat_n(span, span.1))
        .collect();
    out.par_chunks_mut(hidden).enumerate().for_each_init(
        Vec::new,
        |scores: &mut Vec<f32>, (row, out)| {
            let (start, len) = owner[row];
            let query = &qkv[row * 3 * hidden..row * 3 * hidden + hidden];
            for head in 0..config.num_heads {
                let q = &query[head * d..(head + 1) * d];
                scores.clear();
                let mut max = f32::NEG_INFINITY;
                for key_row in start..start + len {
                    let base = key_row * 3 * hidden + hidden + head * d;
                    let s = dot(q, &qkv[base..base + d]) * scale;
                    max = max.max(s);
                    scores.push(s);
                }
                let mut sum = 0.0;
                for s in scores.iter_mut() {
                    *s = (*s - max).exp();
                    sum += *s;
                }
                let o = &mut out[head * d..(head + 1) * d];
                for (j, p) in scores.iter().enumerate() {
                    let base = (start + j) * 3 * hidden + 2 * hidden + head * d;
                    let w = p / sum;
                    for (o, v) in o.iter_mut().zip(&qkv[base..base + d]) {
                        *o += w * v;
                    }
                }
            }
        },
    );
    out
}

/// A dot product in eight lanes (vectorizes).
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ac
        .remainder()
        .iter()
        .zip(bc.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ac.zip(bc) {
        for k in 0..8 {
            lanes[k] += x[k] * y[k];
        }
    }
    lanes.iter().sum::<f32>() + tail
}
