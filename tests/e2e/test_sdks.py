"""The openai SDK (chat completions and Responses) and the anthropic SDK through the proxy,
streaming and not: each runs two tool-loop conversations against the scripted APIs (conftest),
the test playing the agent. Per client: one session per conversation, compaction applied, every
forwarded request valid for its API, the loop finishes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anthropic
import openai
import orjson
import pytest

from compaction import SUMMARY_MARKER
from tests.e2e.apis import DONE, printed
from tests.e2e.conftest import SDK_MODEL, Stack, agents_sdk

PROMPTS = ("Tally the words, conversation one.", "Tally the lines, conversation two.")
_PARAMETERS = {"type": "object", "properties": {"command": {"type": "string"}}}
_MAX_TURNS = 40

Loop = Callable[[Stack, str, bool], Awaitable[str]]


async def chat_loop(stack: Stack, prompt: str, stream: bool) -> str:
    client = openai.AsyncOpenAI(base_url=f"{stack.proxy_url}/v1", api_key="sk-e2e")
    tools: Any = [{"type": "function", "function": {"name": "run", "parameters": _PARAMETERS}}]
    messages: list[Any] = [
        {"role": "system", "content": "Agent."},
        {"role": "user", "content": prompt},
    ]
    async with client:
        for _ in range(_MAX_TURNS):
            if stream:
                text, calls = "", {}
                chunks = await client.chat.completions.create(
                    model=SDK_MODEL, messages=messages, tools=tools, stream=True
                )
                async for chunk in chunks:
                    for choice in chunk.choices:
                        text += choice.delta.content or ""
                        for call in choice.delta.tool_calls or []:
                            calls.setdefault(call.index, call.model_dump())
                listed = list(calls.values())
            else:
                answer = await client.chat.completions.create(
                    model=SDK_MODEL, messages=messages, tools=tools
                )
                message = answer.choices[0].message
                text = message.content or ""
                listed = [c.model_dump() for c in message.tool_calls or []]
            if not listed:
                return text
            for call in listed:
                call.pop("index", None)
            messages.append({"role": "assistant", "content": None, "tool_calls": listed})
            for call in listed:
                command = orjson.loads(call["function"]["arguments"])
                messages.append(
                    {"role": "tool", "tool_call_id": call["id"], "content": printed(command)}
                )
    raise AssertionError("the loop did not finish")


async def responses_loop(stack: Stack, prompt: str, stream: bool) -> str:
    client = openai.AsyncOpenAI(base_url=f"{stack.proxy_url}/v1", api_key="sk-e2e")
    tools: Any = [{"type": "function", "name": "run", "parameters": _PARAMETERS}]
    items: list[Any] = [{"role": "user", "content": prompt}]
    async with client:
        for _ in range(_MAX_TURNS):
            if stream:
                events = await client.responses.create(
                    model=SDK_MODEL, instructions="Agent.", input=items, tools=tools, stream=True
                )
                output = next(
                    e.response for e in [e async for e in events] if e.type == "response.completed"
                ).output
            else:
                answer = await client.responses.create(
                    model=SDK_MODEL, instructions="Agent.", input=items, tools=tools
                )
                output = answer.output
            calls = [o for o in output if o.type == "function_call"]
            if not calls:
                return "".join(
                    part.text
                    for o in output
                    if o.type == "message"
                    for part in o.content
                    if part.type == "output_text"
                )
            items += [o.model_dump(exclude_none=True) for o in output]
            for call in calls:
                result = printed(orjson.loads(call.arguments))
                items.append(
                    {"type": "function_call_output", "call_id": call.call_id, "output": result}
                )
    raise AssertionError("the loop did not finish")


async def anthropic_loop(stack: Stack, prompt: str, stream: bool, *, thinking: bool = False) -> str:
    client = anthropic.AsyncAnthropic(base_url=stack.proxy_url, api_key="sk-e2e")
    tools: Any = [{"name": "run", "input_schema": _PARAMETERS}]
    messages: list[Any] = [{"role": "user", "content": prompt}]
    async with client:
        for _ in range(_MAX_TURNS):
            asked: dict[str, Any] = {
                "model": SDK_MODEL,
                "max_tokens": 2048,
                "system": "Agent.",
                "messages": messages,
                "tools": tools,
            }
            if thinking:
                asked["thinking"] = {"type": "enabled", "budget_tokens": 1024}
            if stream:
                async with client.messages.stream(**asked) as events:
                    answer = await events.get_final_message()
            else:
                answer = await client.messages.create(**asked)
            uses = [b for b in answer.content if b.type == "tool_use"]
            if not uses:
                return "".join(b.text for b in answer.content if b.type == "text")
            messages.append(
                {
                    "role": "assistant",
                    "content": [b.model_dump(exclude_none=True) for b in answer.content],
                }
            )
            results = [
                {"type": "tool_result", "tool_use_id": b.id, "content": printed(dict(b.input))}  # type: ignore[arg-type]
                for b in uses
            ]
            messages.append({"role": "user", "content": results})
    raise AssertionError("the loop did not finish")


async def agents_loop(stack: Stack, prompt: str, stream: bool) -> str:
    """The openai-agents SDK as a user first writes it: an Agent with one function tool on the
    SDK's default model (Responses), its default client pointed at the proxy."""
    sdk = agents_sdk()
    client = openai.AsyncOpenAI(base_url=f"{stack.proxy_url}/v1", api_key="sk-e2e")
    sdk.set_default_openai_client(client, use_for_tracing=False)
    sdk.set_tracing_disabled(True)

    def run(command: str) -> str:
        """Run a shell command."""
        return printed({"command": command})

    agent = sdk.Agent(
        name="agent", instructions="Agent.", model=SDK_MODEL, tools=[sdk.function_tool(run)]
    )
    async with client:
        if stream:
            streamed = sdk.Runner.run_streamed(agent, prompt, max_turns=_MAX_TURNS)
            async for _ in streamed.stream_events():
                pass
            return str(streamed.final_output)
        result = await sdk.Runner.run(agent, prompt, max_turns=_MAX_TURNS)
        return str(result.final_output)


async def anthropic_thinking_loop(stack: Stack, prompt: str, stream: bool) -> str:
    return await anthropic_loop(stack, prompt, stream, thinking=True)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize(
    ("loop", "path"),
    [
        (chat_loop, "/v1/chat/completions"),
        (responses_loop, "/v1/responses"),
        (anthropic_loop, "/v1/messages"),
        (agents_loop, "/v1/responses"),
        (anthropic_thinking_loop, "/v1/messages"),
    ],
    ids=["openai-chat", "openai-responses", "anthropic", "openai-agents", "anthropic-thinking"],
)
async def test_sdk_tool_loops(stack: Stack, loop: Loop, path: str, stream: bool) -> None:
    sessions: set[str] = set()
    for prompt in PROMPTS:
        before = await stack.sessions()
        seen = len(stack.apis.agent_requests(path))
        assert await loop(stack, prompt, stream) == DONE
        after = await stack.sessions()
        grown = {s for s, count in after.items() if count != before.get(s)}
        assert len(grown) == 1 and not grown & sessions, (before, after)
        sessions |= grown
        texts = [orjson.dumps(r.body).decode() for r in stack.apis.agent_requests(path)[seen:]]
        assert any(SUMMARY_MARKER in t for t in texts), "no compaction reached the upstream"
        assert all(prompt in t for t in texts)
    assert stack.apis.problems == []


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_anthropic_thinking_is_forwarded_untouched_across_a_compaction(
    stack: Stack, stream: bool
) -> None:
    assert await anthropic_thinking_loop(stack, PROMPTS[0], stream) == DONE
    forwarded = stack.apis.agent_requests("/v1/messages")
    compacted = [r for r in forwarded if SUMMARY_MARKER in orjson.dumps(r.body).decode()]
    assert compacted, "no compaction reached the upstream"
    for received in compacted:
        kept = [
            block
            for message in received.body["messages"]
            if message["role"] == "assistant" and isinstance(message["content"], list)
            for block in message["content"]
            if block.get("type") == "thinking"
        ]
        assert kept, "the recent turns lost their thinking"
        assert all(stack.apis.thoughts[b["signature"]] == b for b in kept)
        last_assistant = [m for m in received.body["messages"] if m["role"] == "assistant"][-1]
        assert last_assistant["content"][0]["type"] == "thinking"  # the tool loop's turn opens so
    assert stack.apis.problems == []
