"""The official `openai` and `anthropic` clients reading a thinking model's answer from
`thicket serve --reasoning-parser deepseek_r1` on SmolLM2 (which does not think: all it
writes is thinking until a thinking budget ends it, then the answer follows): chat
completions' `reasoning_content` whole and streamed with a JSON schema holding for the answer
and `reasoning_tokens` in usage; the Responses API's `reasoning` item; the Messages API's
`thinking` blocks from `thinking: {type: enabled, budget_tokens}`, whole and through
`messages.stream`.

Usage: reasoning_clients.py BASE_URL API_KEY MODEL
"""

import json
import sys

import anthropic
import openai

base, key, model = sys.argv[1], sys.argv[2], sys.argv[3]
oa = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
an = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0)
checks = 0


def check(condition, what):
    global checks
    if not condition:
        raise AssertionError(what)
    checks += 1


ada = [{"role": "user", "content": "Describe a person called Ada."}]
schema = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": True}}

r = oa.chat.completions.create(
    model=model, messages=ada, max_tokens=80, temperature=0, response_format=fmt,
    extra_body={"thinking_token_budget": 6},
)
m = r.choices[0].message
thinking = getattr(m, "reasoning_content", None)
check(isinstance(thinking, str) and thinking, f"reasoning_content: {m}")
check(getattr(m, "reasoning", None) == thinking, f"reasoning: {m}")
person = json.loads(m.content)
check(set(person) == {"name", "age"} and isinstance(person["age"], int), f"{m.content}")
check(r.usage.completion_tokens_details.reasoning_tokens == 6, f"{r.usage}")
check(r.choices[0].finish_reason == "stop", f"{r.choices[0]}")

stream = oa.chat.completions.create(
    model=model, messages=ada, max_tokens=80, temperature=0, response_format=fmt,
    extra_body={"thinking_token_budget": 6}, stream=True,
    stream_options={"include_usage": True},
)
s_thinking, s_content, usage = "", "", None
for chunk in stream:
    if chunk.usage:
        usage = chunk.usage
    for choice in chunk.choices:
        s_thinking += getattr(choice.delta, "reasoning_content", None) or ""
        s_content += choice.delta.content or ""
check((s_thinking, s_content) == (thinking, m.content), f"{s_thinking!r} {s_content!r}")
check(usage.completion_tokens_details.reasoning_tokens == 6, f"{usage}")

resp = oa.responses.create(
    model=model, input="Describe a person called Ada.", max_output_tokens=40,
    temperature=0, reasoning={"effort": "low"}, extra_body={"thinking_token_budget": 6},
)
kinds = [item.type for item in resp.output]
check(kinds[0] == "reasoning", f"{resp.output}")
check(resp.output[0].content[0].text == thinking, f"{resp.output[0]}")
check(resp.usage.output_tokens_details.reasoning_tokens == 6, f"{resp.usage}")
check(resp.reasoning.effort == "low", f"{resp.reasoning}")

msg = an.messages.create(
    model=model, max_tokens=40, messages=ada,
    thinking={"type": "enabled", "budget_tokens": 6}, extra_body={"temperature": 0},
)
check([b.type for b in msg.content][:2] == ["thinking", "text"], f"{msg.content}")
check(msg.content[0].thinking == thinking, f"{msg.content[0]}")
with an.messages.stream(
    model=model, max_tokens=40, messages=ada,
    thinking={"type": "enabled", "budget_tokens": 6}, extra_body={"temperature": 0},
) as s:
    deltas = "".join(e.thinking for e in s if e.type == "thinking")
    final = s.get_final_message()
check(final.content[0].type == "thinking" and final.content[0].thinking == thinking, f"{final}")
check(deltas == thinking, f"{deltas!r}")
check(final.content[1].text == msg.content[1].text, f"{final.content}")

print(f"{checks} checks passed")
