//! `BertEncoder`: a BERT encoder's weights and its forward over a packed batch. Every
//! sequence's tokens sit in one `[tokens, hidden]` matrix, so each projection is one matmul
//! for the whole batch with no padding (f32 weights packed once for `cpu::sgemm`, or any
//! `Linear` for the other dtypes); attention is bidirectional within a sequence and never
//! across, computed row by row; the norms and GELU run row by row on the team's workers, and
//! nothing is cached between calls. A cross-encoder adds BERT's pooler (`tanh` of a projection
//! of `[CLS]`) and its classifier.

use candle_core::{DType, Device, Tensor};

use super::config::{EncoderActivation, EncoderConfig, EncoderTask};
use crate::cpu::reduce::dot;
use crate::cpu::sgemm::PackedF32;
use crate::cpu::silu::{gelu_erf, gelu_tanh};
use crate::cpu::softmax::softmax_in_place;
use crate::cpu::team::{self, Disjoint};
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
    weight: Vec<f32>,
    bias: Vec<f32>,
}

/// One projection: f32 packed for `sgemm`, or a `Linear` (Q8_0, f16, bf16).
enum Projection {
    Packed(PackedF32),
    Linear(Linear, usize),
}

impl Projection {
    fn new(weight: Tensor, bias: Tensor, dtype: Option<DType>) -> Result<Self> {
        let (n, k) = weight.dims2()?;
        Ok(match dtype {
            Some(DType::F32) => Self::Packed(PackedF32::pack(
                &weight.flatten_all()?.to_vec1::<f32>()?,
                n,
                k,
                Some(&bias.to_vec1::<f32>()?),
            )),
            _ => Self::Linear(Linear::from_dense(weight, Some(bias), dtype)?, k),
        })
    }

    fn rows(&self) -> usize {
        match self {
            Self::Packed(p) => p.rows(),
            Self::Linear(l, _) => l.rows(),
        }
    }

    fn weight_bytes(&self) -> usize {
        match self {
            Self::Packed(p) => p.bytes(),
            Self::Linear(l, _) => l.weight_bytes(),
        }
    }

    /// `out = x W^T + b` for the `rows` rows of `x`; `out` is resized to fit.
    fn forward(&self, x: &[f32], rows: usize, out: &mut Vec<f32>) -> Result<()> {
        out.resize(rows * self.rows(), 0.0);
        match self {
            Self::Packed(p) => p.matmul(x, rows, out),
            Self::Linear(l, k) => {
                let input = Tensor::from_slice(&x[..rows * k], (rows, *k), &Device::Cpu)?;
                out.copy_from_slice(&l.forward(&input)?.flatten_all()?.to_vec1::<f32>()?);
            }
        }
        Ok(())
    }
}

struct Layer {
    /// Query, key and value projections stacked: `[3 hidden, hidden]`.
    qkv: Projection,
    out: Projection,
    attention_norm: Norm,
    up: Projection,
    down: Projection,
    output_norm: Norm,
}

struct Classifier {
    pooler: Projection,
    classifier: Projection,
}

/// A loaded BERT encoder.
pub struct BertEncoder {
    config: EncoderConfig,
    words: Vec<f32>,
    positions: Vec<f32>,
    types: Option<Vec<f32>>,
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

/// Where a checkpoint's tensors are read from, by their names in transformers' `BertModel`
/// (`embeddings.word_embeddings.weight`, `encoder.layer.0.attention.self.query.bias`, ...;
/// `classifier.weight` for a cross-encoder's head), in f32.
pub trait TensorSource {
    /// The tensor named `name`, in f32.
    fn tensor(&self, name: &str) -> Result<Tensor>;
}

struct Names<'a> {
    source: &'a dyn TensorSource,
}

impl Names<'_> {
    fn tensor(&self, name: &str) -> Result<Tensor> {
        self.source.tensor(name)
    }

    fn raw(&self, name: &str) -> Result<Tensor> {
        self.source.tensor(name)
    }

    fn norm(&self, name: &str) -> Result<Norm> {
        Ok(Norm {
            weight: self.tensor(&format!("{name}.weight"))?.to_vec1::<f32>()?,
            bias: self.tensor(&format!("{name}.bias"))?.to_vec1::<f32>()?,
        })
    }

    fn linear(&self, name: &str, dtype: Option<DType>) -> Result<Projection> {
        Projection::new(
            self.tensor(&format!("{name}.weight"))?,
            self.tensor(&format!("{name}.bias"))?,
            dtype,
        )
    }
}

fn table(t: &Tensor) -> Result<Vec<f32>> {
    Ok(t.flatten_all()?.to_vec1::<f32>()?)
}

impl BertEncoder {
    /// Loads the weights of `config` from `source`; projections in `dtype` (f32: packed for
    /// `cpu::sgemm`), or Q8_0 where `dtype` is `None`.
    pub fn load(
        source: &dyn TensorSource,
        config: EncoderConfig,
        task: EncoderTask,
        dtype: Option<DType>,
    ) -> Result<Self> {
        let names = Names { source };
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
                qkv: Projection::new(qkv_weight, qkv_bias, dtype)?,
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
                let classifier = Projection::new(
                    names.raw("classifier.weight")?,
                    names.raw("classifier.bias")?,
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
            words: table(&words)?,
            positions: table(&positions)?,
            types: types.as_ref().map(table).transpose()?,
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
        .map(|t| t.len() * 4)
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

    /// The last layer's state of every token of `inputs`, packed: `[sum of lengths, hidden]`
    /// row-major. Inputs must have passed [`BertEncoder::check`].
    pub fn forward(&self, inputs: &[EncoderInput]) -> Result<Vec<f32>> {
        team::with_team(|| self.forward_in_team(inputs))
    }

    /// [`BertEncoder::forward`] with its loops on rayon's pool, recruiting no team: the
    /// workers stay free between loops for a generating engine's team on the same cores.
    pub fn forward_sharing_cores(&self, inputs: &[EncoderInput]) -> Result<Vec<f32>> {
        self.forward_in_team(inputs)
    }

    fn forward_in_team(&self, inputs: &[EncoderInput]) -> Result<Vec<f32>> {
        let spans = spans(inputs);
        let rows = spans.last().map_or(0, |&(start, len)| start + len);
        if rows == 0 {
            return Err(Error::InvalidBatch("no tokens to encode".into()));
        }
        let h = self.config.hidden_size;
        let eps = self.config.layer_norm_eps as f32;
        let mut x = vec![0f32; rows * h];
        for (input, &(start, _)) in inputs.iter().zip(&spans) {
            for (p, &id) in input.ids.iter().enumerate() {
                let row = &mut x[(start + p) * h..(start + p + 1) * h];
                let word = &self.words[id as usize * h..(id as usize + 1) * h];
                let position = &self.positions[p * h..(p + 1) * h];
                for ((o, w), q) in row.iter_mut().zip(word).zip(position) {
                    *o = w + q;
                }
                if let Some(types) = &self.types {
                    let t = input.types.get(p).copied().unwrap_or(0) as usize;
                    for (o, v) in row.iter_mut().zip(&types[t * h..(t + 1) * h]) {
                        *o += v;
                    }
                }
            }
        }
        layer_norm(&mut x, None, h, &self.embedding_norm, eps);
        let (mut qkv, mut context, mut sum, mut up) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for layer in &self.layers {
            layer.qkv.forward(&x, rows, &mut qkv)?;
            context.resize(rows * h, 0.0);
            attention(&qkv, &spans, &self.config, &mut context);
            layer.out.forward(&context, rows, &mut sum)?;
            layer_norm(&mut sum, Some(&x), h, &layer.attention_norm, eps);
            std::mem::swap(&mut x, &mut sum);
            layer.up.forward(&x, rows, &mut up)?;
            activate(&mut up, self.config.activation);
            layer.down.forward(&up, rows, &mut sum)?;
            layer_norm(&mut sum, Some(&x), h, &layer.output_norm, eps);
            std::mem::swap(&mut x, &mut sum);
        }
        Ok(x)
    }

    /// A cross-encoder's logits for each input (`[inputs][labels]`) from the packed states
    /// [`BertEncoder::forward`] gave; `None` for a model without a classifier.
    pub fn classify(
        &self,
        states: &[f32],
        inputs: &[EncoderInput],
    ) -> Result<Option<Vec<Vec<f32>>>> {
        let Some(head) = &self.classifier else {
            return Ok(None);
        };
        let h = self.config.hidden_size;
        let cls: Vec<f32> = spans(inputs)
            .iter()
            .flat_map(|&(s, _)| states[s * h..(s + 1) * h].iter().copied())
            .collect();
        let (mut pooled, mut logits) = (Vec::new(), Vec::new());
        head.pooler.forward(&cls, inputs.len(), &mut pooled)?;
        pooled.iter_mut().for_each(|v| *v = v.tanh());
        head.classifier
            .forward(&pooled, inputs.len(), &mut logits)?;
        let labels = head.classifier.rows();
        Ok(Some(
            logits.chunks_exact(labels).map(<[f32]>::to_vec).collect(),
        ))
    }
}

/// Rows per task of the element-wise loops.
const ROWS_PER_TASK: usize = 16;

/// `x = LayerNorm(x + residual)` row by row, on the team.
fn layer_norm(x: &mut [f32], residual: Option<&[f32]>, h: usize, norm: &Norm, eps: f32) {
    let rows = x.len() / h;
    let shared = Disjoint::new(x);
    team::for_each(rows.div_ceil(ROWS_PER_TASK), |task| {
        let first = task * ROWS_PER_TASK;
        let last = (first + ROWS_PER_TASK).min(rows);
        // SAFETY: each task owns its rows.
        let block = unsafe { shared.run(first * h, (last - first) * h) };
        for (i, row) in block.chunks_exact_mut(h).enumerate() {
            if let Some(r) = residual {
                for (v, add) in row.iter_mut().zip(&r[(first + i) * h..(first + i + 1) * h]) {
                    *v += add;
                }
            }
            let mean = row.iter().sum::<f32>() / h as f32;
            let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / h as f32;
            let inv = 1.0 / (var + eps).sqrt();
            for ((v, w), b) in row.iter_mut().zip(&norm.weight).zip(&norm.bias) {
                *v = (*v - mean) * inv * w + b;
            }
        }
    });
}

/// The feed-forward activation in place, on the team.
fn activate(x: &mut [f32], activation: EncoderActivation) {
    const CHUNK: usize = 1 << 14;
    let len = x.len();
    let shared = Disjoint::new(x);
    team::for_each(len.div_ceil(CHUNK), |task| {
        let first = task * CHUNK;
        // SAFETY: each task owns its chunk.
        let chunk = unsafe { shared.run(first, CHUNK.min(len - first)) };
        match activation {
            EncoderActivation::Gelu => chunk.iter_mut().for_each(|v| *v = gelu_erf(*v)),
            EncoderActivation::GeluTanh => chunk.iter_mut().for_each(|v| *v = gelu_tanh(*v)),
            EncoderActivation::Relu => chunk.iter_mut().for_each(|v| *v = v.max(0.0)),
        }
    });
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
/// (`[rows, 3 hidden]`); writes `[rows, hidden]` into `out`.
fn attention(qkv: &[f32], spans: &[(usize, usize)], config: &EncoderConfig, out: &mut [f32]) {
    let hidden = config.hidden_size;
    let d = config.head_dim();
    let scale = 1.0 / (d as f32).sqrt();
    let owner: Vec<(usize, usize)> = spans
        .iter()
        .flat_map(|&span| std::iter::repeat_n(span, span.1))
        .collect();
    let rows = owner.len();
    let shared = Disjoint::new(out);
    team::for_each(rows.div_ceil(ROWS_PER_TASK), |task| {
        let first = task * ROWS_PER_TASK;
        let last = (first + ROWS_PER_TASK).min(rows);
        // SAFETY: each task owns its rows.
        let block = unsafe { shared.run(first * hidden, (last - first) * hidden) };
        let mut scores = Vec::new();
        for (i, out) in block.chunks_exact_mut(hidden).enumerate() {
            let row = first + i;
            let (start, len) = owner[row];
            let query = &qkv[row * 3 * hidden..row * 3 * hidden + hidden];
            for head in 0..config.num_heads {
                let q = &query[head * d..(head + 1) * d];
                scores.clear();
                scores.extend((start..start + len).map(|key_row| {
                    let base = key_row * 3 * hidden + hidden + head * d;
                    dot(q, &qkv[base..base + d]) * scale
                }));
                softmax_in_place(&mut scores);
                let o = &mut out[head * d..(head + 1) * d];
                o.fill(0.0);
                for (j, w) in scores.iter().enumerate() {
                    let base = (start + j) * 3 * hidden + 2 * hidden + head * d;
                    for (o, v) in o.iter_mut().zip(&qkv[base..base + d]) {
                        *o += w * v;
                    }
                }
            }
        }
    });
}
