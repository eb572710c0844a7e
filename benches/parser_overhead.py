"""What a reasoning parser costs a streamed answer: two fresh `thicket serve` on the same
model, one with `--reasoning-parser none`, the other with `--reasoning-parser deepseek_r1`,
each warmed on four prompts no measured request uses. Each Spec-Bench question goes to both
with the same body (tools offered, so both read the answer for `hermes` calls; with the
parser every answer also runs through the thinking splitter and the count of thinking
tokens), streamed, greedy, speculation off, the order alternating question by question so
noise and the machine's state favour neither; prints each server's total time and tokens
(the same on both: the same prompts and greedy output) and the ratio.

Usage: python3 benches/parser_overhead.py --model smollm2-135m [--questions 40] [--max-tokens 128]
"""

import argparse
import contextlib
import json
import pathlib
import subprocess
import time
import urllib.request

DATA = pathlib.Path(__file__).parent / "data" / "spec_bench_dev.jsonl"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]


def stream(url, question, max_tokens):
    body = {"messages": [{"role": "user", "content": question}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "speculation": {"method": "none"},
            "stream_options": {"include_usage": True}, "tools": TOOLS}
    request = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    started = time.perf_counter()
    tokens = 0
    with urllib.request.urlopen(request) as response:
        for line in response:
            line = line.decode().strip()
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
    return time.perf_counter() - started, tokens


@contextlib.contextmanager
def server(args, port, extra):
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen([args.thicket, "serve", "--model", args.model, "--port",
                                str(port), *extra], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    try:
        while True:
            try:
                urllib.request.urlopen(url + "/health")
                break
            except OSError:
                if process.poll() is not None:
                    raise SystemExit(f"thicket serve exited with {process.returncode}")
                time.sleep(1)
        for i in range(4):
            stream(url, f"Warm-up {i}: say something short.", 16)
        yield url
    finally:
        process.terminate()
        process.wait()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--thicket", default="target/release/thicket")
    p.add_argument("--port", type=int, default=8310)
    p.add_argument("--questions", type=int, default=40)
    p.add_argument("--max-tokens", type=int, default=128)
    args = p.parse_args()
    questions = [json.loads(line)["turns"][0] for line in DATA.open()][: args.questions]
    configs = {
        "off": ["--reasoning-parser", "none"],
        "parser": ["--reasoning-parser", "deepseek_r1"],
    }
    with server(args, args.port, configs["off"]) as off, \
            server(args, args.port + 1, configs["parser"]) as on:
        urls = {"off": off, "parser": on}
        totals = {name: [0.0, 0] for name in urls}
        for i, question in enumerate(questions):
            order = list(urls) if i % 2 == 0 else list(reversed(urls))
            for name in order:
                seconds, tokens = stream(urls[name], question, args.max_tokens)
                totals[name][0] += seconds
                totals[name][1] += tokens
    for name, (seconds, tokens) in totals.items():
        print(f"{name:8} {seconds:8.2f} s {tokens:6} tokens {tokens / seconds:7.1f} tok/s")
    off_rate = totals["off"][1] / totals["off"][0]
    on_rate = totals["parser"][1] / totals["parser"][0]
    print(f"parser / off, tokens per second: {on_rate / off_rate:.3f}")


if __name__ == "__main__":
    main()
