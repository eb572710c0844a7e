"""What a Responses or Messages request costs the server against the same chat completion:
sends each Spec-Bench question once per API to a running `thicket serve` (greedy, the same
max tokens, speculation off so that all three decode alike), the APIs in a rotating order
question by question so that the prefix cache and noise favour none of them, and prints
each API's total time and its ratio to chat completions, with the tokens each generated
(they must match: the same prompt and the same greedy output).

Usage: thicket serve --port 8000 &
       python3 benches/api_overhead.py [URL] [QUESTIONS] [MAX_TOKENS]
"""

import json
import pathlib
import sys
import time
import urllib.request

URL = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000"
QUESTIONS = int(sys.argv[2]) if len(sys.argv) > 2 else 24
MAX_TOKENS = int(sys.argv[3]) if len(sys.argv) > 3 else 64
DATA = pathlib.Path(__file__).parent / "data" / "spec_bench_dev.jsonl"
SPEC = {"method": "none"}


def post(path, body):
    request = urllib.request.Request(
        URL + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    started = time.perf_counter()
    answer = json.loads(urllib.request.urlopen(request).read())
    return time.perf_counter() - started, answer


def chat(q):
    t, a = post("/v1/chat/completions", {"messages": [{"role": "user", "content": q}],
                                         "max_tokens": MAX_TOKENS, "temperature": 0,
                                         "speculation": SPEC})
    return t, a["usage"]["completion_tokens"], a["choices"][0]["message"]["content"]


def responses(q):
    t, a = post("/v1/responses", {"input": q, "max_output_tokens": MAX_TOKENS,
                                  "temperature": 0, "store": False, "speculation": SPEC})
    text = "".join(c["text"] for i in a["output"] if i["type"] == "message"
                   for c in i["content"])
    return t, a["usage"]["output_tokens"], text


def messages(q):
    t, a = post("/v1/messages", {"messages": [{"role": "user", "content": q}],
                                 "max_tokens": MAX_TOKENS, "temperature": 0,
                                 "speculation": SPEC})
    text = "".join(b["text"] for b in a["content"] if b["type"] == "text")
    return t, a["usage"]["output_tokens"], text


APIS = {"chat": chat, "responses": responses, "messages": messages}


def main():
    questions = []
    for line in DATA.read_text().splitlines():
        turns = json.loads(line).get("turns") or []
        if turns:
            questions.append(turns[0])
    questions = questions[:QUESTIONS]
    names = list(APIS)
    seconds = {n: 0.0 for n in names}
    tokens = {n: 0 for n in names}
    same = 0
    for i, q in enumerate(questions):
        order = names[i % 3:] + names[:i % 3]
        texts = {}
        for name in order:
            t, n, text = APIS[name](q)
            seconds[name] += t
            tokens[name] += n
            texts[name] = text
        same += len(set(texts.values())) == 1
    print(f"{len(questions)} questions, max_tokens {MAX_TOKENS}; "
          f"identical answers on all three APIs: {same}")
    for name in names:
        print(f"{name:10} {seconds[name]:8.2f} s  {tokens[name]:6} tokens  "
              f"{seconds[name] / seconds['chat']:.3f}x chat")


if __name__ == "__main__":
    main()
