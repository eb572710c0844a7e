#!/usr/bin/env python3
"""Writes tests/data/minilm_llamacpp.json: llama.cpp's embeddings of all-MiniLM-L6-v2 for a
set of sentences, and the ids its tokenizer gives them, from llama-server in embedding mode
(`--embedding --pooling mean`, normalized as its /v1/embeddings gives them) on the GGUF that
llama.cpp's own converter writes from the model's folder (`benches/encoder_gguf.sh`, f32).

The file of record was made with llama.cpp 0c1e570 (the llama-cpp-python 0.3.36 sdist's
vendor/llama.cpp, built with cmake -DGGML_NATIVE=ON) and its converter run by Python 3.11 with
torch 2.15.0 and transformers 5.23.0 (the script installs nothing):

    python3 scripts/llamacpp-embeddings.py --llama-cpp LLAMA_CPP_DIR \\
        --model models/all-minilm-l6-v2
"""

import argparse
import json
import os
import pathlib
import subprocess
import tempfile
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "minilm_llamacpp.json"
SENTENCES = [
    "The weather is lovely today.",
    "It's so sunny outside!",
    "He drove to the stadium.",
    "A man is playing a guitar on the stage while the crowd sings along.",
    "Paged attention stores keys and values in fixed-size blocks.",
    "x",
    "How do I bake sourdough bread at home without a Dutch oven?",
    "Unbelievably, the tokenizer's WordPiece splits rare-words into ##pieces.",
]
PORT = 18451


def post(path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{PORT}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-cpp", required=True, help="llama.cpp's source tree, built in build/")
    ap.add_argument("--model", required=True, help="the all-MiniLM-L6-v2 folder")
    ap.add_argument("--python", default="python3", help="Python with torch and transformers")
    args = ap.parse_args()
    llama = pathlib.Path(args.llama_cpp)
    with tempfile.TemporaryDirectory() as tmp:
        gguf = os.path.join(tmp, "minilm-f32.gguf")
        subprocess.run([str(ROOT / "benches" / "encoder_gguf.sh"), str(llama), args.model, gguf,
                        "f32"], check=True, env={**os.environ, "PYTHON": args.python})
        bin_dir = llama / "build" / "bin"
        server = subprocess.Popen(
            [str(bin_dir / "llama-server"), "-m", gguf, "--port", str(PORT), "--embedding",
             "--pooling", "mean", "-c", "512", "-b", "512", "-ub", "512", "-t", "2"],
            env={**os.environ, "LD_LIBRARY_PATH": str(bin_dir)},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(600):
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=2) as r:
                        if r.status == 200:
                            break
                except OSError:
                    time.sleep(0.2)
            records = []
            for text in SENTENCES:
                ids = post("/tokenize", {"content": text, "add_special": True})["tokens"]
                emb = post("/v1/embeddings", {"input": text})["data"][0]["embedding"]
                records.append({"text": text, "ids": ids, "embedding": emb})
        finally:
            server.terminate()
            server.wait()
    OUT.write_text(json.dumps({"llama.cpp": "0c1e570 (llama-cpp-python 0.3.36)",
                               "pooling": "mean", "records": records}) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
