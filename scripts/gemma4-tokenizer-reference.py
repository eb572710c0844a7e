#!/usr/bin/env python3
"""Writes tests/data/gemma4_tokenizer_llamacpp.json: llama.cpp's token ids (`llama-tokenize
--ids --no-bos`, no special tokens parsed) for texts that stress Gemma 4's split at newline
runs (runs of 1 to 39, 48, 64 and 100 newlines alone, between words, after spaces) and a few
of code, whitespace and scripts, on llama.cpp's own Gemma 4 vocabulary
(`models/ggml-vocab-gemma-4.gguf` of the llama-cpp-python 0.3.36 sdist, which
`tests/model/gemma4_tokenizer.rs` fetches under target/). The file of record was made with
llama.cpp from that sdist, `llama-tokenize` built with CMake:

    python3 scripts/gemma4-tokenizer-reference.py --llama-tokenize BUILD/bin/llama-tokenize \\
        --vocab target/e2e-python/llama-cpp-0.3.36/models/ggml-vocab-gemma-4.gguf
"""

import argparse
import hashlib
import json
import pathlib
import subprocess

ROOT = pathlib.Path(__file__).resolve().parent.parent


def texts():
    out = []
    for n in list(range(1, 40)) + [48, 64, 100]:
        out += ["a" + "\n" * n + "b", "\n" * n, "x \n" + "\n" * n + "  y"]
    out += [
        "def f(x):\n    return x\n\n\n# end\n",
        "  \n \n  \n",
        "\r\n\r\n",
        "Hello" + "\n" * 36 + "World",
        "tab\t\t\ttab",
        "emoji 🦙🦙 ok",
        "日本語\n\n中文",
        "    indented\n        more\n",
    ]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-tokenize", required=True)
    ap.add_argument("--vocab", required=True)
    args = ap.parse_args()
    cases = []
    for text in texts():
        run = subprocess.run([args.llama_tokenize, "-m", args.vocab, "-p", text, "--ids",
                              "--no-bos", "--log-disable"],
                             capture_output=True, text=True, check=True)
        cases.append({"text": text, "ids": json.loads(run.stdout.strip().splitlines()[-1])})
    record = {
        "made_by": "scripts/gemma4-tokenizer-reference.py",
        "llama_cpp": "llama-cpp-python 0.3.36 sdist, llama-tokenize --ids --no-bos",
        "vocab_sha256": hashlib.sha256(pathlib.Path(args.vocab).read_bytes()).hexdigest(),
        "cases": cases,
    }
    out = ROOT / "tests/data/gemma4_tokenizer_llamacpp.json"
    out.write_text(json.dumps(record, ensure_ascii=False, indent=0) + "\n")
    print(f"{out}: {len(cases)} texts")


if __name__ == "__main__":
    main()
