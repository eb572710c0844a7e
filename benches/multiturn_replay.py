#!/usr/bin/env python3
"""A multi-turn chat replayed against thicket and llama-server on the same GGUF: each turn
re-sends the whole history (system prompt, every earlier user turn and answer) with a new
user turn, as chat clients and agents do, over /v1/chat/completions (streamed, greedy, a
fixed number of answer tokens). For each turn it records the time to the first answer token
and how many prompt tokens the server computed rather than served from its cache (thicket:
`usage.prompt_tokens - usage.prompt_tokens_details.cached_tokens`; llama-server:
`timings.prompt_n`). Each server is started fresh for its replay; the two alternate which goes
first from round to round. With `--conversations N`, N conversations sharing the system prompt
take turns (several users, or an agent's sub-tasks, on one server): a server that keeps one
recurrent state per slot must then recompute a conversation's history when it comes back to
it; thicket resumes from the deepest cached block of any of them.

    python3 benches/multiturn_replay.py --model /tmp/lfm2-1.2b-shape.gguf \\
        --llama-server /path/to/llama-server --turns 6 --rounds 2
"""

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request

from serve_peer import wait_ready

THICKET = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "target", "release",
                       "thicket")

# The name requests give the model (thicket checks it against what it serves).
MODEL = [""]

WORDS = ("river stone lantern orchard signal copper meadow harbor violet engine cedar tunnel "
         "falcon mirror basalt thistle ember quarry saddle beacon").split()


def text(seed, words):
    """Deterministic filler of `words` words, different for every seed."""
    state, out = seed * 2654435761 + 12345, []
    for _ in range(words):
        state = (state * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        out.append(WORDS[(state >> 33) % len(WORDS)])
    return " ".join(out)


def start(kind, args, port):
    if kind == "thicket":
        cmd = [args.thicket, "serve", "--model", args.model, "--port", str(port)]
    else:
        cmd = [args.llama_server, "-m", args.model, "--port", str(port), "-t", "2", "-np", "1",
               "-c", "8192", "--no-warmup"]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def turn(port, messages, max_tokens):
    """One streamed request: (seconds to the first answer token, answer text, final chunk)."""
    body = json.dumps({
        "model": MODEL[0], "messages": messages, "max_tokens": max_tokens, "temperature": 0,
        "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True,
    }).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    sent, first, answer, last = time.time(), None, "", {}
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            for choice in chunk.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content") or ""
                if piece and first is None:
                    first = time.time() - sent
                answer += piece
            if chunk.get("usage") or chunk.get("timings"):
                last.update(chunk)
    return first, answer, last


def computed(kind, final):
    if kind == "thicket":
        usage = final.get("usage") or {}
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        return usage.get("prompt_tokens", 0) - cached, usage.get("prompt_tokens", 0)
    timings = final.get("timings") or {}
    total = (final.get("usage") or {}).get("prompt_tokens", 0)
    return timings.get("prompt_n", 0), total


def replay(kind, args, port):
    server = start(kind, args, port)
    try:
        wait_ready(port)
        system = {"role": "system", "content": text(0, args.system_words)}
        # Conversations sharing the system prompt take turns, one turn each in order.
        chats = [[system] for _ in range(args.conversations)]
        rows = []
        for t in range(args.turns):
            messages = chats[t % args.conversations]
            seed = 1 + t * 31 + (t % args.conversations) * 1009
            messages.append({"role": "user", "content": text(seed, args.user_words)})
            ttft, answer, final = turn(port, messages, args.max_tokens)
            done, total = computed(kind, final)
            rows.append((ttft, done, total))
            messages.append({"role": "assistant", "content": answer})
        return rows
    finally:
        server.terminate()
        server.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--thicket", default=THICKET)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--system-words", type=int, default=300)
    ap.add_argument("--user-words", type=int, default=60)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--port", type=int, default=8421)
    ap.add_argument("--conversations", type=int, default=1,
                    help="conversations sharing the system prompt, taking turns")
    args = ap.parse_args()
    MODEL[0] = args.model
    for rnd in range(args.rounds):
        order = ["thicket", "llama-server"] if rnd % 2 == 0 else ["llama-server", "thicket"]
        results = {kind: replay(kind, args, args.port) for kind in order}
        print(f"round {rnd + 1} (first: {order[0]})")
        print("| turn | prompt tokens | thicket computed | llama-server computed "
              "| thicket TTFT s | llama-server TTFT s |")
        print("|---:|---:|---:|---:|---:|---:|")
        for t in range(args.turns):
            (a_ttft, a_done, a_total), (b_ttft, b_done, _) = (results["thicket"][t],
                                                             results["llama-server"][t])
            print(f"| {t + 1} | {a_total} | {a_done} | {b_done} | {a_ttft:.3f} | {b_ttft:.3f} |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
