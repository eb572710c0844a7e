"""openai-harmony's side of thicket's gpt-oss checks (tests/http/harmony_reference.rs).

Reads a JSON object from the file named first: `date` (the conversation's start date) and
`cases`, each an OpenAI chat request's `messages`, `tools` and `reasoning_effort` (`render`) or
a reply's text (`parse`). A rendered case becomes the token ids openai-harmony renders for the
conversation, mapped as gpt-oss's serving stacks map a chat request: a system message with the
effort and the date; the request's first system or developer message as the developer
message's instructions, with the functions offered; an assistant message's reasoning as an
analysis message, each call as a commentary message to `functions.NAME` with
`<|constrain|>json` and its arguments as `json.dumps` writes them, its content as a final
message; a tool result as a message from `functions.NAME` to the assistant. A parsed case
becomes the messages openai-harmony reads from the reply's tokens (not strict: a reply cut off
is read as far as it goes), as [channel, recipient, text], or {"error": ...}.

Prints one JSON list, a result per case, on standard output. Run with openai-harmony 0.0.8
on PYTHONPATH and TIKTOKEN_ENCODINGS_BASE naming a folder that holds o200k_base.tiktoken.
"""

import json
import sys

from openai_harmony import (
    Author,
    Conversation,
    DeveloperContent,
    HarmonyEncodingName,
    Message,
    ReasoningEffort,
    Role,
    StreamableParser,
    SystemContent,
    ToolDescription,
    load_harmony_encoding,
)

EFFORTS = {
    "low": ReasoningEffort.LOW,
    "medium": ReasoningEffort.MEDIUM,
    "high": ReasoningEffort.HIGH,
}


def conversation(case, date):
    messages = list(case["messages"])
    effort = EFFORTS[case.get("reasoning_effort") or "medium"]
    system = SystemContent.new().with_reasoning_effort(effort).with_conversation_start_date(date)
    out = [Message.from_role_and_content(Role.SYSTEM, system)]
    instructions = None
    if messages and messages[0]["role"] in ("system", "developer"):
        instructions = messages.pop(0)["content"]
    tools = case.get("tools") or []
    if instructions or tools:
        developer = DeveloperContent.new()
        if instructions:
            developer = developer.with_instructions(instructions)
        if tools:
            developer = developer.with_function_tools(
                [
                    ToolDescription.new(
                        t["function"]["name"],
                        t["function"].get("description", ""),
                        parameters=t["function"].get("parameters"),
                    )
                    for t in tools
                ]
            )
        out.append(Message.from_role_and_content(Role.DEVELOPER, developer))
    last_call = None
    for m in messages:
        role = m["role"]
        if role == "user":
            out.append(Message.from_role_and_content(Role.USER, m["content"]))
        elif role == "assistant":
            if m.get("reasoning_content"):
                out.append(
                    Message.from_role_and_content(Role.ASSISTANT, m["reasoning_content"])
                    .with_channel("analysis")
                )
            for call in m.get("tool_calls") or []:
                function = call["function"]
                arguments = json.dumps(json.loads(function["arguments"]))
                out.append(
                    Message.from_role_and_content(Role.ASSISTANT, arguments)
                    .with_channel("commentary")
                    .with_recipient("functions." + function["name"])
                    .with_content_type("<|constrain|>json")
                )
                last_call = function["name"]
            if m.get("content"):
                out.append(
                    Message.from_role_and_content(Role.ASSISTANT, m["content"]).with_channel("final")
                )
        elif role == "tool":
            author = Author.new(Role.TOOL, "functions." + last_call)
            out.append(
                Message.from_author_and_content(author, m["content"])
                .with_recipient("assistant")
                .with_channel("commentary")
            )
        else:
            raise ValueError(f"role {role!r}")
    return Conversation.from_messages(out)


def parse(encoding, text):
    tokens = encoding.encode(text, allowed_special="all")
    parser = StreamableParser(encoding, role=Role.ASSISTANT, strict=False)
    try:
        for token in tokens:
            parser.process(token)
        parser.process_eos()
    except Exception as e:  # the reference refuses the reply
        return {"error": str(e)}
    messages = [
        [m.channel, m.recipient, "".join(c.text for c in m.content)] for m in parser.messages
    ]
    # What a reply cut off mid-message has written so far.
    if parser.current_content:
        messages.append([parser.current_channel, parser.current_recipient, parser.current_content])
    return messages


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        given = json.load(f)
    encoding = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
    results = []
    for case in given["cases"]:
        if "render" in case:
            conv = conversation(case["render"], given["date"])
            results.append(encoding.render_conversation_for_completion(conv, Role.ASSISTANT))
        else:
            results.append(parse(encoding, case["parse"]))
    print(json.dumps(results))


if __name__ == "__main__":
    main()
