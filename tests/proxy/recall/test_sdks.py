"""The real SDKs never see a `recall` call or an extra event: the proxy answers the model's recall
calls between upstream calls, streaming and not, against a strict fake that checks every history
it is sent (tests/fakes/recall.py)."""

from __future__ import annotations

from typing import Any

import pytest
from anthropic import AsyncAnthropic
from openai import AsyncOpenAI

from proxy.http import keys
from tests.fakes.recall import RecallingModel
from tests.fakes.script import Script
from tests.proxy.compacting.conftest import WINDOW, conversation_of
from tests.proxy.compacting.test_anthropic import anthropic_body
from tests.proxy.compacting.test_responses import responses_body
from tests.proxy.compacting.test_responses import send as send_responses
from tests.proxy.recall.test_rounds import (
    CANARY,
    TOOLS,
    archived,
    compacted_and_archived,
    with_canary,
)


@pytest.fixture
async def setup(start: Any, script: Script, client: Any) -> Any:
    """A proxy whose session `agent-1` has compacted and archived a conversation holding the
    canary; the conversation, and an `openai` client naming that session."""
    proxy = await start()
    messages = with_canary(conversation_of(int(WINDOW * 1.3)))
    await compacted_and_archived(client, proxy, messages, tools=TOOLS)
    sdk = AsyncOpenAI(base_url=f"{proxy.url}/s/agent-1/v1", api_key="sk-client", max_retries=0)
    try:
        yield proxy, messages, sdk
    finally:
        await sdk.close()


async def test_the_openai_sdk_gets_one_answer_built_on_the_recalled_turn(
    setup: Any, script: Script
) -> None:
    _, messages, sdk = setup
    model = RecallingModel("quasar QX-7781")
    script.chat = model
    raw = await sdk.chat.completions.with_raw_response.create(
        model="gpt-test", messages=messages, tools=TOOLS
    )
    answer = raw.parse()
    assert raw.headers["x-compaction-recall-rounds"] == "1"
    message = answer.choices[0].message
    assert message.tool_calls is None and answer.choices[0].finish_reason == "stop"
    assert message.content is not None and CANARY in message.content
    assert model.problems == [] and len(model.bodies) == 2


@pytest.mark.parametrize("include_usage", [False, True])
async def test_the_openai_sdk_streams_one_answer_across_a_recall_round(
    setup: Any, script: Script, include_usage: bool
) -> None:
    proxy, messages, sdk = setup
    model = RecallingModel("quasar QX-7781")
    script.chat = model
    options: Any = {"stream_options": {"include_usage": True}} if include_usage else {}
    stream = await sdk.chat.completions.create(
        model="gpt-test", messages=messages, tools=TOOLS, stream=True, **options
    )
    chunks = [chunk async for chunk in stream]
    assert model.problems == [] and len(model.bodies) == 2
    assert {chunk.id for chunk in chunks} == {chunks[0].id}
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    # The text before the call went out; then the answer built on the recalled turn.
    assert text.startswith("Let me check. recalled: ") and CANARY in text
    assert all(not chunk.choices or chunk.choices[0].delta.tool_calls is None for chunk in chunks)
    finishes = [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices]
    assert [f for f in finishes if f is not None] == ["stop"]
    usages = [chunk.usage for chunk in chunks if chunk.usage is not None]
    if include_usage:
        assert len(usages) == 1 and usages[0].total_tokens == 210
    else:
        assert usages == []
    # The session's timeline says the round, and what it cost when the upstream said so.
    line = proxy.app[keys.RECORDS].timeline("agent-1")[-1]
    assert (line["recall_rounds"], line["recall_tokens"]) == (1, 105 if include_usage else 0)


async def test_a_streamed_recall_call_beside_the_clients_own_streams_the_clients_only(
    setup: Any, script: Script
) -> None:
    _, messages, sdk = setup
    model = RecallingModel("quasar", also=("bash", '{"cmd": "ls"}'))
    script.chat = model
    stream = await sdk.chat.completions.create(
        model="gpt-test", messages=messages, tools=TOOLS, stream=True
    )
    chunks = [chunk async for chunk in stream]
    assert len(model.bodies) == 1
    calls = [
        call
        for chunk in chunks
        if chunk.choices
        for call in chunk.choices[0].delta.tool_calls or []
    ]
    assert {call.index for call in calls} == {0}
    assert [call.function.name for call in calls if call.function and call.function.name] == [
        "bash"
    ]
    arguments = "".join(call.function.arguments or "" for call in calls if call.function)
    assert arguments == '{"cmd": "ls"}'
    finishes = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finishes == ["tool_calls"]


# -- Responses and Anthropic -----------------------------------------------------------------


def canary_in_responses(body: dict[str, Any]) -> dict[str, Any]:
    item = next(i for i in body["input"] if i.get("type") == "function_call_output")
    item["output"] = CANARY
    return body


def canary_in_anthropic(body: dict[str, Any]) -> dict[str, Any]:
    for message in body["messages"]:
        content = message.get("content")
        if isinstance(content, list):
            for block in content:
                if block.get("type") == "tool_result":
                    block["content"] = CANARY
                    return body
    raise AssertionError("no tool_result")


async def test_the_openai_sdk_gets_one_response_built_on_the_recalled_turn(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start()
    body = canary_in_responses(responses_body(int(WINDOW * 1.3)))
    first = await send_responses(client, f"{proxy.url}/s/agent-r/v1/responses", body)
    assert first.headers["x-compaction-status"] == "applied"
    await archived(client, proxy, "quasar QX-7781", session="agent-r")
    model = RecallingModel("quasar QX-7781")
    script.chat = model
    sdk = AsyncOpenAI(base_url=f"{proxy.url}/s/agent-r/v1", api_key="sk-client", max_retries=0)
    try:
        raw = await sdk.responses.with_raw_response.create(
            model=body["model"], input=body["input"], tools=body["tools"],
            instructions=body.get("instructions"),
        )  # fmt: skip
    finally:
        await sdk.close()
    response = raw.parse()
    assert raw.headers["x-compaction-recall-rounds"] == "1"
    assert [item.type for item in response.output] == ["message"]
    assert CANARY in response.output_text
    assert model.problems == [] and script.problems == [] and len(model.bodies) == 2
    added = model.bodies[1]["input"][len(model.bodies[0]["input"]) :]
    assert [item["type"] for item in added] == ["function_call", "function_call_output"]
    assert response.usage is not None and response.usage.input_tokens == 200


async def test_the_openai_sdk_streams_one_response_across_a_recall_round(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start()
    body = canary_in_responses(responses_body(int(WINDOW * 1.3)))
    first = await send_responses(client, f"{proxy.url}/s/agent-r/v1/responses", body)
    assert first.headers["x-compaction-status"] == "applied"
    await archived(client, proxy, "quasar QX-7781", session="agent-r")
    model = RecallingModel("quasar QX-7781")
    script.chat = model
    sdk = AsyncOpenAI(base_url=f"{proxy.url}/s/agent-r/v1", api_key="sk-client", max_retries=0)
    try:
        async with sdk.responses.stream(
            model=body["model"], input=body["input"], tools=body["tools"],
            instructions=body.get("instructions"),
        ) as stream:  # fmt: skip
            events = [event async for event in stream]
            response = await stream.get_final_response()
    finally:
        await sdk.close()
    assert model.problems == [] and script.problems == [] and len(model.bodies) == 2
    kinds = [event.type for event in events]
    assert kinds.count("response.created") == 1 and kinds.count("response.completed") == 1
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert "response.function_call_arguments.delta" not in kinds
    assert [item.type for item in response.output] == ["message", "message"]
    assert response.output_text.startswith("Let me check. ") and CANARY in response.output_text
    assert response.usage is not None and response.usage.input_tokens == 200
    added = model.bodies[1]["input"][len(model.bodies[0]["input"]) :]
    assert [item["type"] for item in added] == ["message", "function_call", "function_call_output"]


@pytest.fixture
async def anthropic_setup(start: Any, script: Script, client: Any, upstream: Any) -> Any:
    """A proxy whose session `agent-a` has compacted and archived an Anthropic conversation
    holding the canary (through the SDK: its credential scopes the archive); the request's
    fields and the SDK."""
    proxy = await start(upstream={"anthropic_base_url": upstream.base_url})
    body = canary_in_anthropic(anthropic_body(int(WINDOW * 1.3)))
    fields: Any = {key: body[key] for key in ("model", "max_tokens", "system", "messages", "tools")}
    sdk = AsyncAnthropic(base_url=f"{proxy.url}/s/agent-a", api_key="sk-ant-client", max_retries=0)
    try:
        first = await sdk.messages.with_raw_response.create(**fields)
        assert first.headers["x-compaction-status"] == "applied"
        await archived(client, proxy, "quasar QX-7781", session="agent-a")
        yield fields, sdk
    finally:
        await sdk.close()


async def test_the_anthropic_sdk_gets_one_message_built_on_the_recalled_turn(
    anthropic_setup: Any, script: Script
) -> None:
    fields, sdk = anthropic_setup
    model = RecallingModel("quasar QX-7781")
    script.chat = model
    raw = await sdk.messages.with_raw_response.create(**fields)
    message = await raw.parse()
    assert raw.headers["x-compaction-recall-rounds"] == "1"
    assert [block.type for block in message.content] == ["text"]
    assert message.stop_reason == "end_turn"
    text = message.content[0].text  # type: ignore[union-attr]
    assert CANARY in text
    assert model.problems == [] and script.problems == [] and len(model.bodies) == 2
    assert message.usage.input_tokens == 200


async def test_the_anthropic_sdk_streams_one_message_across_a_recall_round(
    anthropic_setup: Any, script: Script
) -> None:
    fields, sdk = anthropic_setup
    model = RecallingModel("quasar QX-7781")
    script.chat = model
    async with sdk.messages.stream(**fields) as stream:
        events = [event async for event in stream]
        message = await stream.get_final_message()
    assert model.problems == [] and script.problems == [] and len(model.bodies) == 2
    assert [e.type for e in events].count("message_start") == 1
    assert [e.type for e in events].count("message_stop") == 1
    # The text before the call went out, then the answer as the next block of the same message.
    assert [block.type for block in message.content] == ["text", "text"]
    first, answer = (block.text for block in message.content)  # type: ignore[union-attr]
    assert first == "Let me check. " and CANARY in answer
    assert message.stop_reason == "end_turn"
    assert message.usage.output_tokens == 7
    # The round's request continues the first: the call (its input whole) and its result.
    added = model.bodies[1]["messages"][len(model.bodies[0]["messages"]) :]
    assert added[0]["content"][1] == {
        "type": "tool_use", "id": "toolu_r1", "name": "recall",
        "input": {"query": "quasar QX-7781"},
    }  # fmt: skip
    assert added[1]["content"][0]["tool_use_id"] == "toolu_r1"


async def test_a_streamed_recall_call_beside_the_clients_own_streams_the_clients_tool_use_only(
    anthropic_setup: Any, script: Script
) -> None:
    fields, sdk = anthropic_setup
    script.chat = RecallingModel("quasar", also=("bash", '{"cmd": "ls"}'))
    async with sdk.messages.stream(**fields) as stream:
        message = await stream.get_final_message()
    assert [block.type for block in message.content] == ["text", "tool_use"]
    assert message.content[1].name == "bash"  # type: ignore[union-attr]
    assert message.content[1].input == {"cmd": "ls"}  # type: ignore[union-attr]
    assert message.stop_reason == "tool_use"
