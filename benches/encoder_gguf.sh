#!/usr/bin/env bash
# Writes an encoder's Hugging Face folder as GGUF with llama.cpp's own converter, for the
# peer comparisons of benches/embed_peer.py and the llama.cpp embedding references.
#
#   benches/encoder_gguf.sh LLAMA_CPP_DIR HF_DIR OUT.gguf [f32|f16]
#
# LLAMA_CPP_DIR is llama.cpp's source tree (the llama-cpp-python 0.3.36 sdist's
# vendor/llama.cpp); its converter needs Python with torch, transformers and numpy, and reads
# its own gguf-py. PYTHON names that interpreter (default python3).
set -euo pipefail
llama=${1:?llama.cpp source dir}
hf=${2:?HF folder}
out=${3:?output GGUF}
type=${4:-f32}
PYTHONPATH="$llama/gguf-py" "${PYTHON:-python3}" "$llama/convert_hf_to_gguf.py" "$hf" \
    --outtype "$type" --outfile "$out"
