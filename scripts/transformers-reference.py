#!/usr/bin/env python3
"""Writes the references of thicket's checks against Hugging Face transformers on Qwen3.5,
Qwen3-Next, Granite 4.0-H and gpt-oss HF checkpoints: transformers' greedy tokens and every step's logits on a tiny
random model, for each case:

- `qwen35`: tests/data/qwen35_transformers.json, the tiny dense Qwen3.5 of
  `tests/model/qwen35.rs` written as a `Qwen3_5ForConditionalGeneration` checkpoint;
- `qwen35moe`: tests/data/qwen35moe_transformers.json, the tiny Qwen3.5 mixture written as a
  `Qwen3_5MoeForConditionalGeneration` checkpoint (packed experts);
- `qwen3next`: tests/data/qwen3next_transformers.json, the tiny Qwen3-Next of
  `tests/model/qwen3next.rs` written as a `Qwen3NextForCausalLM` checkpoint (fused
  `in_proj_qkvz` and `in_proj_ba`);
- `granitehybrid`: tests/data/granitehybrid_transformers.json, the tiny Granite 4.0-H of
  `tests/model/granite.rs` written as a `GraniteMoeHybridForCausalLM` checkpoint;
- `granitehybrid_moe`: tests/data/granitehybrid_moe_transformers.json, its mixture;
- `gptoss`: tests/data/gptoss_transformers.json, the tiny gpt-oss of `tests/model/gptoss.rs`
  written as a `GptOssForCausalLM` checkpoint with dense experts (gate and up alternating);
- `gptoss_mxfp4`: tests/data/gptoss_mxfp4_transformers.json, its MXFP4 twin, the experts as
  `*_blocks` and `*_scales` under a `quantization_config` (transformers dequantizes them on
  a CPU without triton kernels, to the values gguf-py reads from the GGUF's blocks);
- `gptoss_untruncated`: tests/data/gptoss_untruncated_transformers.json, the MXFP4 one with
  its YaRN in `rope_parameters` and `truncate: false`, as gpt-oss's configs have it.
- `gemma4`: tests/data/gemma4_transformers.json, the tiny Gemma 4 of `tests/model/gemma4_hf.rs`
  written as a `Gemma4ForCausalLM` checkpoint (global layers' heads in `per_layer_config`,
  per-layer embeddings, shared keys and values, doubled MLPs); no llama.cpp record has these
  weights (the GGUF of record has values from the keys' projection on one global layer only,
  which a checkpoint cannot say);
- `gemma4_moe`: tests/data/gemma4_moe_transformers.json, the tiny mixture, whose llama.cpp
  record it is checked against within 4e-3 of the logits' scale (llama.cpp's CPU GELU reads
  a table of f16 values).

The MXFP4 cases have no llama.cpp record to agree with: llama.cpp's MXFP4 product takes its
activations in 8-bit blocks, which moves its first logits by up to 3% of their scale from
transformers' f32 product on the same values (and llama.cpp always rounds YaRN's ramp).

Each is the model of a llama.cpp record (`tests/data/<case>_llamacpp.json`: the same drawn
weights, laid out as HF checkpoints by `write_tiny_qwen35_hf`, `write_tiny_qwen3next_hf` or
`write_tiny_granite_hf`), so transformers'
greedy tokens equal llama.cpp's and its logits agree with them (checked here).

The files of record were produced on the CPU with Python 3.11 and

    pip install torch==2.15.0 transformers==5.23.0

(the script installs nothing; no `fla`, `causal-conv1d` or `mamba-ssm`, so transformers' own
torch Gated DeltaNet, Mamba-2 and convolution run). For each case the script has thicket's test suite write the
checkpoint (`write_the_hf_reference`, an ignored test), loads it with the model's own class
(no text weight missing or unexpected, nor any other: the tiny vision tower is complete),
and runs the protocol of scripts/llamacpp-greedy-logits.cpp in float32 with eager attention:
the prompt as one forward, then 32 greedy tokens one at a time on transformers' cache.
"""

import argparse
import hashlib
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import torch
import transformers

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROMPT = [5, 17, 123, 42, 250, 3]
STEPS = 33
N_CTX = 256
# llama.cpp records agreed with within more than 1e-4 of their logits' scale, and why:
# llama.cpp's CPU GELU reads a table of f16 values (GGML_GELU_FP16).
LOOSER = {"tests/data/gemma4_moe_llamacpp.json": 4e-3}
# name: (the ignored test that writes the checkpoint, the model class, output, llama.cpp's)
CASES = {
    "qwen35": ("model::qwen35_hf::write_the_hf_reference",
               "Qwen3_5ForConditionalGeneration", "tests/data/qwen35_transformers.json",
               "tests/data/qwen35_llamacpp.json"),
    "qwen35moe": ("model::qwen35_hf::write_the_moe_hf_reference",
                  "Qwen3_5MoeForConditionalGeneration",
                  "tests/data/qwen35moe_transformers.json",
                  "tests/data/qwen35moe_llamacpp.json"),
    "qwen3next": ("model::qwen3next_hf::write_the_hf_reference", "Qwen3NextForCausalLM",
                  "tests/data/qwen3next_transformers.json",
                  "tests/data/qwen3next_llamacpp.json"),
    "gemma4": ("model::gemma4_hf::write_the_hf_reference", "Gemma4ForCausalLM",
               "tests/data/gemma4_transformers.json", None),
    "gemma4_moe": ("model::gemma4_hf::write_the_moe_hf_reference", "Gemma4ForCausalLM",
                   "tests/data/gemma4_moe_transformers.json",
                   "tests/data/gemma4_moe_llamacpp.json"),
    "granitehybrid": ("model::granite_hf::write_the_hf_reference",
                      "GraniteMoeHybridForCausalLM",
                      "tests/data/granitehybrid_transformers.json",
                      "tests/data/granitehybrid_llamacpp.json"),
    "granitehybrid_moe": ("model::granite_hf::write_the_moe_hf_reference",
                          "GraniteMoeHybridForCausalLM",
                          "tests/data/granitehybrid_moe_transformers.json",
                          "tests/data/granitehybrid_moe_llamacpp.json"),
    "gptoss": ("model::gptoss_hf::write_the_hf_reference", "GptOssForCausalLM",
               "tests/data/gptoss_transformers.json", "tests/data/gptoss_llamacpp.json"),
    "gptoss_mxfp4": ("model::gptoss_hf::write_the_mxfp4_hf_reference", "GptOssForCausalLM",
                     "tests/data/gptoss_mxfp4_transformers.json", None),
    "gptoss_untruncated": ("model::gptoss_hf::write_the_untruncated_hf_reference",
                           "GptOssForCausalLM",
                           "tests/data/gptoss_untruncated_transformers.json", None),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", choices=sorted(CASES), action="append",
                    help="the cases to write (default: all)")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(2)
    for case in args.case or sorted(CASES):
        write_case(*CASES[case])


def load(directory, class_name):
    """The checkpoint in `directory` as `class_name`, asserting every weight was read."""
    cls = getattr(transformers, class_name)
    model, info = cls.from_pretrained(directory, dtype=torch.float32, attn_implementation="eager",
                                      output_loading_info=True)
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        assert not info.get(kind), f"{class_name}: {kind} {info[kind]}"
    return model.eval()


@torch.no_grad()
def greedy(model):
    """33 steps: the prompt as one forward, then each greedy token alone, on the cache."""
    tokens, logits = [], []
    past = None
    fed = PROMPT
    for _ in range(STEPS):
        out = model(input_ids=torch.tensor([fed]), past_key_values=past, use_cache=True)
        past = out.past_key_values
        row = out.logits[0, -1].float()
        best = int(torch.argmax(row))
        tokens.append(best)
        logits.append([round(float(x), 6) for x in row])
        fed = [best]
    return tokens, logits


def agreement(logits, tokens, llamacpp):
    """The largest logit difference from llama.cpp's record, its logits' scale, and whether
    the greedy tokens are the same."""
    reference = json.loads((ROOT / llamacpp).read_text())["runs"][0]
    worst = max(abs(a - b) for ours, theirs in zip(logits, reference["logits"])
                for a, b in zip(ours, theirs))
    scale = max(abs(x) for row in reference["logits"] for x in row)
    return worst, scale, tokens == reference["tokens"]


def write_case(test, class_name, out, llamacpp):
    with tempfile.TemporaryDirectory() as tmp:
        directory = pathlib.Path(tmp) / "tiny"
        env = dict(os.environ, THICKET_REFERENCE_HF=str(directory))
        subprocess.run(
            ["cargo", "test", "--release", "--test", "tests", "--", "--ignored", "--exact",
             test],
            cwd=ROOT, env=env, check=True)
        tokens, logits = greedy(load(directory, class_name))
        record = {
            "made_by": "scripts/transformers-reference.py",
            "transformers": f"{transformers.__version__} (torch {torch.__version__}), CPU, "
                            "float32, eager attention, torch recurrences",
            "safetensors_sha256": hashlib.sha256(
                (directory / "model.safetensors").read_bytes()).hexdigest(),
            "prompt": PROMPT,
            "runs": [{"n_ctx": N_CTX, "tokens": tokens, "logits": logits}],
        }
    (ROOT / out).write_text(json.dumps(record) + "\n")
    print(f"{out}: tokens {tokens}")
    if llamacpp is None:
        return
    worst, scale, same = agreement(logits, tokens, llamacpp)
    print(f"  against {llamacpp}: same tokens {same}, max |difference| {worst:.3g} "
          f"against logits up to {scale:.3g}")
    assert same and worst <= LOOSER.get(llamacpp, 1e-4) * scale, \
        "transformers and llama.cpp disagree"


if __name__ == "__main__":
    sys.exit(main())
