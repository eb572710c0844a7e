//! The CUDA backend: [`CudaBackend`] (feature `cuda`) runs a model on an NVIDIA GPU with its
//! paged KV cache on the device and thicket's own kernels (`kernels.cu`): the fused f16 pass
//! (`fused`, its buffers in `arena`, its steps captured as CUDA graphs in `graphs`) for f16
//! weights, candle's ops around thicket's K/V writes for any other (`ops`); both call the
//! paged tree attention in `attend`. `plan` works out on the host what the kernels are told,
//! and is tested without a GPU.

#[cfg(feature = "cuda")]
mod arena;
#[cfg(feature = "cuda")]
mod attend;
#[cfg(feature = "cuda")]
mod device;
#[cfg(feature = "cuda")]
mod fused;
#[cfg(feature = "cuda")]
mod graphs;
#[cfg(feature = "cuda")]
mod ops;
mod plan;
mod support;

#[cfg(feature = "cuda")]
pub use device::CudaBackend;
#[cfg(feature = "cuda")]
pub use support::kernels_take;
