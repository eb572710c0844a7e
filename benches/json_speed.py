"""Tokens/s of JSON generation at one client: a JSON schema with `speculation: none`, the
same schema with `auto` (pruned drafts and jump-forward), and no format with `auto`, each on
its own fresh `thicket serve`, interleaved prompt by prompt.

Usage: start three servers on ports 8941-8943, then python3 benches/json_speed.py
"""

import json, time, urllib.request

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 24},
    "country": {"type": "string", "maxLength": 24},
    "population_millions": {"type": "integer", "minimum": 0, "maximum": 100},
    "famous_for": {"type": "array", "items": {"type": "string", "maxLength": 24}, "maxItems": 3}},
    "required": ["name", "country", "population_millions", "famous_for"], "additionalProperties": False}
CITIES = ["Paris", "Berlin", "Rome", "Madrid", "Lisbon", "Vienna", "Prague", "Oslo",
          "Dublin", "Athens", "Warsaw", "Budapest"]
CONFIGS = [("schema, none", 8941, "none", True), ("schema, auto", 8942, "auto", True),
           ("no format, auto", 8943, "auto", False)]
totals = {name: [0, 0.0] for name, *_ in CONFIGS}
for city in CITIES:
    for name, port, method, constrained in CONFIGS:
        body = {"messages": [{"role": "user", "content": f"Describe the city of {city} as JSON."}],
                "max_tokens": 96, "temperature": 0, "speculation": {"method": method}}
        if constrained:
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": "City", "schema": SCHEMA}}
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",
                                     data=json.dumps(body).encode(), headers={"content-type": "application/json"})
        t = time.time()
        r = json.load(urllib.request.urlopen(req, timeout=600))
        totals[name][0] += r["usage"]["completion_tokens"]
        totals[name][1] += time.time() - t
base = totals["schema, none"][0] / totals["schema, none"][1]
for name, (tokens, seconds) in totals.items():
    print(f"| {name} | {tokens} | {tokens / seconds:.1f} | {tokens / seconds / base:.2f}x |")
