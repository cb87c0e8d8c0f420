"""The real SDKs never see a `recall` call or an extra event: the proxy answers the model's recall
calls between upstream calls, streaming and not, against a strict fake that checks every history
it is sent (tests/fakes/recall.py)."""

from __future__ import annotations

from typing import Any

import pytest
from openai import AsyncOpenAI

from tests.fakes.recall import RecallingModel
from tests.fakes.script import Script
from tests.proxy.compacting.conftest import WINDOW, conversation_of
from tests.proxy.recall.test_rounds import CANARY, TOOLS, compacted_and_archived, with_canary


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
    _, messages, sdk = setup
    model = RecallingModel("quasar QX-7781")
    script.chat = model
    options: Any = {"stream_options": {"include_usage": True}} if include_usage else {}
    stream = await sdk.chat.completions.create(
        model="gpt-test", messages=messages, tools=TOOLS, stream=True, **options
    )
    chunks = [chunk async for chunk in stream]
    assert model.problems == [] and len(model.bodies) == 2
    assert {chunk.id for chunk in chunks} == {chunks[0].id}
    text = "".join(
        chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices
    )
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
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["tool_calls"]
