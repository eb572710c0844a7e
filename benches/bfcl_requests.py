"""Converts BFCL's tool-calling data (GitHub ShishirPatil/gorilla,
`berkeley-function-call-leaderboard/bfcl_eval/data`, Apache-2.0) into the two request shapes
of the tool-calling workload, written under benches/data:

- `bfcl_tool_sets.json`: each multi-turn tool set (`multi_turn_func_doc/*.json`, by BFCL's
  class name) as OpenAI function tools.
- `bfcl_multi_turn.jsonl` (shape a, an agent with one fixed tool set): the user turns of each
  `BFCL_v4_multi_turn_base.json` entry with the classes it involves; every turn is sent as one
  request with the same tools (the union of those classes'), so the tool list is a shared
  prefix. No tool needs to run.
- `bfcl_live.jsonl` (shape b): the `BFCL_v4_live_simple`, `_parallel` and
  `_parallel_multiple` questions, each with its own functions (`live_multiple`, 3.9 MB, is
  left out to keep the data small).

BFCL's parameter types map to JSON Schema's (`dict` -> `object`, `float` -> `number`,
`tuple` -> `array`, `any` -> no type) and dots in function names become `_`.

Usage: python3 benches/bfcl_requests.py PATH/TO/gorilla
"""

import json
import pathlib
import sys

CLASS_FILES = {
    "GorillaFileSystem": "gorilla_file_system.json",
    "MathAPI": "math_api.json",
    "MessageAPI": "message_api.json",
    "TwitterAPI": "posting_api.json",
    "TicketAPI": "ticket_api.json",
    "TradingBot": "trading_bot.json",
    "TravelAPI": "travel_booking.json",
    "VehicleControlAPI": "vehicle_control.json",
}
TYPES = {"dict": "object", "float": "number", "tuple": "array"}


def schema(value):
    """A BFCL parameter schema as JSON Schema."""
    if isinstance(value, list):
        return [schema(v) for v in value]
    if not isinstance(value, dict):
        return value
    out = {}
    for key, v in value.items():
        if key == "type":
            if v == "any":
                continue
            out["type"] = TYPES.get(v, v)
        elif key == "properties" and isinstance(v, dict):
            out["properties"] = {name: schema(p) for name, p in v.items()}
        elif key in ("items", "additionalProperties"):
            out[key] = schema(v)
        else:
            out[key] = v
    return out


def tool(function):
    """A BFCL function as an OpenAI function tool."""
    return {"type": "function", "function": {
        "name": function["name"].replace(".", "_"),
        "description": function.get("description", ""),
        "parameters": schema(function.get("parameters", {"type": "dict", "properties": {}})),
    }}


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main():
    data = pathlib.Path(sys.argv[1]) / "berkeley-function-call-leaderboard/bfcl_eval/data"
    out = pathlib.Path(__file__).parent / "data"
    tool_sets = {name: [tool(f) for f in lines(data / "multi_turn_func_doc" / file)]
                 for name, file in CLASS_FILES.items()}
    (out / "bfcl_tool_sets.json").write_text(json.dumps(tool_sets, separators=(",", ":")))
    with (out / "bfcl_multi_turn.jsonl").open("w") as f:
        for entry in lines(data / "BFCL_v4_multi_turn_base.json"):
            classes = [c for c in entry["involved_classes"] if c in tool_sets]
            turns = [m["content"] for turn in entry["question"] for m in turn
                     if m.get("role") == "user"]
            if classes and turns:
                f.write(json.dumps({"id": entry["id"], "classes": classes, "turns": turns}) + "\n")
    with (out / "bfcl_live.jsonl").open("w") as f:
        for name in ("simple", "parallel", "parallel_multiple"):
            for entry in lines(data / f"BFCL_v4_live_{name}.json"):
                messages = [m for turn in entry["question"] for m in turn]
                tools = [tool(fn) for fn in entry["function"]]
                f.write(json.dumps({"id": entry["id"], "messages": messages, "tools": tools},
                                   separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
