#!/usr/bin/env python3
"""Chat beside embeddings on one server: `thicket serve --model CHAT --embedding-model ENCODER`,
16 chat clients (`thicket bench serve`, /v1/completions, greedy, EOS ignored) with and without a
concurrent embedding load (EMBED_CLIENTS threads, each posting batches of BATCH fresh sentences to
/v1/embeddings back to back). Each measurement gets a fresh server (no prefix cache from an
earlier one); the two modes alternate which goes first from round to round. Prints the chat's
inter-token latency (mean, p50, p90, p99) and output tokens/s per mode, and the embedding rate.

    python3 benches/embed_beside_chat.py --chat smollm2-135m --encoder all-minilm-l6-v2 --rounds 2

`--encoder self` has the chat model embed as well (`--task embed`): the embedding requests are
then prefill-only requests of the same engine, scheduled and batched with the chat's steps.
"""

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from embed_peer import sentences, wait_ready  # noqa: E402

THICKET = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "target", "release",
                       "thicket")
PORT = 18441


def embed_load(stop, batch, seed, counter):
    rng = random.Random(seed)
    while not stop.is_set():
        body = json.dumps({"input": sentences(rng, batch)}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{PORT}/v1/embeddings", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            json.load(r)
        counter.append(batch)


def measure(args, with_load, seed):
    # `--encoder self`: the chat model embeds too (`--task embed`), in the same engine.
    pooling = (["--task", "embed"] if args.encoder == "self"
               else ["--embedding-model", args.encoder])
    cmd = ([args.thicket, "serve", "--model", args.chat] + pooling
           + ["--port", str(PORT), "--speculation", "none"] + args.thicket_args.split())
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(PORT)
        stop, done, threads = threading.Event(), [], []
        if with_load:
            threads = [threading.Thread(target=embed_load, args=(stop, args.batch, seed * 100 + i, done))
                       for i in range(args.embed_clients)]
            for t in threads:
                t.start()
            time.sleep(1.0)
        started = time.time()
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            subprocess.run(
                [args.thicket, "bench", "serve", "--url", f"http://127.0.0.1:{PORT}",
                 "--model", args.chat, "--endpoint", "/v1/completions",
                 "--num-prompts", str(args.prompts), "--max-tokens", str(args.max_tokens),
                 "--ignore-eos", "--temperature", "0", "--max-concurrency", str(args.clients),
                 "--seed", str(seed), "--out", out.name],
                check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            result = json.load(open(out.name))
        elapsed = time.time() - started
        stop.set()
        for t in threads:
            t.join()
        return result, sum(done) / elapsed
    finally:
        server.terminate()
        server.wait()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--chat", default="smollm2-135m")
    p.add_argument("--encoder", default="all-minilm-l6-v2")
    p.add_argument("--thicket", default=THICKET)
    p.add_argument("--thicket-args", default="")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--prompts", type=int, default=48)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--embed-clients", type=int, default=2)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    for r in range(args.rounds):
        order = [False, True] if r % 2 == 0 else [True, False]
        for with_load in order:
            result, rate = measure(args, with_load, seed=r + 1)
            itl = result["itl_ms"]
            print(f"round {r} {'with' if with_load else 'without'} embedding load: ITL mean "
                  f"{itl['mean']:.1f} ms, p50 {itl['median']:.1f}, p90 {itl['p90']:.1f}, p99 {itl['p99']:.1f}; "
                  f"{result['output_throughput']:.1f} output tok/s; "
                  f"embeddings {rate:.1f} sentences/s", flush=True)


if __name__ == "__main__":
    main()
