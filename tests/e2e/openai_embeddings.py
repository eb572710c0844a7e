"""The real thicket server serving an encoder (all-MiniLM-L6-v2), driven by the official
`openai` client: `embeddings.create` in its default base64 encoding and in floats, token-id
input, usage, the published similarities, a 400 for an empty input list and for chat on an
embedding model; and `/v1/rerank` and `/v1/score` over raw httpx.

Usage: python3 openai_embeddings.py BASE_URL API_KEY MODEL
Exits non-zero (with the failed check) on the first failure.
"""

import math
import sys

import httpx
import openai

BASE, KEY, MODEL = sys.argv[1], sys.argv[2], sys.argv[3]
client = openai.OpenAI(base_url=f"{BASE}/v1", api_key=KEY, max_retries=0, timeout=120)
checks = 0


def check(condition, what):
    global checks
    if not condition:
        raise AssertionError(what)
    checks += 1


def cos(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


SENTENCES = ["The weather is lovely today.", "It's so sunny outside!", "He drove to the stadium."]

# The client asks for base64 unless told otherwise, and decodes it.
default = client.embeddings.create(model=MODEL, input=SENTENCES)
check(len(default.data) == 3, f"{len(default.data)} embeddings")
check([d.index for d in default.data] == [0, 1, 2], "indices")
check(all(len(d.embedding) == 384 for d in default.data), "width 384")
check(default.model == MODEL, f"model {default.model}")
check(default.usage.prompt_tokens > 20 and default.usage.total_tokens == default.usage.prompt_tokens,
      f"usage {default.usage}")
floats = client.embeddings.create(model=MODEL, input=SENTENCES, encoding_format="float")
for a, b in zip(default.data, floats.data):
    check(max(abs(x - y) for x, y in zip(a.embedding, b.embedding)) < 1e-6, "base64 and float agree")
e = [d.embedding for d in floats.data]
for (i, j, published) in [(0, 1, 0.6660), (0, 2, 0.1046), (1, 2, 0.1411)]:
    got = cos(e[i], e[j])
    check(abs(got - published) < 6e-4, f"similarity {i},{j}: {got} against {published}")

one = client.embeddings.create(model=MODEL, input="The weather is lovely today.")
check(cos(one.data[0].embedding, e[0]) > 0.99999, "a single string")
ids = client.embeddings.create(model=MODEL, input=[101, 1996, 4633, 2003, 8403, 2651, 1012, 102])
check(cos(ids.data[0].embedding, e[0]) > 0.99999, "token ids")

try:
    client.embeddings.create(model=MODEL, input=[])
    check(False, "an empty input list was accepted")
except openai.BadRequestError as err:
    check(err.status_code == 400 and "input" in str(err), f"empty input: {err}")
try:
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    check(False, "chat on an embedding model was accepted")
except openai.BadRequestError as err:
    check("embedding model" in str(err), f"chat: {err}")

headers = {"Authorization": f"Bearer {KEY}"}
r = httpx.post(f"{BASE}/v1/rerank", headers=headers, timeout=60, json={
    "model": MODEL, "query": SENTENCES[0], "documents": SENTENCES[1:], "top_n": 1})
check(r.status_code == 200, f"rerank {r.status_code} {r.text}")
results = r.json()["results"]
check(len(results) == 1 and results[0]["index"] == 0, f"rerank {results}")
check(abs(results[0]["relevance_score"] - 0.6660) < 6e-4, f"rerank score {results}")
r = httpx.post(f"{BASE}/v1/score", headers=headers, timeout=60, json={
    "model": MODEL, "text_1": SENTENCES[0], "text_2": SENTENCES[1:]})
scores = [d["score"] for d in r.json()["data"]]
check(abs(scores[0] - 0.6660) < 6e-4 and abs(scores[1] - 0.1046) < 6e-4, f"score {scores}")

print(f"{checks} checks passed")
