"""The OpenAI Agents SDK (`openai-agents`), unchanged, running an agent with one function
tool against `thicket serve` through the Responses API: greedy, the tool required on the
first turn (the SDK resets the choice after a call, so the second turn answers), the tool
actually called, and its result — a number the model cannot guess — in the final answer.

Usage: openai_agents.py BASE_URL API_KEY MODEL
"""

import asyncio
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
called = []


@function_tool
def get_weather(city: str) -> str:
    """The current weather in a city."""
    called.append(city)
    return f"It is 31 degrees Celsius and sunny in {city}."


def weather_agent():
    # A client of its own: each run below has its own event loop.
    client = AsyncOpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
    return Agent(
        name="weather",
        instructions="You answer questions about the weather. Use the get_weather tool, then "
        "answer in one sentence with the temperature it gave.",
        tools=[get_weather],
        model=OpenAIResponsesModel(model=model, openai_client=client),
        model_settings=ModelSettings(temperature=0, tool_choice="required", max_tokens=64),
    )


result = Runner.run_sync(weather_agent(), "What is the weather in Paris right now?", max_turns=4)
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

# The same agent streamed: the SDK assembles the call from the streamed events and runs it.
async def streamed():
    run = Runner.run_streamed(weather_agent(), "What is the weather in Paris right now?", max_turns=4)
    kinds = []
    async for event in run.stream_events():
        if event.type == "raw_response_event":
            kinds.append(event.data.type)
    return run, kinds


called.clear()
run, kinds = asyncio.run(streamed())
check(called and "paris" in called[0].lower(), f"streamed: the tool was called: {called}")
check("response.function_call_arguments.delta" in kinds, f"streamed arguments: {kinds}")
check("31" in str(run.final_output), f"streamed: the tool's result: {run.final_output!r}")
print(f"{checks} checks passed: {answer!r}")
