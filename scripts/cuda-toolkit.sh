#!/usr/bin/env bash
# Installs a CUDA 13 toolkit from PyPI under target/cuda-toolkit (nvcc, headers, cuBLAS,
# cuRAND, NVRTC, the runtime) so a machine without a GPU or a system CUDA can build thicket's
# CUDA binary, and prints the environment the build needs. The driver library is not on
# PyPI: a link-time stand-in `libcuda.so` (every `cu*` entry point returns an error) is built
# here; at run time the GPU machine's driver provides the real `libcuda.so.1`.
#
#   eval "$(scripts/cuda-toolkit.sh)"   # install once, then export CUDA_ROOT, NVCC, PATH...
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD/target/cuda-toolkit"
venv="$root/venv"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv" >&2
fi
cu="$(echo "$venv"/lib/python3*/site-packages)/nvidia/cu13"
if [ ! -x "$cu/bin/nvcc" ]; then
    "$venv/bin/pip" install -q --disable-pip-version-check \
        nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88 \
        nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85 nvidia-cuda-nvrtc==13.0.88 \
        nvidia-curand==10.4.0.35 nvidia-cublas==13.1.0.3 >&2
fi
lib="$cu/lib"
for name in cublas cublasLt cudart nvrtc; do
    [ -e "$lib/lib$name.so" ] || ln -s "lib$name.so.13" "$lib/lib$name.so"
done
[ -e "$lib/libcurand.so" ] || ln -s libcurand.so.10 "$lib/libcurand.so"
if [ ! -e "$lib/libcuda.so" ]; then
    # One function per `cu*` entry point cuda.h declares, under its written name and under
    # the versioned name its macros give it (cuStreamDestroy -> cuStreamDestroy_v2), each
    # failing with CUDA_ERROR_NOT_SUPPORTED.
    stub="$root/libcuda_stub.c"
    {
        cat "$cu/include/cuda.h"
        echo '#include <cuda.h>' | gcc -E -P -I"$cu/include" -
    } | grep -oE 'CUresult +CUDAAPI +cu[A-Za-z0-9_]+ *\(|CUresult +cu[A-Za-z0-9_]+ *\(' \
        | grep -oE 'cu[A-Za-z0-9_]+ *\($' | tr -d ' (' | sort -u \
        | while read -r f; do echo "int $f(void) { return 801; }"; done >"$stub"
    gcc -shared -fPIC -O1 -Wl,-soname,libcuda.so.1 -o "$lib/libcuda.so" "$stub"
fi
cat <<ENV
export CUDA_ROOT="$cu" CUDA_PATH="$cu" CUDA_HOME="$cu" NVCC="$cu/bin/nvcc"
export PATH="$cu/bin:\$PATH" LIBRARY_PATH="$lib:\${LIBRARY_PATH:-}" LD_LIBRARY_PATH="$lib:\${LD_LIBRARY_PATH:-}"
export CUDA_COMPUTE_CAP=\${CUDA_COMPUTE_CAP:-90}
ENV
