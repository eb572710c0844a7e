"""Every speculation method against `none`, each in a fresh server: for each concurrency level
and each method, starts `thicket serve`, warms it on four prompts no measured request uses,
sends the level's requests (greedy, a fixed number of tokens, the request's
`speculation.method`), reads the server's speculation counters, and stops it. Every method in
a round gets the same prompts: the `bench engine` prompts, each made distinct by its request
number, so no two requests share a prefix or a continuation. At 1 client the requests run one
after another; at N clients, N at once. Prints one line per run and a table of tokens/s with
each method's ratio to `none` in the same round.

Usage: python3 benches/methods_vs_none.py --model FILE [--thicket target/release/thicket]
           [--levels 1,16,64] [--methods none,auto,suffix,recycling,ngram_trie,prompt_lookup]
           [--max-tokens 64] [--round 1] [--reverse] [--port 8011]
"""

import argparse
import concurrent.futures
import contextlib
import json
import re
import subprocess
import time
import urllib.request

PROMPTS = [
    "The history of the printing press begins",
    "def merge_sort(items):\n",
    "Write a short story about a lighthouse keeper who",
    "The three most important ideas in thermodynamics are",
    "Q: Why is the sky blue?\nA:",
    "Once upon a time in a city built on water,",
    "A recipe for bread needs flour, water, salt and",
    "The best way to learn a new language is",
]
COUNTER = re.compile(r"^thicket_spec_(draft|accepted)_tokens_total\{[^}]*\} ([0-9.e+-]+)$")


def counters(url):
    text = urllib.request.urlopen(f"{url}/metrics").read().decode()
    found = {"draft": 0.0, "accepted": 0.0}
    for line in text.splitlines():
        m = COUNTER.match(line)
        if m:
            found[m.group(1)] += float(m.group(2))
    return found


def ask(url, number, max_tokens, method):
    body = {"prompt": f"{number} {PROMPTS[number % len(PROMPTS)]}", "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "speculation": {"method": method}}
    request = urllib.request.Request(f"{url}/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(request))["usage"]["completion_tokens"]


@contextlib.contextmanager
def fresh_server(args):
    """A fresh `thicket serve --model args.model` on `args.port`, warmed on four prompts no
    measured request uses; yields its URL and stops it after."""
    url = f"http://127.0.0.1:{args.port}"
    server = subprocess.Popen([args.thicket, "serve", "--model", args.model, "--port",
                               str(args.port)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        while True:
            try:
                urllib.request.urlopen(f"{url}/health")
                break
            except OSError:
                if server.poll() is not None:
                    raise SystemExit(f"thicket serve exited with {server.returncode}")
                time.sleep(1)
        for i in range(4):
            ask(url, 9000 + i, 8, "none")
        yield url
    finally:
        server.terminate()
        server.wait()


def run(args, clients, method):
    with fresh_server(args) as url:
        requests = max(clients, 4)
        first = 1000 * args.round
        before = counters(url)
        started = time.time()
        with concurrent.futures.ThreadPoolExecutor(clients) as pool:
            tokens = sum(pool.map(lambda i: ask(url, first + i, args.max_tokens, method),
                                  range(requests)))
        seconds = time.time() - started
        after = counters(url)
    drafted = after["draft"] - before["draft"]
    accepted = after["accepted"] - before["accepted"]
    return tokens / seconds, drafted, accepted


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--thicket", default="target/release/thicket")
    p.add_argument("--levels", default="1,16,64")
    p.add_argument("--methods", default="none,auto,suffix,recycling,ngram_trie,prompt_lookup")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--round", type=int, default=1, help="picks the round's prompts")
    p.add_argument("--reverse", action="store_true", help="run the methods in reverse order")
    p.add_argument("--port", type=int, default=8011)
    args = p.parse_args()
    methods = args.methods.split(",")
    if args.reverse:
        methods.reverse()
    table = {}
    for level in [int(v) for v in args.levels.split(",")]:
        for method in methods:
            rate, drafted, accepted = run(args, level, method)
            table[(level, method)] = rate
            print(f"{level:>3} clients, {method:<14} {rate:8.1f} tokens/s, "
                  f"{drafted:.0f} drafted, {accepted:.0f} accepted", flush=True)
    print("\n| clients | " + " | ".join(sorted(methods)) + " |")
    print("|---:|" + "---:|" * len(methods))
    for level in sorted({lv for lv, _ in table}):
        base = table.get((level, "none"))
        cells = []
        for method in sorted(methods):
            rate = table[(level, method)]
            cells.append(f"{rate:.1f}" + (f" ({rate / base:.2f}x)" if base else ""))
        print(f"| {level} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
