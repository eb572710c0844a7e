#!/usr/bin/env python3
"""Writes tests/data/gemma3_270m_llamacpp_greedy.json: llama.cpp's greedy continuations of a
fixed set of prompts on the Gemma 3 270M GGUF (alias `gemma3-270m`), the reference
`tests/model/gemma3_real.rs` compares thicket's greedy decoding with.

The tokens of record were produced with llama.cpp commit 0c1e570 (the copy vendored in
llama-cpp-python 0.3.36), built for the CPU with AVX2 and without AVX-512
(`-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF`):

    cmake --build build --target llama-server
    scripts/gemma3-greedy-reference.py \\
        --llama-server build/bin/llama-server \\
        --model models/gemma3-270m.gguf

The script starts llama-server on a loopback port, tokenizes each prompt with its
`/tokenize` (BOS added as the file asks), and asks `/completion` for 32 tokens from those ids
with temperature 0 (greedy), no prompt cache, one slot, two threads, and for the first
generated token the log-probabilities of the 8 likeliest (`n_probs`). The prompt ids, the
generated ids and those log-probabilities are written, with the server's version.
"""

import argparse
import hashlib
import json
import pathlib
import subprocess
import sys
import time
import urllib.request

MODEL_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
TOKENS = 32
PROBS = 8

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village at the edge of a dark forest, there lived",
    "Q: If a train travels 60 miles per hour for 2.5 hours, how far does it go?\nA:",
    "1, 2, 3, 5, 8, 13,",
    "Photosynthesis is the process by which",
    "<start_of_turn>user\nWrite a haiku about autumn leaves.<end_of_turn>\n<start_of_turn>model\n",
    "La capitale de l'Allemagne est",
    "SELECT name, COUNT(*) FROM orders",
    "The three primary colors are",
]


def post(port, path, body):
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--llama-server", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--port", type=int, default=18431)
    parser.add_argument(
        "--out",
        default=str(pathlib.Path(__file__).resolve().parent.parent
                    / "tests/data/gemma3_270m_llamacpp_greedy.json"),
    )
    args = parser.parse_args()
    digest = hashlib.sha256(pathlib.Path(args.model).read_bytes()).hexdigest()
    if digest != MODEL_SHA256:
        sys.exit(f"{args.model}: sha256 {digest}, expected {MODEL_SHA256}")
    version = subprocess.run([args.llama_server, "--version"], capture_output=True,
                             text=True).stderr.strip().splitlines()
    server = subprocess.Popen(
        [args.llama_server, "-m", args.model, "--host", "127.0.0.1", "--port",
         str(args.port), "-t", "2", "-np", "1", "-c", "2048", "--no-warmup"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(120):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{args.port}/health") as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        cases = []
        for text in PROMPTS:
            ids = post(args.port, "/tokenize", {"content": text, "add_special": True,
                                                "parse_special": True})["tokens"]
            out = post(args.port, "/completion", {
                "prompt": ids, "n_predict": TOKENS, "temperature": 0.0, "top_k": 1,
                "cache_prompt": False, "return_tokens": True, "ignore_eos": True,
            })
            first = post(args.port, "/completion", {
                "prompt": ids, "n_predict": 1, "temperature": 0.0, "n_probs": PROBS,
                "cache_prompt": False,
            })["completion_probabilities"][0]["top_logprobs"]
            cases.append({
                "text": text,
                "prompt_ids": ids,
                "greedy_ids": out["tokens"],
                "first_top_logprobs": [[p["id"], p["logprob"]] for p in first],
            })
    finally:
        server.terminate()
        server.wait()
    head = json.dumps({
        "generator": "scripts/gemma3-greedy-reference.py",
        "llama_cpp": [line for line in version if "version" in line or "built" in line],
        "model_sha256": MODEL_SHA256,
        "tokens": TOKENS,
    }, indent=1, ensure_ascii=False)
    # One case per line.
    lines = ",\n  ".join(json.dumps(case, ensure_ascii=False) for case in cases)
    pathlib.Path(args.out).write_text(head[:-2] + ',\n "cases": [\n  ' + lines + "\n ]\n}\n")
    print(f"wrote {len(cases)} cases to {args.out}")


if __name__ == "__main__":
    main()
