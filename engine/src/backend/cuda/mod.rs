//! The CUDA backend: [`CudaBackend`] (feature `cuda`) runs a model on an NVIDIA GPU with its
//! paged KV cache on the device and thicket's own kernels for K/V writes, paged tree
//! attention and KV copies (`kernels.cu`); `plan` works out on the host what those kernels
//! are told, and is tested without a GPU.

#[cfg(feature = "cuda")]
mod device;
mod plan;

#[cfg(feature = "cuda")]
pub use device::CudaBackend;
