"""The official `anthropic` client against `thicket serve` through the Messages API:
messages.create, structured output (output_config.format, messages.parse with a Pydantic
model), messages.stream (events in order, text deltas adding up), a tool_use ->
tool_result round trip, stop sequences, messages.count_tokens, the x-api-key header, and
bad requests answered with 4xx errors in Anthropic's shape.

Usage: anthropic_messages.py BASE_URL API_KEY MODEL
"""

import json
import sys

import anthropic
from pydantic import BaseModel

base, key, model = sys.argv[1], sys.argv[2], sys.argv[3]
# The client sends the key as `x-api-key` and an `anthropic-version` header.
client = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0)
checks = 0
# The client no longer sends sampling fields itself; the API (and thicket) still reads them.
GREEDY = {"temperature": 0}


def check(condition, what):
    global checks
    if not condition:
        raise AssertionError(what)
    checks += 1


question = [{"role": "user", "content": "What is the capital of France?"}]
m = client.messages.create(
    model=model,
    max_tokens=24,
    system="Answer in one short sentence.",
    messages=question,
    extra_body=GREEDY,
)
check(m.type == "message" and m.role == "assistant", f"a message: {m}")
check(m.content and m.content[0].type == "text" and m.content[0].text, f"{m.content}")
check(m.stop_reason in ("end_turn", "max_tokens"), f"stop_reason {m.stop_reason}")
check(m.usage.input_tokens > 0 and m.usage.output_tokens > 0, f"usage {m.usage}")

# The same prompt again: its prefix is read from the cache, and usage says so.
again = client.messages.create(
    model=model,
    max_tokens=24,
    system="Answer in one short sentence.",
    messages=question,
    extra_body=GREEDY,
)
check(again.content[0].text == m.content[0].text, "greedy answers repeat")
check((again.usage.cache_read_input_tokens or 0) > 0, f"cache read: {again.usage}")
total = m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0)

# count_tokens counts the same prompt.
count = client.messages.count_tokens(
    model=model, system="Answer in one short sentence.", messages=question
)
check(count.input_tokens == total, f"count_tokens {count.input_tokens} != {total}")

# max_tokens reached.
short = client.messages.create(model=model, max_tokens=2, messages=question, extra_body=GREEDY)
check(short.stop_reason == "max_tokens" and short.usage.output_tokens == 2, f"{short}")

# A stop sequence.
stopped = client.messages.create(
    model=model,
    max_tokens=48,
    messages=[{"role": "user", "content": "Count from 1 to 10, separated by commas."}],
    stop_sequences=["5"],
    extra_body=GREEDY,
)
check(stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == "5", f"{stopped}")

# Structured output: output_config.format, and messages.parse with a Pydantic model.
schema = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
    "required": ["city", "population"],
    "additionalProperties": False,
}
ask_city = [{"role": "user", "content": "Give the largest city of Japan and its population."}]
shaped = client.messages.create(
    model=model, max_tokens=64, messages=ask_city, extra_body=GREEDY,
    output_config={"format": {"type": "json_schema", "schema": schema}},
)
value = json.loads(shaped.content[0].text)
check(set(value) == {"city", "population"} and isinstance(value["population"], int), f"{value}")


class City(BaseModel):
    city: str
    population: int


parsed = client.messages.parse(
    model=model, max_tokens=64, messages=ask_city, output_format=City, extra_body=GREEDY
)
check(isinstance(parsed.parsed_output, City), f"parsed: {parsed.parsed_output!r}")

# Streaming: events in order, text deltas add up to the final message.
kinds = []
text = ""
with client.messages.stream(
    model=model, max_tokens=24, messages=question, extra_body=GREEDY
) as stream:
    for event in stream:
        kinds.append(event.type)
        if event.type == "content_block_delta" and event.delta.type == "text_delta":
            text += event.delta.text
    final = stream.get_final_message()
check(kinds[0] == "message_start", f"{kinds[:2]}")
check(kinds[-1] == "message_stop", f"{kinds[-1]}")
for kind in ("content_block_start", "content_block_delta", "content_block_stop", "message_delta"):
    check(kind in kinds, f"{kind} in {kinds}")
check(text and final.content[0].text == text, "deltas add up to the final text")
check(final.stop_reason in ("end_turn", "max_tokens"), f"{final.stop_reason}")
check(final.usage.output_tokens > 0, f"streamed usage {final.usage}")

# A tool_use -> tool_result round trip, the tool required on the first turn.
tools = [
    {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "input_schema": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    }
]
ask = [{"role": "user", "content": "What is the weather in Paris right now?"}]
first = client.messages.create(
    model=model, max_tokens=64, messages=ask, tools=tools,
    tool_choice={"type": "any"}, extra_body=GREEDY,
)
uses = [b for b in first.content if b.type == "tool_use"]
check(first.stop_reason == "tool_use" and uses, f"a tool_use: {first}")
check(uses[0].name == "get_weather" and "city" in uses[0].input, f"{uses[0]}")
second = client.messages.create(
    model=model,
    max_tokens=48,
    tools=tools,
    extra_body=GREEDY,
    messages=ask
    + [
        {"role": "assistant", "content": first.content},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": uses[0].id,
                    "content": json.dumps({"temperature_c": 31, "sky": "sunny"}),
                }
            ],
        },
    ],
)
answer = "".join(b.text for b in second.content if b.type == "text")
check("31" in answer, f"the tool's result is in the answer: {answer!r}")

# A streamed tool_use: its input arrives in input_json_delta fragments as it is written, and
# the stream assembles the same tool_use as the whole message has.
asked = dict(
    model=model, max_tokens=64, messages=ask, tools=tools,
    tool_choice={"type": "tool", "name": "get_weather"}, extra_body=GREEDY,
)
with client.messages.stream(**asked) as stream:
    deltas = [
        e for e in stream if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
    ]
    final = stream.get_final_message()
check(len(deltas) >= 2, f"input_json_delta fragments: {deltas}")
whole = client.messages.create(**asked)
uses = lambda m: [(b.name, b.input) for b in m.content if b.type == "tool_use"]
check(uses(final) == uses(whole) and uses(whole), f"{uses(final)} != {uses(whole)}")
check(json.loads("".join(d.delta.partial_json for d in deltas)) == uses(whole)[0][1], "joined")

# Bad requests: 4xx in Anthropic's shape.
for kwargs, error in [
    (dict(messages=question, max_tokens=5, tools=[{"type": "web_search_20250305", "name": "w"}]),
     anthropic.BadRequestError),
    (dict(messages=[{"role": "system", "content": "x"}], max_tokens=5), anthropic.BadRequestError),
    (dict(messages=question, max_tokens=5, extra_body={"temperature": -1}),
     anthropic.BadRequestError),
]:
    try:
        client.messages.create(model=model, **kwargs)
        check(False, f"{kwargs} is refused")
    except error as e:
        body = e.body
        check(
            isinstance(body, dict) and body.get("type") == "error"
            and body["error"]["type"] == "invalid_request_error",
            f"Anthropic's error shape: {body}",
        )
try:
    anthropic.Anthropic(base_url=base, api_key="wrong", max_retries=0).messages.create(
        model=model, max_tokens=5, messages=question
    )
    check(False, "a wrong key is refused")
except anthropic.AuthenticationError as e:
    check(e.body["error"]["type"] == "authentication_error", f"{e.body}")

print(f"{checks} checks passed")
