//! thicket's CPU kernels, holding no engine state: the quantized matmuls (`qgemm`), paged
//! tree attention (`attention`: its driver and inner loops), the paged KV store it reads and
//! writes in place (`kv_store`), the gated delta rule of linear-attention layers in its
//! recurrent and chunked forms (`delta_rule`) and the one-token steps of it and of Mamba-2
//! (`delta_step`), the dense f32 projection with its weight packed once (`sgemm`), the
//! vectorised softmax and `exp`, SiLU and GELU, fixed-order
//! reductions (`reduce`) and the team of pool workers a forward runs its parallel loops on
//! (`team`). The model's one-pass forward (`crate::model`) is built from these; nothing here
//! knows what a model, a request or a drafter is. Every kernel computes a row's result
//! independently of the other rows of its batch, which lossless tree verification needs.

pub mod attention;
pub mod delta_rule;
pub mod delta_step;
pub mod kv_store;
pub mod qgemm;
pub(crate) mod reduce;
pub mod sgemm;
pub mod silu;
pub(crate) mod softmax;
pub(crate) mod team;
