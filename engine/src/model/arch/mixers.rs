//! Which token mixer each layer of a family has, from what the file says (`Family::mixers`
//! resolved against `FileFacts`): every layer attends; LFM2's layers without KV heads
//! convolve; Qwen3.5's and Qwen3-Next's layers are Gated DeltaNet but every `interval`-th (or
//! those the file lists as not recurrent); Granite 4.0-H's layers without KV heads are
//! Mamba-2. A key the declaration needs and the file lacks is
//! an error naming it.

use super::{Family, FileFacts, Mixers};
use crate::model::config::{DeltaNetShape, KeyHeadsOfValues, LayerMixer};
use crate::{Error, Result};

impl Family {
    /// Each layer's token mixer for a file with `facts` (empty: every layer attends).
    pub(super) fn mixers(&self, facts: &FileFacts) -> Result<Vec<LayerMixer>> {
        let name = self.gguf;
        let n = facts.num_layers;
        let per_layer = match &facts.kv_heads_per_layer {
            Some(heads) if heads.len() != n => {
                return Err(Error::Metadata(format!(
                    "{name}: {} per-layer KV head counts for {n} layers",
                    heads.len(),
                )))
            }
            other => other,
        };
        match (self.mixers, per_layer) {
            (Mixers::Attention, Some(heads)) if heads.contains(&0) => Err(Error::Metadata(
                format!("{name}: a layer without KV heads, but every layer of this family attends"),
            )),
            (Mixers::Attention, _) => Ok(Vec::new()),
            (Mixers::ShortConvWhereNoKv, None) => Err(Error::Metadata(format!(
                "{name}: missing the per-layer KV head counts that say which layers convolve"
            ))),
            (Mixers::ShortConvWhereNoKv, Some(heads)) => {
                let kernel = facts.conv_kernel.ok_or_else(|| {
                    Error::Metadata(format!("{name}: missing the short convolution's width"))
                })?;
                Ok(heads
                    .iter()
                    .map(|&h| match h {
                        0 => LayerMixer::ShortConv { kernel },
                        _ => LayerMixer::Attention,
                    })
                    .collect())
            }
            (Mixers::Mamba2WhereNoKv, None) => Err(Error::Metadata(format!(
                "{name}: missing the per-layer KV head counts that say which layers are Mamba-2"
            ))),
            (Mixers::Mamba2WhereNoKv, Some(heads)) => {
                let shape = facts.delta_net.ok_or_else(|| {
                    Error::Metadata(format!(
                        "{name}: missing the Mamba-2 layers' shape (ssm.conv_kernel, \
                         ssm.group_count, ssm.time_step_rank, ssm.state_size, ssm.inner_size)"
                    ))
                })?;
                let shape = DeltaNetShape {
                    key_heads_of_values: KeyHeadsOfValues::Grouped,
                    ..shape
                };
                Ok(heads
                    .iter()
                    .map(|&h| match h {
                        0 => LayerMixer::Mamba2(shape),
                        _ => LayerMixer::Attention,
                    })
                    .collect())
            }
            (
                Mixers::DeltaNet {
                    interval,
                    key_heads_of_values,
                },
                _,
            ) => {
                let shape = facts.delta_net.ok_or_else(|| {
                    Error::Metadata(format!(
                        "{name}: missing the Gated DeltaNet layers' shape (ssm.conv_kernel, \
                         ssm.group_count, ssm.time_step_rank, ssm.state_size, ssm.inner_size)"
                    ))
                })?;
                let shape = DeltaNetShape {
                    key_heads_of_values: facts.key_heads_of_values.unwrap_or(key_heads_of_values),
                    ..shape
                };
                let recurrent: Vec<bool> = match &facts.recurrent_layers {
                    Some(kinds) if kinds.len() < n => {
                        return Err(Error::Metadata(format!(
                            "{name}: {} recurrent-layer flags for {n} layers",
                            kinds.len()
                        )))
                    }
                    Some(kinds) => kinds[..n].to_vec(),
                    None => {
                        let every = facts.full_attention_interval.unwrap_or(interval);
                        if every == 0 {
                            return Err(Error::Metadata(format!(
                                "{name}: a full-attention interval of 0"
                            )));
                        }
                        (0..n).map(|i| (i + 1) % every != 0).collect()
                    }
                };
                Ok(recurrent
                    .into_iter()
                    .map(|r| match r {
                        true => LayerMixer::DeltaNet(shape),
                        false => LayerMixer::Attention,
                    })
                    .collect())
            }
        }
    }
}
