#!/usr/bin/env python3
"""Serving throughput of thicket against llama-server on the same GGUF, interleaved: for each
round and each concurrency, each server is started fresh (no prefix cache, no learned drafting
state from an earlier round), loaded with `thicket bench serve` on /v1/completions (greedy,
EOS ignored, the round's own prompt order), and stopped; the servers alternate which goes
first from round to round. Prints one line per measurement and a table of the ratios.

    python3 benches/serve_peer.py --model models/gemma3-270m.gguf \\
        --llama-server /path/to/llama-server --concurrency 1,16 --rounds 2
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

THICKET = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "target", "release",
                       "thicket")


def wait_ready(port, timeout=180):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    sys.exit(f"server on port {port} never became ready")


def start(kind, args, concurrency, port):
    if kind == "thicket":
        cmd = [args.thicket, "serve", "--model", args.model, "--port", str(port)]
        cmd += args.thicket_args.split()
    else:
        cmd = [args.llama_server, "-m", args.model, "--port", str(port), "-t", "2",
               "-np", str(concurrency), "-c", str(2048 * concurrency), "--no-warmup"]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def measure(args, port, concurrency, seed):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run(
            [args.thicket, "bench", "serve", "--url", f"http://127.0.0.1:{port}",
             "--endpoint", "/v1/completions", "--num-prompts",
             str(args.prompts_per_client * concurrency), "--max-tokens", str(args.max_tokens),
             "--ignore-eos", "--temperature", "0", "--max-concurrency", str(concurrency),
             "--seed", str(seed), "--out", out.name],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return json.load(open(out.name))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--llama-server", required=True)
    parser.add_argument("--thicket", default=THICKET)
    parser.add_argument("--thicket-args", default="")
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--prompts-per-client", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    results = {}
    for round_ in range(args.rounds):
        for concurrency in [int(c) for c in args.concurrency.split(",")]:
            order = ["thicket", "llama-server"]
            if round_ % 2:
                order.reverse()
            for kind in order:
                port = 18600 + (kind == "llama-server")
                server = start(kind, args, concurrency, port)
                try:
                    wait_ready(port)
                    report = measure(args, port, concurrency, seed=100 + round_)
                finally:
                    server.terminate()
                    server.wait()
                tps = report.get("output_throughput") or report.get("output_token_throughput")
                results.setdefault((concurrency, kind), []).append(tps)
                print(f"round {round_} concurrency {concurrency} {kind}: {tps:.1f} output tok/s",
                      flush=True)
    print("\n| clients | thicket tok/s | llama-server tok/s | ratio |\n|---|---:|---:|---:|")
    for concurrency in [int(c) for c in args.concurrency.split(",")]:
        ours = results[(concurrency, "thicket")]
        theirs = results[(concurrency, "llama-server")]
        ratios = ", ".join(f"{a / b:.2f}x" for a, b in zip(ours, theirs))
        print(f"| {concurrency} | {', '.join(f'{x:.1f}' for x in ours)} | "
              f"{', '.join(f'{x:.1f}' for x in theirs)} | {ratios} |")


if __name__ == "__main__":
    main()
