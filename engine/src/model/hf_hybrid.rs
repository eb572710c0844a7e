//! What an HF `config.json` says of a hybrid's layers: which convolve and which attend
//! (`layer_types` with `conv` entries, or LFM2's older `full_attn_idxs`), how wide a
//! convolution is (`conv_L_cache`), and the MLP width LFM2 derives from `intermediate_size`
//! (`block_auto_adjust_ff_dim`: two thirds of it, times `block_ffn_dim_multiplier`, rounded up
//! to `block_multiple_of`, as transformers computes it). A convolution with a bias is refused.
//! Qwen3.5's Gated DeltaNet layers: their shape (`linear_*`) and how often a layer attends.
//! Which layers attend through a sliding window (`layer_types`).

use serde::Deserialize;

use crate::model::config::{DeltaNetShape, KeyHeadsOfValues};
use crate::{Error, Result};

/// The hybrid keys of `config.json`.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct HfHybrid {
    #[serde(default, alias = "conv_L_cache")]
    conv_l_cache: Option<usize>,
    #[serde(default)]
    conv_bias: bool,
    #[serde(default)]
    full_attn_idxs: Option<Vec<usize>>,
    #[serde(default)]
    block_auto_adjust_ff_dim: bool,
    #[serde(default)]
    block_ffn_dim_multiplier: Option<f64>,
    #[serde(default)]
    block_multiple_of: Option<usize>,
    #[serde(default)]
    linear_conv_kernel_dim: Option<usize>,
    #[serde(default)]
    linear_num_key_heads: Option<usize>,
    #[serde(default)]
    linear_num_value_heads: Option<usize>,
    #[serde(default)]
    linear_key_head_dim: Option<usize>,
    #[serde(default)]
    linear_value_head_dim: Option<usize>,
    #[serde(default)]
    full_attention_interval: Option<usize>,
}

impl HfHybrid {
    /// The KV heads of each of `layers` layers (0 where it convolves), where the config says
    /// some convolve; `kv_heads` for the attending ones.
    pub(crate) fn kv_heads_per_layer(
        &self,
        layer_types: Option<&[String]>,
        layers: usize,
        kv_heads: usize,
    ) -> Result<Option<Vec<usize>>> {
        let attends: Vec<bool> = match (layer_types, &self.full_attn_idxs) {
            (Some(kinds), _) if kinds.iter().any(|k| k == "conv") => {
                kinds.iter().map(|k| k != "conv").collect()
            }
            (Some(_), _) | (None, None) => return Ok(None),
            (None, Some(idxs)) => {
                if let Some(bad) = idxs.iter().find(|&&i| i >= layers) {
                    return Err(Error::Metadata(format!(
                        "full_attn_idxs names layer {bad} of {layers}"
                    )));
                }
                (0..layers).map(|i| idxs.contains(&i)).collect()
            }
        };
        if self.conv_bias {
            return Err(Error::Metadata(
                "conv_bias: a short convolution with a bias is not supported".into(),
            ));
        }
        Ok(Some(
            attends
                .into_iter()
                .map(|a| if a { kv_heads } else { 0 })
                .collect(),
        ))
    }

    /// A Gated DeltaNet layer's shape, where the config gives one (`linear_*`; transformers
    /// groups the value heads by key head).
    pub(crate) fn delta_net(&self) -> Result<Option<DeltaNetShape>> {
        let Some(value_heads) = self.linear_num_value_heads else {
            return Ok(None);
        };
        let need = |v: Option<usize>, key: &str| {
            v.ok_or_else(|| Error::Metadata(format!("config.json: missing {key}")))
        };
        Ok(Some(DeltaNetShape {
            kernel: need(self.linear_conv_kernel_dim, "linear_conv_kernel_dim")?,
            key_heads: need(self.linear_num_key_heads, "linear_num_key_heads")?,
            value_heads,
            key_dim: need(self.linear_key_head_dim, "linear_key_head_dim")?,
            value_dim: need(self.linear_value_head_dim, "linear_value_head_dim")?,
            key_heads_of_values: KeyHeadsOfValues::Grouped,
        }))
    }

    /// Every this many layers the last attends, where the config says.
    pub(crate) fn full_attention_interval(&self) -> Option<usize> {
        self.full_attention_interval
    }

    /// Positions a short convolution spans, where the config gives it.
    pub(crate) fn conv_kernel(&self) -> Option<usize> {
        self.conv_l_cache
    }

    /// The MLP's width for `intermediate_size`.
    pub(crate) fn ffn_width(&self, intermediate_size: usize) -> usize {
        if !self.block_auto_adjust_ff_dim {
            return intermediate_size;
        }
        let mut width = 2 * intermediate_size / 3;
        if let Some(m) = self.block_ffn_dim_multiplier {
            width = (m * width as f64) as usize;
        }
        let multiple = self.block_multiple_of.unwrap_or(1).max(1);
        width.div_ceil(multiple) * multiple
    }
}

/// Per layer whether it attends through a sliding window, where `layer_types` lists the
/// layers: the kinds transformers names, any other refused by name.
pub(crate) fn windowed_layers(layer_types: Option<&[String]>) -> Result<Option<Vec<bool>>> {
    layer_types
        .map(|kinds| {
            kinds
                .iter()
                .map(|k| match k.as_str() {
                    "sliding_attention" => Ok(true),
                    // A convolution, DeltaNet or Mamba-2 layer has no window (its reach is
                    // its own); Granite's older names.
                    "full_attention" | "conv" | "linear_attention" | "mamba" | "attention" => {
                        Ok(false)
                    }
                    other => Err(Error::Metadata(format!(
                        "layer_types: '{other}' is not supported (sliding_attention, \
                         full_attention, conv, linear_attention, mamba, attention)"
                    ))),
                })
                .collect::<Result<Vec<bool>>>()
        })
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lfm2_1_2b_widths_and_layers() {
        let hf: HfHybrid = serde_json::from_str(
            r#"{"conv_L_cache": 3, "block_auto_adjust_ff_dim": true,
                "block_ffn_dim_multiplier": 1.0, "block_multiple_of": 256}"#,
        )
        .unwrap();
        // LFM2-1.2B: intermediate_size 12288 gives the 8192 its GGUF files declare.
        assert_eq!(hf.ffn_width(12288), 8192);
        assert_eq!(hf.conv_kernel(), Some(3));
        let kinds: Vec<String> = ["conv", "full_attention", "conv"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(
            hf.kv_heads_per_layer(Some(&kinds), 3, 8).unwrap(),
            Some(vec![0, 8, 0])
        );
        let old: HfHybrid = serde_json::from_str(r#"{"full_attn_idxs": [1]}"#).unwrap();
        assert_eq!(
            old.kv_heads_per_layer(None, 3, 8).unwrap(),
            Some(vec![0, 8, 0])
        );
        let biased: HfHybrid =
            serde_json::from_str(r#"{"conv_bias": true, "full_attn_idxs": [1]}"#).unwrap();
        assert!(biased.kv_heads_per_layer(None, 3, 8).is_err());
    }
}
