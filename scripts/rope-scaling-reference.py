#!/usr/bin/env python3
"""Writes the references of thicket's checks against llama.cpp (long-context RoPE, hybrids):
llama.cpp's greedy tokens and every step's logits on a tiny random model, for each case:

- `longrope`: tests/data/phi3_longrope_llamacpp.json, the tiny LongRoPE Phi-3 of
  `tests/model/longrope.rs`, with a context of 256 (within the model's original context: short
  factors) and of 1024 (long factors);
- `yarn`: tests/data/qwen3_yarn_llamacpp.json, the tiny YaRN Qwen3 of `tests/model/yarn.rs`
  (factor 4 over an original context of 256), with a context of 1024;
- `lfm2`: tests/data/lfm2_llamacpp.json, the tiny LFM2 hybrid of `tests/model/lfm2.rs` (short
  convolutions and attention), with a context of 256;
- `qwen35`: tests/data/qwen35_llamacpp.json, the tiny dense Qwen3.5 hybrid of
  `tests/model/qwen35.rs` (Gated DeltaNet and gated attention), with a context of 256;
- `qwen35moe`: tests/data/qwen35moe_llamacpp.json, the same hybrid with routed experts and a
  gated shared expert, with a context of 256;
- `qwen3next`: tests/data/qwen3next_llamacpp.json, the tiny Qwen3-Next of
  `tests/model/qwen3next.rs` (value heads grouped by key head, `ssm_ba`, plain RoPE), with a
  context of 256;
- `qwen3next_ssm_in`: tests/data/qwen3next_ssm_in_llamacpp.json, the same model with the
  DeltaNet input fused in `ssm_in` as the first converter wrote it, with a context of 256;
- `granitehybrid`: tests/data/granitehybrid_llamacpp.json, the tiny Granite 4.0-H of
  `tests/model/granite.rs` (Mamba-2 and attention without RoPE, µP scales), with a context
  of 256;
- `granitehybrid_moe`: tests/data/granitehybrid_moe_llamacpp.json, the same hybrid with routed
  experts beside an ungated shared expert, with a context of 256;
- `granitehybrid_rope`: tests/data/granitehybrid_rope_llamacpp.json, the same shape with RoPE
  on (no `rope.scaling.finetuned` in the file), with a context of 256;
- `gptoss`: tests/data/gptoss_llamacpp.json, the tiny gpt-oss of `tests/model/gptoss.rs`
  (sinks, biases, alternate windowed layers, YaRN, biased experts with the clamped SwiGLU),
  with a context of 256;
- `gptoss_mxfp4`: tests/data/gptoss_mxfp4_llamacpp.json, the same model with its experts in
  MXFP4 (llama.cpp multiplies them by activations quantized to Q8_0), with a context of 256;
- `gemma4`: tests/data/gemma4_llamacpp.json, the tiny Gemma 4 of `tests/model/gemma4.rs`
  (windowed and global layers of different heads, proportional RoPE, values from the keys'
  projection in one layer, keys and values shared by the last two layers, per-layer
  embeddings, output scales, a soft-cap), with a context of 256;
- `gemma4_moe`: tests/data/gemma4_moe_llamacpp.json, the tiny Gemma 4 in 26B-A4B's arrangement
  (a mixture of experts beside every layer's dense MLP, values from the keys' projection in
  every global layer), with a context of 256.

`--build DIR` names the build directory under the source tree (default `build`) and
`--build-note` how it was built, for the record (default: the AVX2 build above).

The file of record was produced with llama.cpp commit 0c1e570 (the copy vendored in
llama-cpp-python 0.3.36), built for the CPU with AVX2 and without AVX-512:

    cmake -B build -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \\
        -DGGML_AVX512=OFF -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release
    cmake --build build --target llama
    scripts/rope-scaling-reference.py --llama-cpp path/to/vendor/llama.cpp [--case NAME]

For each case the script has thicket's test suite write the tiny GGUF (`write_the_reference_gguf`,
an ignored test), compiles `scripts/llamacpp-greedy-logits.cpp` against the library, and runs it
for 33 steps (the prompt, then 32 greedy tokens) in each context, with f32 K/V. llama.cpp's
CPU flash attention (on unless turned off) casts K and V to f16 before attending; the Qwen3.5,
Qwen3-Next and Granite cases turn it off, so their logits are llama.cpp's f32 arithmetic throughout.
"""

import argparse
import hashlib
import json
import os
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROMPT = [5, 17, 123, 42, 250, 3]
STEPS = 33
# name: (the ignored test that writes the GGUF, contexts, output file, flash attention)
CASES = {
    "longrope": ("model::longrope::write_the_reference_gguf", [256, 1024],
                 "tests/data/phi3_longrope_llamacpp.json", True),
    "yarn": ("model::yarn::write_the_reference_gguf", [1024],
             "tests/data/qwen3_yarn_llamacpp.json", True),
    "lfm2": ("model::lfm2::write_the_reference_gguf", [256],
             "tests/data/lfm2_llamacpp.json", True),
    "qwen35": ("model::qwen35::write_the_reference_gguf", [256],
               "tests/data/qwen35_llamacpp.json", False),
    "qwen35moe": ("model::qwen35::write_the_moe_reference_gguf", [256],
                  "tests/data/qwen35moe_llamacpp.json", False),
    "qwen3next": ("model::qwen3next::write_the_reference_gguf", [256],
                  "tests/data/qwen3next_llamacpp.json", False),
    "qwen3next_ssm_in": ("model::qwen3next::write_the_ssm_in_reference_gguf", [256],
                         "tests/data/qwen3next_ssm_in_llamacpp.json", False),
    "granitehybrid": ("model::granite::write_the_reference_gguf", [256],
                      "tests/data/granitehybrid_llamacpp.json", False),
    "granitehybrid_moe": ("model::granite::write_the_moe_reference_gguf", [256],
                          "tests/data/granitehybrid_moe_llamacpp.json", False),
    "granitehybrid_rope": ("model::granite::write_the_rope_reference_gguf", [256],
                           "tests/data/granitehybrid_rope_llamacpp.json", False),
    "gptoss": ("model::gptoss::write_the_reference_gguf", [256],
               "tests/data/gptoss_llamacpp.json", False),
    "gptoss_mxfp4": ("model::gptoss::write_the_mxfp4_reference_gguf", [256],
                     "tests/data/gptoss_mxfp4_llamacpp.json", False),
    "gemma4": ("model::gemma4::write_the_reference_gguf", [256],
               "tests/data/gemma4_llamacpp.json", False),
    "gemma4_moe": ("model::gemma4::write_the_moe_reference_gguf", [256],
                   "tests/data/gemma4_moe_llamacpp.json", False),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-cpp", required=True, help="llama.cpp source tree with build/bin")
    ap.add_argument("--build", default="build", help="build directory under the source tree")
    ap.add_argument("--build-note", default="AVX2 build", help="how the build was made")
    ap.add_argument("--case", choices=sorted(CASES), action="append",
                    help="the cases to write (default: all)")
    args = ap.parse_args()
    src = pathlib.Path(args.llama_cpp).resolve()
    for case in args.case or sorted(CASES):
        write_case(src, args.build, args.build_note, *CASES[case])


def write_case(src, build, note, test, contexts, out, flash_attn):
    lib = src / build / "bin"
    with tempfile.TemporaryDirectory() as tmp:
        gguf = pathlib.Path(tmp) / "tiny.gguf"
        env = dict(os.environ, THICKET_REFERENCE_GGUF=str(gguf))
        subprocess.run(
            ["cargo", "test", "--release", "--test", "tests", "--", "--ignored", "--exact",
             test],
            cwd=ROOT, env=env, check=True)
        tool = pathlib.Path(tmp) / "llamacpp-greedy-logits"
        subprocess.run(
            ["g++", "-O2", "-std=c++17", "-I", str(src / "include"), "-I",
             str(src / "ggml" / "include"), str(ROOT / "scripts/llamacpp-greedy-logits.cpp"),
             "-L", str(lib), "-lllama", "-lggml", "-lggml-base", f"-Wl,-rpath,{lib}",
             "-o", str(tool)],
            check=True)
        runs = []
        flag = [] if flash_attn else ["--no-flash-attn"]
        for n_ctx in contexts:
            printed = subprocess.run(
                [str(tool)] + flag + [str(gguf), str(n_ctx), str(STEPS)]
                + [str(t) for t in PROMPT],
                check=True, capture_output=True, text=True).stdout
            steps = [json.loads(line) for line in printed.splitlines() if line.startswith("{")]
            assert len(steps) == STEPS, f"{len(steps)} steps"
            runs.append({
                "n_ctx": n_ctx,
                "tokens": [s["token"] for s in steps],
                "logits": [[round(x, 6) for x in s["logits"]] for s in steps],
            })
        record = {
            "made_by": "scripts/rope-scaling-reference.py",
            "llama_cpp": f"0c1e570 (llama-cpp-python 0.3.36), {note}, f32 K/V"
                         + ("" if flash_attn else ", no flash attention"),
            "gguf_sha256": hashlib.sha256(gguf.read_bytes()).hexdigest(),
            "prompt": PROMPT,
            "runs": runs,
        }
    (ROOT / out).write_text(json.dumps(record) + "\n")
    for run in runs:
        print(f"{out}, n_ctx {run['n_ctx']}: tokens {run['tokens']}")


if __name__ == "__main__":
    sys.exit(main())
