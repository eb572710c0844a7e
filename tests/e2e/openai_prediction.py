"""Predicted Outputs through the official `openai` client against the real thicket server:
`prediction=` in both shapes (a string and a list of text parts) on chat, on completions
(as an extra field), streamed with include_usage, with a stop string, with n = 2 and a seed,
under a JSON schema, and a prediction that departs from the output and rejoins it. Every output must be the
output without a prediction; the usage must say what the prediction's drafts became. Bad
predictions get a 400 that names `prediction`; an empty one is accepted.

Usage: python3 openai_prediction.py BASE_URL API_KEY MODEL
Exits non-zero (with the failed check) on the first failure.
"""

import json
import sys

import openai

BASE, KEY, MODEL = sys.argv[1], sys.argv[2], sys.argv[3]
client = openai.OpenAI(base_url=f"{BASE}/v1", api_key=KEY, max_retries=0, timeout=300)
checks = 0

CODE = '''def mean(values):
    total = 0
    for value in values:
        total += value
    return total / len(values)


def largest(values):
    best = values[0]
    for value in values[1:]:
        if value > best:
            best = value
    return best
'''

# A prompt whose greedy output is long enough to predict.
PROMPT = f"```python\n{CODE}```\n\nThe same code again, unchanged:\n```python\n"


def check(condition, what):
    global checks
    if not condition:
        raise AssertionError(what)
    checks += 1


def details(usage):
    d = usage.completion_tokens_details
    check(d is not None, f"no completion_tokens_details in {usage}")
    return d.accepted_prediction_tokens, d.rejected_prediction_tokens


def completion(prediction=None, **extra):
    body = {"prediction": prediction} if prediction is not None else {}
    return client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=160, temperature=0, extra_body=body, **extra
    )


def completions_follow_the_prediction():
    plain = completion()
    text = plain.choices[0].text
    check(len(text) > 100, f"too short an output to predict: {text!r}")
    check(details(plain.usage) == (0, 0), f"no prediction, yet {plain.usage}")
    # A client that knows the output (here: from the first run).
    for shape in (text, [{"type": "text", "text": text[:100]}, {"type": "text", "text": text[100:]}]):
        r = completion({"type": "content", "content": shape})
        check(r.choices[0].text == text, f"with a prediction: {r.choices[0].text!r} != {text!r}")
        accepted, rejected = details(r.usage)
        check(accepted > 20, f"{type(shape).__name__} prediction: accepted {accepted}, rejected {rejected}")
        check(accepted <= r.usage.completion_tokens, f"accepted {accepted} of {r.usage.completion_tokens}")
        speculation = r.model_extra["thicket"]["speculation"]
        check(speculation["sources"]["prediction"]["accepted_tokens"] == accepted, f"{speculation}")
    # Departing and rejoining: a line changed, one inserted, one deleted.
    lines = text.splitlines(keepends=True)
    check(len(lines) >= 6, f"too few lines to edit: {text!r}")
    lines[1] = "    total = 0.0\n"
    lines.insert(3, "    # a comment\n")
    del lines[5]
    r = completion({"type": "content", "content": "".join(lines)})
    check(r.choices[0].text == text, f"edited prediction: {r.choices[0].text!r}")
    accepted, rejected = details(r.usage)
    check(accepted > 20, f"edited prediction: accepted {accepted}, rejected {rejected}")
    # Wrong from its first token.
    r = completion({"type": "content", "content": "Lorem ipsum dolor sit amet. " * 20})
    check(r.choices[0].text == text, f"wrong prediction: {r.choices[0].text!r}")
    return text


def chat_and_stream():
    messages = [
        {"role": "user", "content": f"Repeat this code exactly:\n```python\n{CODE}```"},
    ]
    plain = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=160, temperature=0)
    want = plain.choices[0].message.content
    prediction = {"type": "content", "content": want}
    r = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=160, temperature=0, prediction=prediction
    )
    check(r.choices[0].message.content == want, f"chat: {r.choices[0].message.content!r} != {want!r}")
    accepted, rejected = details(r.usage)
    check(accepted > 0, f"chat: nothing of a right prediction accepted: {r.usage}")
    streamed, usage = "", None
    for chunk in client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=160,
        temperature=0,
        prediction=prediction,
        stream=True,
        stream_options={"include_usage": True},
    ):
        if chunk.choices and chunk.choices[0].delta.content:
            streamed += chunk.choices[0].delta.content
        if chunk.usage is not None:
            usage = chunk.usage
    check(streamed == want, f"stream: {streamed!r} != {want!r}")
    check(usage is not None, "no usage chunk")
    accepted, rejected = details(usage)
    check(accepted > 0, f"stream: nothing of a right prediction accepted: {usage}")
    # A stop string: the output ends at the same place with and without a prediction.
    stop = dict(model=MODEL, messages=messages, max_tokens=160, temperature=0, stop=["\n\n"])
    a = client.chat.completions.create(**stop)
    b = client.chat.completions.create(**stop, prediction=prediction)
    check(a.choices[0].message.content == b.choices[0].message.content, "a stop string with a prediction")
    check(b.choices[0].finish_reason == a.choices[0].finish_reason, "finish reason with a stop string")
    # n = 2 with a seed: the same samples with and without a prediction.
    sampled = dict(model=MODEL, messages=messages, max_tokens=48, temperature=0.8, seed=5, n=2)
    a = client.chat.completions.create(**sampled)
    b = client.chat.completions.create(**sampled, prediction=prediction)
    check([c.message.content for c in a.choices] == [c.message.content for c in b.choices], "n=2 with a seed")


def under_a_json_schema():
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    args = dict(
        model=MODEL,
        messages=[{"role": "user", "content": "Give a person as JSON with a name and an age."}],
        max_tokens=60,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": True}},
    )
    plain = client.chat.completions.create(**args)
    want = plain.choices[0].message.content
    r = client.chat.completions.create(**args, prediction={"type": "content", "content": want})
    check(r.choices[0].message.content == want, f"schema: {r.choices[0].message.content!r} != {want!r}")
    check(set(json.loads(want)) == {"name", "age"}, f"schema output {want!r}")
    accepted, _ = details(r.usage)
    check(accepted > 0, f"schema: nothing of a right prediction accepted: {r.usage}")


def bad_predictions():
    cases = [
        "just a string",
        {"type": "file", "content": "x"},
        {"content": "x"},
        {"type": "content", "content": 7},
        {"type": "content", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]},
        {"type": "content", "content": [{"type": "text"}]},
        {"type": "content", "content": "word " * 3000},
    ]
    for prediction in cases:
        try:
            completion(prediction)
            check(False, f"{str(prediction)[:60]} was accepted")
        except openai.BadRequestError as e:
            check(e.status_code == 400, f"status {e.status_code}")
            message = json.dumps(e.body)
            check("prediction" in message, f"{str(prediction)[:60]}: {message}")
    for empty in ("", []):
        r = completion({"type": "content", "content": empty})
        check(details(r.usage) == (0, 0), f"empty prediction: {r.usage}")


text = completions_follow_the_prediction()
chat_and_stream()
under_a_json_schema()
bad_predictions()
print(f"openai prediction: {checks} checks passed")
