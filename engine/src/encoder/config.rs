//! What an encoder checkpoint declares: the BERT geometry of `config.json`, what the model is
//! for (`BertModel`: embeddings; `BertForSequenceClassification`: a cross-encoder's scores),
//! and how token states become one vector, read from sentence-transformers' `modules.json`
//! and its `1_Pooling/config.json` (mean, CLS, max, mean over the square root of the length,
//! last token; normalized where a `Normalize` module is listed).

use std::path::Path;

use serde::Deserialize;

use crate::{Error, Result};

/// The activation of the feed-forward block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EncoderActivation {
    /// GELU with the error function (`gelu`).
    Gelu,
    /// GELU's tanh approximation (`gelu_new`, `gelu_pytorch_tanh`).
    GeluTanh,
    /// `relu`.
    Relu,
}

/// A BERT encoder's geometry.
#[derive(Debug, Clone, PartialEq)]
pub struct EncoderConfig {
    /// Width of a token's state.
    pub hidden_size: usize,
    /// Attention heads.
    pub num_heads: usize,
    /// Layers.
    pub num_layers: usize,
    /// Width of the feed-forward block.
    pub intermediate_size: usize,
    /// Rows of the word-embedding table.
    pub vocab_size: usize,
    /// Rows of the position-embedding table: the longest input.
    pub max_positions: usize,
    /// Rows of the token-type table (0: none).
    pub type_vocab_size: usize,
    /// LayerNorm epsilon.
    pub layer_norm_eps: f64,
    /// Feed-forward activation.
    pub activation: EncoderActivation,
    /// Widths the embedding may be cut to (Matryoshka training): `None` for a model not
    /// trained for it, an empty list for any width (`is_matryoshka` without a list).
    pub matryoshka: Option<Vec<usize>>,
}

impl EncoderConfig {
    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_heads.max(1)
    }
}

/// How a sequence's token states become one vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolingMode {
    /// The first token's state (`[CLS]`).
    Cls,
    /// The mean over the tokens.
    Mean,
    /// The element-wise maximum over the tokens.
    Max,
    /// The sum over the tokens divided by the square root of their count.
    MeanSqrtLen,
    /// The last token's state.
    Last,
}

impl PoolingMode {
    /// The name `--pooling` and logs use.
    pub fn name(self) -> &'static str {
        match self {
            Self::Cls => "cls",
            Self::Mean => "mean",
            Self::Max => "max",
            Self::MeanSqrtLen => "mean_sqrt_len",
            Self::Last => "last",
        }
    }

    /// Parses a name [`PoolingMode::name`] gives.
    pub fn parse(name: &str) -> Option<Self> {
        [
            Self::Cls,
            Self::Mean,
            Self::Max,
            Self::MeanSqrtLen,
            Self::Last,
        ]
        .into_iter()
        .find(|m| m.name() == name)
    }
}

/// Pooling and whether the pooled vector is scaled to unit length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pooling {
    /// Which states are combined, and how.
    pub mode: PoolingMode,
    /// Scale to unit L2 norm.
    pub normalize: bool,
}

/// What an encoder checkpoint computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EncoderTask {
    /// One vector per input (a bi-encoder: `BertModel`).
    Embed(Pooling),
    /// Scores of a text pair (a cross-encoder: `BertForSequenceClassification`), `labels`
    /// logits from the pooled `[CLS]` state.
    Classify {
        /// Logits per input.
        labels: usize,
    },
}

#[derive(Deserialize)]
struct RawConfig {
    #[serde(default)]
    architectures: Vec<String>,
    model_type: Option<String>,
    hidden_size: usize,
    num_attention_heads: usize,
    num_hidden_layers: usize,
    intermediate_size: usize,
    vocab_size: usize,
    #[serde(default = "default_positions")]
    max_position_embeddings: usize,
    #[serde(default)]
    type_vocab_size: usize,
    #[serde(default = "default_eps")]
    layer_norm_eps: f64,
    #[serde(default = "default_act")]
    hidden_act: String,
    #[serde(default)]
    position_embedding_type: Option<String>,
    #[serde(default)]
    id2label: Option<serde_json::Map<String, serde_json::Value>>,
    #[serde(default)]
    num_labels: Option<usize>,
    #[serde(default)]
    is_matryoshka: bool,
    #[serde(default)]
    matryoshka_dimensions: Option<Vec<usize>>,
}

fn default_positions() -> usize {
    512
}
fn default_eps() -> f64 {
    1e-12
}
fn default_act() -> String {
    "gelu".into()
}

/// Whether `config.json` in `dir` names an encoder thicket serves as one.
pub fn is_encoder_dir(dir: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string(dir.join("config.json")) else {
        return false;
    };
    let Ok(raw) = serde_json::from_str::<serde_json::Value>(&text) else {
        return false;
    };
    let named = |v: &serde_json::Value| v.as_str().is_some_and(is_bert_name);
    raw.get("architectures")
        .and_then(|a| a.as_array())
        .and_then(|a| a.first())
        .map_or_else(|| raw.get("model_type").is_some_and(named), named)
}

fn is_bert_name(name: &str) -> bool {
    matches!(
        name,
        "bert" | "BertModel" | "BertForSequenceClassification" | "BertForMaskedLM"
    )
}

/// Reads the geometry and the task of the checkpoint in `dir`.
pub fn read_config(dir: &Path) -> Result<(EncoderConfig, EncoderTask)> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| Error::io(format!("read {}", path.display()), e))?;
    let raw: RawConfig = serde_json::from_str(&text)
        .map_err(|e| Error::Metadata(format!("{}: {e}", path.display())))?;
    let architecture = raw
        .architectures
        .first()
        .cloned()
        .or(raw.model_type.clone())
        .unwrap_or_default();
    if !is_bert_name(&architecture) {
        return Err(Error::UnsupportedArchitecture(architecture));
    }
    if let Some(kind) = raw.position_embedding_type.as_deref() {
        if kind != "absolute" {
            return Err(Error::Metadata(format!(
                "{}: position_embedding_type {kind:?} is not supported (absolute)",
                path.display()
            )));
        }
    }
    let activation = match raw.hidden_act.as_str() {
        "gelu" => EncoderActivation::Gelu,
        "gelu_new" | "gelu_pytorch_tanh" => EncoderActivation::GeluTanh,
        "relu" => EncoderActivation::Relu,
        other => {
            return Err(Error::Metadata(format!(
                "{}: hidden_act {other:?} is not supported (gelu, gelu_new, relu)",
                path.display()
            )))
        }
    };
    if raw.num_attention_heads == 0 || !raw.hidden_size.is_multiple_of(raw.num_attention_heads) {
        return Err(Error::Metadata(format!(
            "{}: hidden_size {} is not a multiple of num_attention_heads {}",
            path.display(),
            raw.hidden_size,
            raw.num_attention_heads
        )));
    }
    let config = EncoderConfig {
        hidden_size: raw.hidden_size,
        num_heads: raw.num_attention_heads,
        num_layers: raw.num_hidden_layers,
        intermediate_size: raw.intermediate_size,
        vocab_size: raw.vocab_size,
        max_positions: raw.max_position_embeddings,
        type_vocab_size: raw.type_vocab_size,
        layer_norm_eps: raw.layer_norm_eps,
        activation,
        matryoshka: match (raw.matryoshka_dimensions, raw.is_matryoshka) {
            (Some(list), _) => Some(list),
            (None, true) => Some(Vec::new()),
            (None, false) => None,
        },
    };
    let task = match architecture.as_str() {
        "BertForSequenceClassification" => EncoderTask::Classify {
            labels: raw
                .num_labels
                .or(raw.id2label.as_ref().map(|m| m.len()))
                .unwrap_or(2)
                .max(1),
        },
        _ => EncoderTask::Embed(read_pooling(dir)?),
    };
    Ok((config, task))
}

#[derive(Deserialize)]
struct Module {
    #[serde(default)]
    path: String,
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Deserialize, Default)]
struct PoolingFile {
    #[serde(default)]
    pooling_mode_cls_token: bool,
    #[serde(default)]
    pooling_mode_mean_tokens: bool,
    #[serde(default)]
    pooling_mode_max_tokens: bool,
    #[serde(default)]
    pooling_mode_mean_sqrt_len_tokens: bool,
    #[serde(default)]
    pooling_mode_weightedmean_tokens: bool,
    #[serde(default)]
    pooling_mode_lasttoken: bool,
    #[serde(default)]
    pooling_mode: Option<String>,
}

/// The pooling a sentence-transformers directory declares; without `modules.json`, the
/// `[CLS]` state normalized (what vLLM gives a bare `BertModel`).
pub fn read_pooling(dir: &Path) -> Result<Pooling> {
    let modules_path = dir.join("modules.json");
    let Ok(text) = std::fs::read_to_string(&modules_path) else {
        tracing::info!(
            "{}: no modules.json; pooling the [CLS] state, normalized",
            dir.display()
        );
        return Ok(Pooling {
            mode: PoolingMode::Cls,
            normalize: true,
        });
    };
    let modules: Vec<Module> = serde_json::from_str(&text)
        .map_err(|e| Error::Metadata(format!("{}: {e}", modules_path.display())))?;
    let mut pooling = None;
    let mut normalize = false;
    for module in &modules {
        let kind = module.kind.rsplit('.').next().unwrap_or_default();
        match kind {
            "Transformer" => {}
            "Normalize" => normalize = true,
            "Pooling" => pooling = Some(pooling_mode(&dir.join(&module.path))?),
            other => {
                return Err(Error::Metadata(format!(
                    "{}: the {other} module is not supported (Transformer, Pooling, Normalize)",
                    modules_path.display()
                )))
            }
        }
    }
    let mode = pooling.ok_or_else(|| {
        Error::Metadata(format!(
            "{}: lists no Pooling module",
            modules_path.display()
        ))
    })?;
    Ok(Pooling { mode, normalize })
}

fn pooling_mode(dir: &Path) -> Result<PoolingMode> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| Error::io(format!("read {}", path.display()), e))?;
    let file: PoolingFile = serde_json::from_str(&text)
        .map_err(|e| Error::Metadata(format!("{}: {e}", path.display())))?;
    if let Some(name) = &file.pooling_mode {
        let name = match name.as_str() {
            "lasttoken" => "last",
            "mean_sqrt_len_tokens" => "mean_sqrt_len",
            other => other,
        };
        return PoolingMode::parse(name).ok_or_else(|| {
            Error::Metadata(format!(
                "{}: pooling_mode {name:?} is not supported",
                path.display()
            ))
        });
    }
    let modes: Vec<PoolingMode> = [
        (file.pooling_mode_cls_token, PoolingMode::Cls),
        (file.pooling_mode_mean_tokens, PoolingMode::Mean),
        (file.pooling_mode_max_tokens, PoolingMode::Max),
        (
            file.pooling_mode_mean_sqrt_len_tokens,
            PoolingMode::MeanSqrtLen,
        ),
        (file.pooling_mode_lasttoken, PoolingMode::Last),
    ]
    .into_iter()
    .filter_map(|(on, mode)| on.then_some(mode))
    .collect();
    if file.pooling_mode_weightedmean_tokens {
        return Err(Error::Metadata(format!(
            "{}: weighted-mean pooling is not supported",
            path.display()
        )));
    }
    match modes.as_slice() {
        [mode] => Ok(*mode),
        [] => Err(Error::Metadata(format!(
            "{}: names no pooling mode",
            path.display()
        ))),
        _ => Err(Error::Metadata(format!(
            "{}: several pooling modes at once (concatenated) are not supported",
            path.display()
        ))),
    }
}

/// The longest input sentence-transformers feeds this checkpoint (`max_seq_length` of
/// `sentence_bert_config.json`), when it says.
pub fn declared_max_length(dir: &Path) -> Option<usize> {
    let text = std::fs::read_to_string(dir.join("sentence_bert_config.json")).ok()?;
    let raw: serde_json::Value = serde_json::from_str(&text).ok()?;
    raw.get("max_seq_length")?
        .as_u64()
        .and_then(|n| usize::try_from(n).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir_with(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in files {
            let path = dir.path().join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        dir
    }

    #[test]
    fn sentence_transformers_pooling_is_read_with_its_normalize_module() {
        let dir = dir_with(&[
            (
                "modules.json",
                r#"[{"idx":0,"name":"0","path":"","type":"sentence_transformers.models.Transformer"},
                    {"idx":1,"name":"1","path":"1_Pooling","type":"sentence_transformers.models.Pooling"},
                    {"idx":2,"name":"2","path":"2_Normalize","type":"sentence_transformers.models.Normalize"}]"#,
            ),
            (
                "1_Pooling/config.json",
                r#"{"word_embedding_dimension":384,"pooling_mode_cls_token":false,"pooling_mode_mean_tokens":true}"#,
            ),
        ]);
        assert_eq!(
            read_pooling(dir.path()).unwrap(),
            Pooling {
                mode: PoolingMode::Mean,
                normalize: true
            }
        );
    }

    #[test]
    fn cls_without_normalize_and_unsupported_modules_are_told_apart() {
        let dir = dir_with(&[
            (
                "modules.json",
                r#"[{"path":"","type":"sentence_transformers.models.Transformer"},
                    {"path":"1_Pooling","type":"sentence_transformers.models.Pooling"}]"#,
            ),
            (
                "1_Pooling/config.json",
                r#"{"pooling_mode_cls_token":true}"#,
            ),
        ]);
        assert_eq!(
            read_pooling(dir.path()).unwrap(),
            Pooling {
                mode: PoolingMode::Cls,
                normalize: false
            }
        );
        let dense = dir_with(&[(
            "modules.json",
            r#"[{"path":"2_Dense","type":"sentence_transformers.models.Dense"}]"#,
        )]);
        let err = read_pooling(dense.path()).unwrap_err().to_string();
        assert!(err.contains("Dense"), "{err}");
        let two = dir_with(&[
            (
                "modules.json",
                r#"[{"path":"p","type":"sentence_transformers.models.Pooling"}]"#,
            ),
            (
                "p/config.json",
                r#"{"pooling_mode_cls_token":true,"pooling_mode_mean_tokens":true}"#,
            ),
        ]);
        let err = read_pooling(two.path()).unwrap_err().to_string();
        assert!(err.contains("several"), "{err}");
    }

    #[test]
    fn a_bare_bert_pools_cls_normalized_and_a_classifier_counts_its_labels() {
        let config = r#"{"architectures":["BertForSequenceClassification"],"hidden_size":8,
            "num_attention_heads":2,"num_hidden_layers":1,"intermediate_size":16,"vocab_size":10,
            "id2label":{"0":"LABEL_0"}}"#;
        let dir = dir_with(&[("config.json", config)]);
        assert!(is_encoder_dir(dir.path()));
        let (c, task) = read_config(dir.path()).unwrap();
        assert_eq!(c.head_dim(), 4);
        assert_eq!(task, EncoderTask::Classify { labels: 1 });
        let bare = dir_with(&[(
            "config.json",
            &config.replace("BertForSequenceClassification", "BertModel"),
        )]);
        assert_eq!(
            read_config(bare.path()).unwrap().1,
            EncoderTask::Embed(Pooling {
                mode: PoolingMode::Cls,
                normalize: true
            })
        );
        let llama = dir_with(&[("config.json", r#"{"architectures":["LlamaForCausalLM"]}"#)]);
        assert!(!is_encoder_dir(llama.path()));
    }
}
