#!/usr/bin/env bash
# Builds thicket's CUDA binary (and, with --tests, the test binaries) on any x86-64 Linux
# machine, GPU or not: the CUDA 13 toolkit comes from PyPI (scripts/cuda-toolkit.sh), the
# kernels are compiled for Hopper (CUDA_COMPUTE_CAP, default 90), and the CPU code targets
# x86-64-v3 so the binary runs on the GPU machine's processor (thicket picks its AVX-512 and
# AMX kernels at run time). Output: target/cuda/release/thicket.
#
#   scripts/build-cuda.sh            # the binary
#   scripts/build-cuda.sh --tests    # also the test binaries (paths printed by cargo)
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(scripts/cuda-toolkit.sh)"
export CARGO_TARGET_DIR="$PWD/target/cuda"
export RUSTFLAGS="-C target-cpu=x86-64-v3"
cargo build --release --features cuda --bin thicket
if [ "${1:-}" = "--tests" ]; then
    cargo test --release --features cuda --test tests --no-run
fi
