#!/usr/bin/env python3
"""KV bytes a long sequence holds on a model with sliding-window layers: serves one completion
whose prompt and output reach `--positions` tokens, polls /metrics while it decodes, and
reports the most blocks in use in each pool (the full-attention layers' and the windowed
layers' own), in bytes, against what one shared pool would hold for the same positions (every
layer keeping every position). Reads the layer counts and the KV row size from the model's
GGUF with PyPI's `gguf`.

    python3 benches/kv_window.py --model gemma3-270m --gguf models/gemma3-270m.gguf \\
        --positions 8192
"""

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request

THICKET = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "target", "release",
                       "thicket")


def gguf_shape(path):
    from gguf import GGUFReader

    reader = GGUFReader(path)
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()

    def field(name):
        return int(reader.fields[f"{arch}.{name}"].parts[-1][0])

    layers = field("block_count")
    kv_heads = field("attention.head_count_kv")
    head_dim = field("attention.key_length")
    return arch, layers, kv_heads, head_dim


def metric(port, name):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.split()[-1])
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gemma3-270m")
    ap.add_argument("--gguf", required=True, help="the same model's GGUF file (for its shape)")
    ap.add_argument("--positions", type=int, default=8192)
    ap.add_argument("--windowed-layers", type=int, default=None,
                    help="layers with a window (default: Gemma 3's five of every six)")
    ap.add_argument("--port", type=int, default=18431)
    ap.add_argument("--thicket", default=THICKET)
    args = ap.parse_args()

    arch, layers, kv_heads, head_dim = gguf_shape(args.gguf)
    windowed = args.windowed_layers
    if windowed is None:
        windowed = layers - layers // 6
    row = 2 * kv_heads * head_dim * 2  # K and V, f16
    out_tokens = 32
    server = subprocess.Popen(
        [args.thicket, "serve", "--model", args.model, "--port", str(args.port),
         "--max-model-len", str(args.positions + 64), "--speculation", "none"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 300
        while time.time() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{args.port}/health", timeout=2)
                break
            except OSError:
                time.sleep(0.5)
        # A prompt of positions - out_tokens tokens, counted by the server's own tokenizer.
        text = " ".join(f"item {i} of the list is {i * 7 % 13}." for i in range(args.positions))
        body = json.dumps({"prompt": text, "add_special_tokens": True}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{args.port}/tokenize", body,
                                     {"Content-Type": "application/json"})
        tokens = json.load(urllib.request.urlopen(req))["tokens"]
        prompt = tokens[: args.positions - out_tokens]
        peak = {"full": 0.0, "window": 0.0}
        done = threading.Event()

        def poll():
            while not done.is_set():
                try:
                    full = metric(args.port, "thicket_kv_blocks_in_use") or 0.0
                    window = metric(args.port, "thicket_kv_window_blocks_in_use") or 0.0
                    peak["full"] = max(peak["full"], full)
                    peak["window"] = max(peak["window"], window)
                except OSError:
                    pass
                time.sleep(0.05)

        poller = threading.Thread(target=poll)
        poller.start()
        body = json.dumps({"model": args.model, "prompt": prompt, "max_tokens": out_tokens,
                           "temperature": 0, "ignore_eos": True}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{args.port}/v1/completions", body,
                                     {"Content-Type": "application/json"})
        started = time.time()
        usage = json.load(urllib.request.urlopen(req, timeout=3600))["usage"]
        done.set()
        poller.join()
        positions = usage["prompt_tokens"] + usage["completion_tokens"]
        full_layers = layers - windowed
        block = 16
        held = (peak["full"] * block * full_layers + peak["window"] * block * windowed) * row
        shared = peak["full"] * block * layers * row
        print(f"{arch}: {layers} layers ({windowed} windowed), KV row {row} bytes per layer "
              f"(f16), {positions} positions, {time.time() - started:.0f}s")
        print(f"peak blocks in use: full pool {peak['full']:.0f}, windowed pool "
              f"{peak['window']:.0f} (blocks of {block})")
        print(f"KV held: {held / 1e6:.1f} MB; one shared pool would hold "
              f"{shared / 1e6:.1f} MB ({shared / max(held, 1):.2f}x)")
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    sys.exit(main())
