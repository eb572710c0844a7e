#!/usr/bin/env python3
"""Writes tests/data/mxfp4_gguf_py.json, the reference for thicket's MXFP4 decoding: blocks
that gguf-py (llama.cpp's Python package) quantized from seeded random values, and blocks with
every E8M0 scale byte but 255 (E8M0's NaN) and every code, each with gguf-py's dequantized
values as f32 bits. Its dequantization follows ggml's `dequantize_row_mxfp4` (doubled E2M1
values times `ggml_e8m0_to_fp32_half`).

Usage (gguf-py from the llama.cpp tree vendored in llama-cpp-python 0.3.36, numpy installed):

    pip download --no-deps --no-binary llama-cpp-python llama-cpp-python==0.3.36
    tar xzf llama_cpp_python-0.3.36.tar.gz
    PYTHONPATH=llama_cpp_python-0.3.36/vendor/llama.cpp/gguf-py python3 scripts/mxfp4-reference.py
"""

import json
import pathlib

import numpy as np
from gguf import GGMLQuantizationType, quants

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "data" / "mxfp4_gguf_py.json"
MXFP4 = GGMLQuantizationType.MXFP4


def main():
    rng = np.random.default_rng(39)
    # 64 blocks of values on scales from 1e-4 to 1e2.
    scales = np.repeat(10.0 ** rng.uniform(-4, 2, size=64), 32)
    values = (rng.standard_normal(64 * 32) * scales).astype(np.float32)
    quantized = quants.quantize(values.reshape(1, -1), MXFP4).reshape(-1)
    # Every scale byte but 255, each block with its own pattern of codes.
    synthetic = []
    for e in range(255):
        synthetic.append(e)
        synthetic.extend(((j + e) % 16) | (((3 * j + e) % 16) << 4) for j in range(16))
    synthetic = np.array(synthetic, dtype=np.uint8)
    blocks = np.concatenate([quantized, synthetic])
    dequantized = quants.dequantize(blocks, MXFP4).astype(np.float32).reshape(-1)
    assert dequantized.size == blocks.size // 17 * 32
    OUT.write_text(
        json.dumps(
            {
                "source": "gguf-py of llama.cpp 0c1e570 (llama-cpp-python 0.3.36), scripts/mxfp4-reference.py",
                "quantized_blocks": len(quantized) // 17,
                "blocks": blocks.tobytes().hex(),
                "values": [int(b) for b in dequantized.view(np.uint32)],
            }
        )
        + "\n"
    )
    print(f"wrote {OUT}: {blocks.size // 17} blocks")


if __name__ == "__main__":
    main()
