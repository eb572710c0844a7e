#!/usr/bin/env python3
"""Embedding throughput of thicket against llama-server --embedding on the same weights
(thicket reads the Hugging Face folder, llama-server the GGUF `benches/encoder_gguf.sh` writes
from it), interleaved: each round starts both servers fresh, then for each batch size sends the
round's own sentences (never sent before, so nothing is cached) to /v1/embeddings, `batch`
inputs a request, one request at a time, to one server and then the other, the order
alternating from round to round. Prints sentences per second for each, and their ratio.

    python3 benches/embed_peer.py --model models/all-minilm-l6-v2 --gguf /tmp/minilm-f32.gguf \\
        --llama-server /path/to/llama-server --batches 1,64 --rounds 3
"""

import argparse
import json
import os
import random
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_peer import wait_ready  # noqa: E402

THICKET = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "target", "release",
                       "thicket")

WORDS = ("the a of to and in is was for on with as by at from this that it an be are have has "
         "model server token vector search query document weather city river music garden "
         "engine cache memory kernel batch layer paper theory market price energy water light "
         "quickly slowly quietly brightly carefully often never always sometimes today "
         "running reading writing building measuring sharing learning moving holding finding "
         "blue green large small ancient modern simple complex early late open closed").split()


def sentences(rng, count):
    out = []
    for _ in range(count):
        n = rng.randint(6, 40)
        out.append(" ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + ".")
    return out


def post(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/embeddings",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


def run(port, texts, batch):
    started = time.perf_counter()
    for i in range(0, len(texts), batch):
        answer = post(port, {"input": texts[i:i + batch]})
        assert len(answer["data"]) == len(texts[i:i + batch]), answer
    return len(texts) / (time.perf_counter() - started)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True, help="the Hugging Face folder thicket serves")
    p.add_argument("--gguf", required=True, help="the same weights as GGUF, for llama-server")
    p.add_argument("--llama-server", required=True)
    p.add_argument("--thicket", default=THICKET)
    p.add_argument("--thicket-args", default="")
    p.add_argument("--pooling", default="mean")
    p.add_argument("--batches", default="1,64")
    p.add_argument("--sentences", type=int, default=256, help="sentences per measurement")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    args = p.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    rng = random.Random(1234)
    ratios = {b: [] for b in batches}
    for r in range(args.rounds):
        servers = {
            "thicket": (18431, [args.thicket, "serve", "--model", args.model, "--port", "18431"]
                        + args.thicket_args.split()),
            "llama.cpp": (18432, [args.llama_server, "-m", args.gguf, "--port", "18432",
                                  "--embedding", "--pooling", args.pooling, "-t",
                                  str(args.threads), "-np", "64", "-c", str(64 * 512),
                                  "-b", "8192", "-ub", "8192", "--no-warmup"]),
        }
        procs = [subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                 for _, cmd in servers.values()]
        try:
            for port, _ in servers.values():
                wait_ready(port)
            order = list(servers) if r % 2 == 0 else list(reversed(servers))
            for batch in batches:
                rate = {}
                for name in order:
                    # Warm each server on sentences never measured.
                    run(servers[name][0], sentences(rng, batch), batch)
                    rate[name] = run(servers[name][0], sentences(rng, args.sentences), batch)
                ratio = rate["thicket"] / rate["llama.cpp"]
                ratios[batch].append(ratio)
                print(f"round {r} batch {batch:3d}: thicket {rate['thicket']:8.1f} sent/s, "
                      f"llama.cpp {rate['llama.cpp']:8.1f} sent/s, ratio {ratio:.2f}x", flush=True)
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait()
    for batch in batches:
        print(f"batch {batch}: " + ", ".join(f"{x:.2f}x" for x in ratios[batch]))


if __name__ == "__main__":
    main()
