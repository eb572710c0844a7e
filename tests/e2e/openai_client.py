"""The real thicket server driven by the official `openai` client (and raw httpx for the
disconnect check): chat, completions, streaming chat with include_usage, n = 2, stop strings,
logprobs, seed reproducibility, structured output parsed into a pydantic model, tool calls
(a named function and `required`, whole and streamed, and a tool result sent back), invalid
requests with their statuses, and 20 streaming clients that disconnect mid-stream after which
no KV block stays in use.

Usage: python3 openai_client.py BASE_URL API_KEY MODEL
Exits non-zero (with the failed check) on the first failure.
"""

import json
import re
import sys
import threading
import time

import httpx
import openai
import pydantic

BASE, KEY, MODEL = sys.argv[1], sys.argv[2], sys.argv[3]
client = openai.OpenAI(base_url=f"{BASE}/v1", api_key=KEY, max_retries=0, timeout=120)
checks = 0


def check(condition, what):
    global checks
    if not condition:
        raise AssertionError(what)
    checks += 1


def chat():
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=16,
        temperature=0,
    )
    text = r.choices[0].message.content
    check(isinstance(text, str) and text.strip(), f"chat answered {text!r}")
    check(r.choices[0].message.role == "assistant", "chat role")
    check(r.choices[0].finish_reason in ("stop", "length"), "chat finish_reason")
    check(r.usage.prompt_tokens > 0 and 0 < r.usage.completion_tokens <= 16, f"chat usage {r.usage}")
    check(r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens, "total")
    return r


def completion():
    r = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=12, temperature=0)
    check(r.object == "text_completion", "completion object")
    check(r.choices[0].text.strip(), f"completion text {r.choices[0].text!r}")
    check(r.usage.completion_tokens == 12 or r.choices[0].finish_reason == "stop", f"usage {r.usage}")
    return r


def streaming_chat(whole):
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, usage, finishes, chunks = "", None, 0, 0
    for chunk in stream:
        chunks += 1
        if chunk.usage is not None:
            usage = chunk.usage
            check(chunk.choices == [], "the usage chunk has no choices")
            continue
        delta = chunk.choices[0].delta
        text += delta.content or ""
        finishes += chunk.choices[0].finish_reason is not None
    check(chunks > 3, f"only {chunks} chunks")
    check(finishes == 1, f"{finishes} finish reasons")
    check(text == whole.choices[0].message.content, f"stream {text!r} != whole {whole.choices[0].message.content!r}")
    check(usage is not None and usage.completion_tokens == whole.usage.completion_tokens, f"usage {usage}")


def n_two():
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Name a colour."}],
        max_tokens=8,
        temperature=1.0,
        seed=3,
        n=2,
    )
    check(len(r.choices) == 2 and {c.index for c in r.choices} == {0, 1}, "n=2 choices")
    check(2 <= r.usage.completion_tokens <= 16, f"usage over both choices {r.usage}")
    check(all(c.message.content is not None for c in r.choices), "both choices have content")


def stop_strings(base):
    text = base.choices[0].text
    words = re.findall(r"[A-Za-z]{3,}", text)
    check(len(words) >= 2, f"need two words in {text!r}")
    stop = words[1]
    r = client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=12, temperature=0, stop=[stop]
    )
    out = r.choices[0].text
    check(r.choices[0].finish_reason == "stop", f"finish {r.choices[0].finish_reason}")
    check(stop not in out and text.startswith(out), f"stop {stop!r}: {out!r} vs {text!r}")


def logprobs():
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=5,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )
    content = r.choices[0].logprobs.content
    check(len(content) == r.usage.completion_tokens, "one logprob per token")
    for entry in content:
        check(entry.logprob <= 0 and len(entry.top_logprobs) == 3, f"entry {entry}")
        # Greedy: the chosen token is the most likely one.
        check(abs(entry.top_logprobs[0].logprob - entry.logprob) < 1e-4, "greedy picks the top token")


def seeds():
    def sample(seed):
        return client.completions.create(
            model=MODEL, prompt="Once upon a time", max_tokens=16, temperature=1.0, seed=seed
        ).choices[0].text

    check(sample(7) == sample(7), "same seed, same text")
    check(len({sample(s) for s in range(4)}) > 1, "different seeds, different texts")


def invalid_requests():
    cases = [
        (openai.BadRequestError, 400, dict(temperature=7.0)),
        (openai.BadRequestError, 400, dict(max_tokens=10**6)),
        (openai.NotFoundError, 404, dict(model="no-such-model")),
    ]
    for error, status, override in cases:
        args = dict(model=MODEL, prompt="Hello", max_tokens=4) | override
        try:
            client.completions.create(**args)
            check(False, f"{override} was accepted")
        except error as e:
            check(e.status_code == status, f"{override}: status {e.status_code}")
            check(isinstance(e.body, dict) and e.body.get("message"), f"{override}: body {e.body}")
    bad_key = openai.OpenAI(base_url=f"{BASE}/v1", api_key="wrong", max_retries=0)
    try:
        bad_key.models.list()
        check(False, "a wrong key was accepted")
    except openai.AuthenticationError as e:
        check(e.status_code == 401, "401")


class City(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=24)
    country: str = pydantic.Field(max_length=24)
    population_millions: int = pydantic.Field(ge=0, le=100)


def structured():
    # `parse` sends the model's JSON schema (strict) and validates the answer with pydantic.
    completions = getattr(client.chat.completions, "parse", None) or client.beta.chat.completions.parse
    r = completions(
        model=MODEL,
        messages=[{"role": "user", "content": "Describe the city of Paris as JSON."}],
        response_format=City,
        max_tokens=200,
        temperature=0,
    )
    city = r.choices[0].message.parsed
    check(isinstance(city, City), f"parsed {r.choices[0].message.content!r}")
    check(r.choices[0].finish_reason == "stop", f"structured finish {r.choices[0].finish_reason}")
    streamed = ""
    for chunk in client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Describe the city of Paris as JSON."}],
        response_format={"type": "json_object"},
        max_tokens=200,
        temperature=0,
        stream=True,
    ):
        if chunk.choices and chunk.choices[0].delta.content:
            streamed += chunk.choices[0].delta.content
    check(streamed.startswith("{"), f"json_object stream {streamed!r}")
    # vLLM's `structured_outputs`, on completions.
    r = client.completions.create(
        model=MODEL,
        prompt="Is the sky blue? Answer:",
        max_tokens=8,
        temperature=0,
        extra_body={"structured_outputs": {"choice": [" yes", " no"]}},
    )
    check(r.choices[0].text in (" yes", " no"), f"choice gave {r.choices[0].text!r}")
    try:
        client.completions.create(
            model=MODEL, prompt="Hi", max_tokens=4, extra_body={"structured_outputs": {"regex": "(unclosed"}}
        )
        check(False, "an invalid regex was accepted")
    except openai.BadRequestError as e:
        check(e.status_code == 400 and e.body.get("param") == "structured_outputs", f"bad regex: {e.body}")
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "frobnicate"}}}
    try:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi"}], response_format=bad, max_tokens=4
        )
        check(False, "an invalid schema was accepted")
    except openai.BadRequestError as e:
        check(e.status_code == 400 and e.body.get("param") == "response_format", f"bad schema: {e.body}")
    # A schema that compiles but exceeds the grammar engine's limits after its first token: a
    # 400 naming the field (a 5xx would have a router retry it elsewhere), whole or streamed.
    wide = {f"p{i}": {"type": "string", "maxLength": 8} for i in range(3000)}
    wide = {"type": "object", "properties": wide, "required": ["p2999"]}
    wide = {"type": "json_schema", "json_schema": {"name": "wide", "schema": wide}}
    try:
        r = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi"}], response_format=wide, max_tokens=8
        )
        check(False, f"a format beyond the grammar engine's limits was followed: {r}")
    except openai.BadRequestError as e:
        check(e.body.get("param") == "response_format", f"wide schema: {e.body}")
        check("could not be followed" in e.body.get("message", ""), f"wide schema: {e.body}")
    try:
        for _ in client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi"}], response_format=wide, max_tokens=8,
            stream=True,
        ):
            pass
        check(False, "a streamed format beyond the grammar engine's limits was followed")
    except openai.APIError as e:
        check("could not be followed" in str(e.message), f"wide schema streamed: {e!r}")


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]},
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris right now?"}]


def check_weather_call(call, where):
    check(call.type == "function" and call.id.startswith("call_"), f"{where}: call {call}")
    check(call.function.name == "get_weather", f"{where}: called {call.function.name}")
    arguments = json.loads(call.function.arguments)
    check(isinstance(arguments.get("city"), str), f"{where}: arguments {arguments}")
    check(arguments.get("unit") in ("celsius", "fahrenheit"), f"{where}: arguments {arguments}")
    check(set(arguments) == {"city", "unit"}, f"{where}: arguments {arguments}")


def tools():
    named = {"type": "function", "function": {"name": "get_weather"}}
    r = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=[WEATHER, TIME], tool_choice=named, max_tokens=80, temperature=0
    )
    choice = r.choices[0]
    check(choice.finish_reason == "tool_calls", f"named: finish_reason {choice.finish_reason}")
    check(choice.message.content is None, f"named: content {choice.message.content!r}")
    check(len(choice.message.tool_calls) >= 1, "named: no tool call")
    for call in choice.message.tool_calls:
        check_weather_call(call, "named")

    # The same request streamed: the client's own accumulation gives the same calls.
    stream_helper = getattr(client.chat.completions, "stream", None) or client.beta.chat.completions.stream
    with stream_helper(
        model=MODEL, messages=ASK, tools=[WEATHER, TIME], tool_choice=named, max_tokens=80, temperature=0
    ) as stream:
        for _ in stream:
            pass
        streamed = stream.get_final_completion().choices[0]
    check(streamed.finish_reason == "tool_calls", f"streamed: finish_reason {streamed.finish_reason}")
    got = [(c.function.name, json.loads(c.function.arguments)) for c in streamed.message.tool_calls]
    want = [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls]
    check(got == want, f"streamed calls {got} != whole {want}")

    # `required`: some call, of either function, with valid arguments.
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What time is it in Tokyo?"}],
        tools=[WEATHER, TIME],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=80,
        temperature=0,
    )
    calls = r.choices[0].message.tool_calls
    check(r.choices[0].finish_reason == "tool_calls" and len(calls) == 1, f"required: {r.choices[0]}")
    if calls[0].function.name == "get_weather":
        check_weather_call(calls[0], "required")
    else:
        check(calls[0].function.name == "get_time", f"required: called {calls[0].function.name}")
        check(isinstance(json.loads(calls[0].function.arguments).get("zone"), str), "required: zone")

    # The call and its result go back; `none` makes the answer text.
    call = choice.message.tool_calls[0]
    follow = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 18, "sky": "clear"})},
    ]
    r = client.chat.completions.create(
        model=MODEL, messages=follow, tools=[WEATHER], tool_choice="none", max_tokens=24, temperature=0
    )
    check(r.choices[0].message.tool_calls is None, "none: a tool was called")
    check(isinstance(r.choices[0].message.content, str), f"none: content {r.choices[0].message.content!r}")
    check(r.choices[0].finish_reason in ("stop", "length"), f"none: finish_reason {r.choices[0].finish_reason}")


def blocks_in_use():
    text = httpx.get(f"{BASE}/metrics", headers={"Authorization": f"Bearer {KEY}"}, timeout=30).text
    m = re.search(r"^thicket_kv_blocks_in_use (\S+)$", text, re.M)
    check(m is not None, "thicket_kv_blocks_in_use is exported")
    return float(m.group(1))


def disconnects():
    started = threading.Barrier(21)
    errors = []

    def client_that_leaves(i):
        body = {
            "model": MODEL,
            "prompt": f"Story number {i}: once upon a time",
            "max_tokens": 400,
            "ignore_eos": True,
            "stream": True,
        }
        try:
            with httpx.stream(
                "POST", f"{BASE}/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=120
            ) as r:
                if r.status_code != 200:
                    errors.append(f"client {i}: status {r.status_code}")
                    return
                events = 0
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        events += 1
                    if events == 3:
                        break
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(f"client {i}: {e}")
        finally:
            started.wait()

    threads = [threading.Thread(target=client_that_leaves, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    started.wait()
    for t in threads:
        t.join()
    check(not errors, f"clients failed: {errors}")
    deadline = time.time() + 30
    while blocks_in_use() != 0:
        check(time.time() < deadline, f"{blocks_in_use()} blocks still in use 30 s after the clients left")
        time.sleep(0.1)


whole = chat()
base = completion()
streaming_chat(whole)
n_two()
stop_strings(base)
logprobs()
seeds()
structured()
tools()
invalid_requests()
disconnects()
print(f"openai client: {checks} checks passed")
