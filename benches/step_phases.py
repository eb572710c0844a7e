"""Where a serving engine's steps go under load: sends Spec-Bench's questions as chat
completions at a given concurrency to a running `thicket serve` and prints each step phase's
share of the step time over the run (`thicket_engine_step_phase_seconds`: forward, drafting,
lookup, sampling, other), from /metrics before and after. Drafting and lookup together are
what speculation's own work costs per step.

Usage: thicket serve --port 8000 --speculation auto &
       python3 benches/step_phases.py [URL] [CONCURRENCY] [MAX_TOKENS] [QUESTIONS]
"""

import concurrent.futures
import json
import pathlib
import re
import sys
import urllib.request

URL = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000"
CONCURRENCY = int(sys.argv[2]) if len(sys.argv) > 2 else 64
MAX_TOKENS = int(sys.argv[3]) if len(sys.argv) > 3 else 64
QUESTIONS = int(sys.argv[4]) if len(sys.argv) > 4 else 256
DATA = pathlib.Path(__file__).parent / "data" / "spec_bench_dev.jsonl"
PHASE = re.compile(r'^thicket_engine_step_phase_seconds_sum\{phase="(\w+)"\} ([0-9.e+-]+)$')


def phases():
    text = urllib.request.urlopen(f"{URL}/metrics").read().decode()
    out = {}
    for line in text.splitlines():
        m = PHASE.match(line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def ask(question):
    body = {"messages": [{"role": "user", "content": question}], "max_tokens": MAX_TOKENS,
            "temperature": 0}
    request = urllib.request.Request(f"{URL}/v1/chat/completions", json.dumps(body).encode(),
                                      {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(request))["usage"]["completion_tokens"]


def main():
    lines = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]
    questions = [line["turns"][0] for line in lines]
    questions = (questions * (QUESTIONS // len(questions) + 1))[:QUESTIONS]
    before = phases()
    with concurrent.futures.ThreadPoolExecutor(CONCURRENCY) as pool:
        tokens = sum(pool.map(ask, questions))
    after = phases()
    spent = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    total = sum(spent.values())
    print(f"{len(questions)} questions at {CONCURRENCY} clients, {tokens} tokens, "
          f"{total:.1f} s of steps")
    for phase, seconds in sorted(spent.items(), key=lambda kv: -kv[1]):
        print(f"  {phase:9s} {seconds:8.2f} s  {100 * seconds / total:5.1f}%")
    own = spent.get("drafting", 0.0) + spent.get("lookup", 0.0)
    print(f"drafting + lookup: {100 * own / total:.2f}% of step time")


if __name__ == "__main__":
    main()
