"""The OpenAI Agents SDK (`openai-agents`), unchanged, running an agent with one function
tool against `thicket serve` through the Responses API: greedy, the tool required on the
first turn (the SDK resets the choice after a call, so the second turn answers), the tool
actually called, and its result — a number the model cannot guess — in the final answer.

Usage: openai_agents.py BASE_URL API_KEY MODEL
"""

import sys

from agents import (
    Agent,
    ModelSettings,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from agents.items import ToolCallItem, ToolCallOutputItem
from openai import AsyncOpenAI

base, key, model = sys.argv[1], sys.argv[2], sys.argv[3]
set_tracing_disabled(True)
client = AsyncOpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
called = []


@function_tool
def get_weather(city: str) -> str:
    """The current weather in a city."""
    called.append(city)
    return f"It is 31 degrees Celsius and sunny in {city}."


agent = Agent(
    name="weather",
    instructions="You answer questions about the weather. Use the get_weather tool, then "
    "answer in one sentence with the temperature it gave.",
    tools=[get_weather],
    model=OpenAIResponsesModel(model=model, openai_client=client),
    model_settings=ModelSettings(temperature=0, tool_choice="required", max_tokens=64),
)
result = Runner.run_sync(agent, "What is the weather in Paris right now?", max_turns=4)
checks = 0


def check(condition, what):
    global checks
    if not condition:
        raise AssertionError(what)
    checks += 1


check(called and "paris" in called[0].lower(), f"the tool was called for Paris: {called}")
check(any(isinstance(i, ToolCallItem) for i in result.new_items), "a tool call item")
check(any(isinstance(i, ToolCallOutputItem) for i in result.new_items), "a tool output item")
check(len(result.raw_responses) >= 2, f"two model turns: {len(result.raw_responses)}")
answer = str(result.final_output)
check("31" in answer, f"the tool's result is in the final answer: {answer!r}")
print(f"{checks} checks passed: {answer!r}")
