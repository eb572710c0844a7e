//! The shape each weight of a layer must have for a config (`[out, in]` for projections), so
//! that a file whose tensors contradict its own metadata or the family's declaration is refused
//! at load with the tensor's name, instead of failing (or computing garbage) in a forward.

use crate::model::config::ModelConfig;
use crate::{Error, Result};

/// What a tensor is, for its expected shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Query projection.
    Q,
    /// Key or value projection.
    Kv,
    /// Attention output projection.
    O,
    /// MLP gate or up projection.
    Up,
    /// MLP down projection.
    Down,
    /// A norm over the residual.
    Norm,
    /// A per-head norm (QK norm).
    HeadNorm,
}

/// The expected shapes of one config's layer weights.
#[derive(Debug, Clone, Copy)]
pub struct Shapes {
    hidden: usize,
    attention: usize,
    kv: usize,
    inner: usize,
    head: usize,
}

impl Shapes {
    /// The shapes `cfg` implies.
    pub fn of(cfg: &ModelConfig) -> Self {
        Self {
            hidden: cfg.hidden_size,
            attention: cfg.attention_width(),
            kv: cfg.kv_row_width(),
            inner: cfg.intermediate_size,
            head: cfg.head_dim,
        }
    }

    /// The dims a tensor of `role` must have.
    pub fn expected(&self, role: Role) -> Vec<usize> {
        match role {
            Role::Q => vec![self.attention, self.hidden],
            Role::Kv => vec![self.kv, self.hidden],
            Role::O => vec![self.hidden, self.attention],
            Role::Up => vec![self.inner, self.hidden],
            Role::Down => vec![self.hidden, self.inner],
            Role::Norm => vec![self.hidden],
            Role::HeadNorm => vec![self.head],
        }
    }

    /// An error naming `name` unless `dims` is what `role` must have.
    pub fn check(&self, name: &str, role: Role, dims: &[usize]) -> Result<()> {
        let want = self.expected(role);
        if dims == want.as_slice() {
            return Ok(());
        }
        Err(Error::Metadata(format!(
            "tensor {name} has shape {dims:?}, but the config implies {want:?}"
        )))
    }
}
