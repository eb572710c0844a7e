#!/usr/bin/env python3
"""The code edits of `thicket bench edits` against OpenAI-compatible servers, alternating:
each edit goes to every server in turn (the order rotating edit by edit, so the host's noise
falls on all alike), as one chat request with the instruction and the whole file, greedy,
`max_tokens` of 1.5 times the file's tokens plus 64 (counted by the server's own /tokenize
where it has one, else 4 characters a token), streamed so that the time to the first token
is seen. A server named with `+prediction` gets the file before as `prediction`.

Prints per server: total wall time, end-to-end speedup against the first server, decoding
speedup (tokens after the first over the time after the first token), mean TTFT, and how
many outputs equal the commit's file (fences and trailing whitespace stripped).

Usage:
    python3 benches/edits_peer.py --limit 16 \\
        thicket+prediction=http://127.0.0.1:8000 llama-ngram-mod=http://127.0.0.1:8081
Needs only the standard library.
"""

import argparse
import json
import time
import urllib.request


def normalized(text):
    lines = text.strip().splitlines()
    if lines and lines[0].lstrip().startswith("```"):
        lines = lines[1:]
        ends = [i for i, line in enumerate(lines) if line.strip() == "```"]
        if ends:
            lines = lines[: ends[-1]]
    return "\n".join(line.rstrip() for line in lines).rstrip()


def prompt(edit):
    return (
        f"{edit['instruction']}\n\nApply this change to the file `{edit['path']}` below. Reply with the whole "
        f"updated file only.\n\n```{edit['language']}\n{edit['before']}```"
    )


def post(url, body, stream=False):
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    return urllib.request.urlopen(request, timeout=3600)


def count_tokens(base, text):
    try:
        with post(f"{base}/tokenize", {"content": text, "prompt": text}) as r:
            body = json.load(r)
        return len(body.get("tokens", []))
    except Exception:  # noqa: BLE001 - servers without /tokenize
        return len(text) // 4


def run(base, edit, max_tokens, prediction):
    body = {
        "messages": [{"role": "user", "content": prompt(edit)}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if prediction:
        body["prediction"] = {"type": "content", "content": edit["before"]}
    started = time.perf_counter()
    first, text, usage = None, "", None
    with post(f"{base}/v1/chat/completions", body) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            for choice in chunk.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    first = first or time.perf_counter()
                    text += piece
            usage = chunk.get("usage") or usage
    done = time.perf_counter()
    first = first or done
    tokens = (usage or {}).get("completion_tokens", 0)
    return {"seconds": done - started, "ttft": first - started, "tokens": tokens, "text": text}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="benches/data/code_edits.jsonl")
    parser.add_argument("--limit", type=int)
    parser.add_argument("--skip", type=int, default=0)
    parser.add_argument("--every", type=int, default=1, help="take every Nth edit only")
    parser.add_argument("--out")
    parser.add_argument("servers", nargs="+", help="NAME=BASE_URL (NAME ending in +prediction sends it)")
    args = parser.parse_args()
    servers = [s.split("=", 1) for s in args.servers]
    edits = [json.loads(line) for line in open(args.dataset) if line.strip()][args.skip :: args.every]
    if args.limit:
        edits = edits[: args.limit]
    results = {name: [] for name, _ in servers}
    for i, edit in enumerate(edits):
        max_tokens = count_tokens(servers[0][1], edit["before"]) * 3 // 2 + 64
        order = servers[i % len(servers) :] + servers[: i % len(servers)]
        if (i // len(servers)) % 2:
            order.reverse()
        for name, base in order:
            m = run(base, edit, max_tokens, name.endswith("+prediction"))
            m["equal"] = normalized(m["text"]) == normalized(edit["after"])
            m["edit"] = edit["id"]
            results[name].append(m)
        print(f"\r{i + 1} of {len(edits)} edits", end="", flush=True)
    print()
    base = results[servers[0][0]]
    total = lambda ms, key: sum(m[key] for m in ms)  # noqa: E731

    def rate(ms):
        return sum(max(m["tokens"] - 1, 0) for m in ms) / max(sum(m["seconds"] - m["ttft"] for m in ms), 1e-9)

    print("| server | wall s | end to end | decoding | mean TTFT s | equals reference |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, _ in servers:
        ms = results[name]
        print(
            f"| {name} | {total(ms, 'seconds'):.1f} | {total(base, 'seconds') / total(ms, 'seconds'):.2f}x | "
            f"{rate(ms) / rate(base):.2f}x | {total(ms, 'ttft') / len(ms):.2f} | "
            f"{sum(m['equal'] for m in ms)} of {len(ms)} |"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
