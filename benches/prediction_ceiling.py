"""The ceiling of speculation on a model: how much faster greedy decoding gets when every draft
is right. A fresh `thicket serve` decodes the requests with speculation off and keeps their
outputs; a second fresh server decodes the same requests with each output given as the
request's Predicted Output (`prediction`), so the drafts come from the answer itself and the
planner decides how many of them each step verifies. Prints tokens/s of both and the ratio, per
concurrency level. For a random-weight model, whose drafts from real text are never accepted,
this is the only measure of what its cost curve leaves speculation.

Usage: python3 benches/prediction_ceiling.py --model FILE [--thicket target/release/thicket]
           [--levels 1,16] [--max-tokens 64] [--port 8013]
"""

import argparse
import concurrent.futures
import json
import time
import urllib.request

from methods_vs_none import PROMPTS, fresh_server  # the `bench engine` prompts, a warmed server


def post(url, body):
    request = urllib.request.Request(f"{url}/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(request))


def timed(url, bodies, clients):
    started = time.time()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        answers = list(pool.map(lambda b: post(url, b), bodies))
    seconds = time.time() - started
    tokens = sum(a["usage"]["completion_tokens"] for a in answers)
    return answers, tokens / seconds


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--thicket", default="target/release/thicket")
    p.add_argument("--levels", default="1,16")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--port", type=int, default=8013)
    args = p.parse_args()
    print("| clients | plain, tokens/s | every draft right, tokens/s | ratio |")
    print("|---:|---:|---:|---:|")
    for clients in [int(v) for v in args.levels.split(",")]:
        requests = max(clients, 4)
        plain = [{"prompt": f"{1000 + i} {PROMPTS[i % len(PROMPTS)]}",
                  "max_tokens": args.max_tokens, "temperature": 0, "ignore_eos": True,
                  "speculation": {"method": "none"}} for i in range(requests)]
        with fresh_server(args) as url:
            answers, plain_rate = timed(url, plain, clients)
        predicted = [dict(body, speculation={"method": "auto"},
                          prediction={"type": "content", "content": a["choices"][0]["text"]})
                     for body, a in zip(plain, answers)]
        with fresh_server(args) as url:
            again, predicted_rate = timed(url, predicted, clients)
        same = all(a["choices"][0]["text"] == b["choices"][0]["text"]
                   for a, b in zip(answers, again))
        print(f"| {clients} | {plain_rate:.1f} | {predicted_rate:.1f} | "
              f"{predicted_rate / plain_rate:.2f}x |" + ("" if same else " (outputs differ!)"),
              flush=True)


if __name__ == "__main__":
    main()
