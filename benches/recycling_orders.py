"""How well Token Recycling's matrix could guess the next token if it were keyed by the last
one, two or three tokens instead of the last one only, on the model's own greedy answers.

Sends Spec-Bench questions in turn to a running `thicket serve` (greedy, speculation off, the
top 8 log-probabilities of every output token), then replays the answers in order through
tables keyed by the last n tokens fed (n = 1..ORDER, backing off to shorter keys where a
longer one was never seen). Each table entry is the top 8 of the row that fed that key, last
write wins, as the matrix keeps them; the first WARM answers only fill the tables. For every
position after that it prints how often the first candidate is the next token, by the order
that answered, and whether the request's own earlier output held a match (a suffix of up to 8
tokens seen before in that answer: what the per-request context source finds), so that what a
longer key adds beside the context source shows apart. Prompt rows, which the matrix also
learns from, are not replayed.

Usage: thicket serve --port 8000 &
       python3 benches/recycling_orders.py [URL] [QUESTIONS] [MAX_TOKENS] [WARM] [ORDER]
"""

import collections
import json
import pathlib
import sys
import urllib.request

URL = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000"
QUESTIONS = int(sys.argv[2]) if len(sys.argv) > 2 else 160
MAX_TOKENS = int(sys.argv[3]) if len(sys.argv) > 3 else 128
WARM = int(sys.argv[4]) if len(sys.argv) > 4 else QUESTIONS // 2
ORDER = int(sys.argv[5]) if len(sys.argv) > 5 else 3
DATA = pathlib.Path(__file__).parent / "data" / "spec_bench_dev.jsonl"
START = "<start>"


def answer(question):
    """The greedy answer's tokens and each position's top 8, as token strings."""
    body = {"messages": [{"role": "user", "content": question}], "max_tokens": MAX_TOKENS,
            "temperature": 0, "logprobs": True, "top_logprobs": 8,
            "speculation": {"method": "none"}}
    request = urllib.request.Request(f"{URL}/v1/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    content = json.load(urllib.request.urlopen(request))["choices"][0]["logprobs"]["content"]
    return [c["token"] for c in content], [[t["token"] for t in c["top_logprobs"]]
                                           for c in content]


def own_match(tokens, j):
    """The token after the longest suffix (up to 8) of tokens[:j + 1] seen earlier in them."""
    for length in range(min(8, j), 0, -1):
        suffix = tokens[j + 1 - length:j + 1]
        for start in range(j - length, -1, -1):
            if tokens[start:start + length] == suffix:
                return tokens[start + length]
    return None


def replay(answers, max_order):
    """Counts of (order that answered, own context matched, first candidate right)."""
    tables = [{} for _ in range(max_order)]
    counts = collections.Counter()
    for index, (tokens, tops) in enumerate(answers):
        tokens = [START] + tokens
        # The row that fed tokens[j] gave tops[j]: the distribution of tokens[j + 1].
        for j, top in enumerate(tops):
            if index >= WARM and j >= 1:
                guess, order = None, 0
                for n in range(min(max_order, j + 1), 0, -1):
                    key = tuple(tokens[j + 1 - n:j + 1])
                    if key in tables[n - 1]:
                        guess, order = tables[n - 1][key][0], n
                        break
                own = own_match(tokens, j)
                counts[(order, own is not None, guess == tokens[j + 1])] += 1
            for n in range(1, min(max_order, j + 1) + 1):
                tables[n - 1][tuple(tokens[j + 1 - n:j + 1])] = top
    return counts


def main():
    lines = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]
    answers = [answer(line["turns"][0]) for line in lines[:QUESTIONS]]
    counts = replay(answers, ORDER)
    total = sum(counts.values())
    print(f"{len(answers)} answers, the first {WARM} only learnt; {total} positions guessed")
    print("| key | own context matched | positions | first candidate right |")
    print("|---|---|---:|---:|")
    for order in range(ORDER, -1, -1):
        for own in (True, False):
            right = counts[(order, own, True)]
            seen = right + counts[(order, own, False)]
            if seen:
                key = f"last {order}" if order else "never seen"
                print(f"| {key} | {'yes' if own else 'no'} | {seen} | {right / seen:.2f} |")
    for order in range(1, ORDER + 1):
        counts = replay(answers, order)
        right = sum(v for (_, _, hit), v in counts.items() if hit)
        alone = sum(v for (_, own, hit), v in counts.items() if hit and not own)
        print(f"keys of up to {order} token(s): first candidate right at {right / total:.3f} "
              f"of positions, {alone / total:.3f} where the own context has no match")


if __name__ == "__main__":
    main()
