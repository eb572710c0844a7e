"""The official `openai` client against `thicket serve` through the Responses API:
responses.create (text; a json_schema format whose output must validate; a function tool
round trip continued with previous_response_id), responses.stream (typed events in order),
responses.parse with a Pydantic model, stored responses (retrieve, delete, 404 after), and
bad requests answered with 4xx errors.

Usage: openai_responses.py BASE_URL API_KEY MODEL
"""

import json
import sys

import openai
from pydantic import BaseModel

base, key, model = sys.argv[1], sys.argv[2], sys.argv[3]
client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
checks = 0


def check(condition, what):
    global checks
    if not condition:
        raise AssertionError(what)
    checks += 1


# Text.
r = client.responses.create(
    model=model,
    instructions="Answer in one short sentence.",
    input="What is the capital of France?",
    max_output_tokens=24,
    temperature=0,
)
check(r.object == "response" and r.id.startswith("resp_"), f"a response object: {r}")
check(r.status in ("completed", "incomplete"), f"status {r.status}")
check(len(r.output_text) > 0, "output_text is not empty")
check(r.usage.input_tokens > 0 and r.usage.output_tokens > 0, f"usage {r.usage}")
check(r.usage.output_tokens <= 24, f"max_output_tokens holds: {r.usage}")
check(r.output[0].type == "message" and r.output[0].role == "assistant", f"{r.output}")

# The same prompt again: its prefix comes from the cache and usage says so.
again = client.responses.create(
    model=model,
    instructions="Answer in one short sentence.",
    input="What is the capital of France?",
    max_output_tokens=24,
    temperature=0,
)
check(again.output_text == r.output_text, "greedy answers repeat")
check(again.usage.input_tokens_details.cached_tokens > 0, f"cached input: {again.usage}")

# Stored: retrieve it, delete it, then 404.
got = client.responses.retrieve(r.id)
check(got.id == r.id and got.output_text == r.output_text, "retrieve returns the response")
deleted = client.responses.delete(r.id)
try:
    client.responses.retrieve(r.id)
    check(False, "a deleted response is gone")
except openai.NotFoundError as e:
    check(e.status_code == 404, "404 after delete")

# text.format json_schema: the output validates.
schema = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
    "required": ["city", "population"],
    "additionalProperties": False,
}
r = client.responses.create(
    model=model,
    input="Give the largest city of Japan and its population as JSON.",
    text={"format": {"type": "json_schema", "name": "city", "schema": schema, "strict": True}},
    max_output_tokens=64,
    temperature=0,
)
value = json.loads(r.output_text)
check(isinstance(value["city"], str) and isinstance(value["population"], int), f"{value}")
check(set(value) == {"city", "population"}, f"only the schema's keys: {value}")


# responses.parse with a Pydantic model.
class City(BaseModel):
    city: str
    population: int


parsed = client.responses.parse(
    model=model,
    input="Give the largest city of Japan and its population.",
    text_format=City,
    max_output_tokens=64,
    temperature=0,
)
check(isinstance(parsed.output_parsed, City), f"parsed: {parsed.output_parsed!r}")

# A function tool round trip: required on the first turn, the result sent back with
# previous_response_id, the answer uses it.
tools = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    }
]
first = client.responses.create(
    model=model,
    input="What is the weather in Paris right now?",
    tools=tools,
    tool_choice="required",
    max_output_tokens=64,
    temperature=0,
)
calls = [item for item in first.output if item.type == "function_call"]
check(len(calls) >= 1, f"a function call: {first.output}")
call = calls[0]
check(call.name == "get_weather" and "city" in json.loads(call.arguments), f"{call}")
second = client.responses.create(
    model=model,
    previous_response_id=first.id,
    input=[
        {
            "type": "function_call_output",
            "call_id": call.call_id,
            "output": json.dumps({"temperature_c": 31, "sky": "sunny"}),
        }
    ],
    tools=tools,
    max_output_tokens=48,
    temperature=0,
)
check(second.previous_response_id == first.id, "previous_response_id echoed")
check("31" in second.output_text, f"the tool's result is in the answer: {second.output_text!r}")
check(
    second.usage.input_tokens > first.usage.input_tokens,
    "the continuation's prompt holds the first turn",
)

# Streaming: typed events in order, with sequence numbers.
kinds = []
numbers = []
text = ""
with client.responses.stream(
    model=model, input="Count from one to five.", max_output_tokens=24, temperature=0
) as stream:
    for event in stream:
        kinds.append(event.type)
        numbers.append(event.sequence_number)
        if event.type == "response.output_text.delta":
            text += event.delta
    final = stream.get_final_response()
check(kinds[:2] == ["response.created", "response.in_progress"], f"{kinds[:3]}")
check(kinds[-1] in ("response.completed", "response.incomplete"), f"{kinds[-1]}")
for kind in (
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
):
    check(kind in kinds, f"{kind} in {kinds}")
check(numbers == list(range(len(numbers))), "sequence numbers count up from 0")
check(final.output_text == text and text, "the deltas add up to the final text")

# A streamed function call: its arguments in fragments as they are written, the call the
# stream assembles the same as the whole response's.
kinds = []
fragments = []
asked = dict(
    model=model,
    input="What is the weather in Oslo?",
    tools=tools,
    tool_choice={"type": "function", "name": "get_weather"},
    max_output_tokens=64,
    temperature=0,
)
with client.responses.stream(**asked) as stream:
    for event in stream:
        kinds.append(event.type)
        if event.type == "response.function_call_arguments.delta":
            fragments.append(event.delta)
    final = stream.get_final_response()
check("response.function_call_arguments.done" in kinds, f"{kinds}")
check(len(fragments) >= 2, f"arguments in fragments: {fragments}")
added = kinds.index("response.output_item.added")
check(added < kinds.index("response.function_call_arguments.delta"), "the call opens first")
streamed_calls = [(i.name, i.arguments) for i in final.output if i.type == "function_call"]
whole = client.responses.create(**asked)
whole_calls = [(i.name, i.arguments) for i in whole.output if i.type == "function_call"]
check(streamed_calls == whole_calls and whole_calls, f"{streamed_calls} != {whole_calls}")
check("".join(fragments) == whole_calls[0][1], f"fragments join to {whole_calls[0][1]!r}")

# Bad requests: 4xx in OpenAI's shape.
for kwargs, status in [
    (dict(input="hi", tools=[{"type": "web_search"}]), 400),
    (dict(input=[{"type": "input_image", "image_url": "x"}]), 400),
    (dict(input="hi", previous_response_id="resp_missing"), 404),
    (dict(input="hi", temperature=-1), 400),
]:
    try:
        client.responses.create(model=model, max_output_tokens=4, **kwargs)
        check(False, f"{kwargs} is refused")
    except openai.APIStatusError as e:
        check(e.status_code == status, f"{kwargs}: {e.status_code}, not {status}")
        check(isinstance(e.body, dict) and e.body.get("message"), f"an error body: {e.body}")

print(f"{checks} checks passed")
