"""Tokens/s of tool calls at one client: `tool_choice: required` (the answer constrained to
calls of the offered functions) with `speculation: none`, the same with `auto` (pruned drafts
and jump-forward through the call's fixed text), and `tool_choice: auto` with `auto`
(unconstrained), each on its own fresh `thicket serve`, interleaved prompt by prompt. Counts
the answers that came back as parsed tool calls.

Usage: start three servers on ports 8951-8953 (same model), then python3 benches/tool_speed.py
"""

import json, time, urllib.request

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 32},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "find_flights", "description": "Flights between two cities on a date.",
        "parameters": {"type": "object", "properties": {
            "origin": {"type": "string", "maxLength": 32},
            "destination": {"type": "string", "maxLength": 32},
            "date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}},
            "required": ["origin", "destination", "date"], "additionalProperties": False}}},
]
PROMPTS = [
    "What is the weather in Paris right now, in celsius?",
    "Is it cold in Oslo today? Use fahrenheit.",
    "Find me flights from Berlin to Rome on 2026-12-04.",
    "How warm is it in Lisbon (celsius)?",
    "I need a flight from Madrid to Vienna on 2026-12-20.",
    "Weather in Prague please, fahrenheit.",
    "Flights Dublin to Athens, 2027-01-15?",
    "What's the temperature in Warsaw in celsius?",
    "Book-search flights from Budapest to Paris on 2026-12-31.",
    "Tell me the weather for Rome in fahrenheit.",
    "Any flights from Oslo to Berlin on 2027-02-02?",
    "Current weather in Vienna, celsius.",
]
CONFIGS = [("required, none", 8951, "none", "required"),
           ("required, auto", 8952, "auto", "required"),
           ("tool_choice auto, auto", 8953, "auto", "auto")]
totals = {name: [0, 0.0, 0] for name, *_ in CONFIGS}
for prompt in PROMPTS:
    for name, port, method, choice in CONFIGS:
        body = {"messages": [{"role": "user", "content": prompt}], "tools": TOOLS,
                "tool_choice": choice, "parallel_tool_calls": False, "max_tokens": 96, "temperature": 0,
                "speculation": {"method": method}}
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",
                                     data=json.dumps(body).encode(), headers={"content-type": "application/json"})
        t = time.time()
        r = json.load(urllib.request.urlopen(req, timeout=600))
        totals[name][1] += time.time() - t
        totals[name][0] += r["usage"]["completion_tokens"]
        totals[name][2] += bool(r["choices"][0]["message"].get("tool_calls"))
base = totals["required, none"][0] / totals["required, none"][1]
for name, (tokens, seconds, calls) in totals.items():
    print(f"| {name} | {calls}/{len(PROMPTS)} | {tokens} | {tokens / seconds:.1f} | {tokens / seconds / base:.2f}x |")
