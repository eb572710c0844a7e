//! With the `cuda` feature, compiles thicket's CUDA kernels (`src/backend/cuda/kernels.cu`)
//! to PTX with `nvcc` (from `NVCC`, `CUDA_ROOT/bin`, or the PATH; `scripts/cuda-toolkit.sh`
//! provides one) for `CUDA_COMPUTE_CAP` (default 90). Without the feature it does nothing.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let source = "src/backend/cuda/kernels.cu";
    println!("cargo:rerun-if-changed={source}");
    for var in ["NVCC", "CUDA_ROOT", "CUDA_COMPUTE_CAP"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let nvcc = std::env::var("NVCC").ok().unwrap_or_else(|| {
        std::env::var("CUDA_ROOT")
            .map(|root| format!("{root}/bin/nvcc"))
            .unwrap_or_else(|_| "nvcc".into())
    });
    let cap = std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "90".into());
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let ptx = out.join("thicket_kernels.ptx");
    let status = Command::new(&nvcc)
        .args(["--ptx", "-O3"])
        .arg(format!("-arch=compute_{cap}"))
        .arg("-o")
        .arg(&ptx)
        .arg(source)
        .status()
        .unwrap_or_else(|e| panic!("running {nvcc} (see scripts/cuda-toolkit.sh): {e}"));
    assert!(status.success(), "{nvcc} failed on {source}");
}
