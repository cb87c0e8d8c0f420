"""A chat stream across a recall round when something breaks: the round's upstream refuses, its
stream is cut, the client goes away. Never a hang, never a 500 after the headers."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from tests.fakes.recall import RecallingModel
from tests.fakes.script import Script
from tests.fakes.upstream import FakeUpstream, chat_chunk, hang_reply, json_reply, sse_events
from tests.fakes.upstream import stream_reply as streamed
from tests.proxy.compacting.conftest import WINDOW, conversation_of
from tests.proxy.recall.test_rounds import TOOLS, compacted_and_archived, with_canary


async def open_stream(client: Any, proxy: Any, messages: list[Any]) -> aiohttp.ClientResponse:
    body = orjson.dumps({"model": "gpt-test", "messages": messages, "stream": True, "tools": TOOLS})
    headers = {
        "Content-Type": "application/json",
        "Authorization": "Bearer sk-client",
        "X-Session-Id": "agent-1",
    }
    return await client.post(f"{proxy.url}/v1/chat/completions", data=body, headers=headers)


def second_call_replies(model: RecallingModel, then: Any, upstream: FakeUpstream) -> Any:
    """The model's first (streamed) answer, then `then` for the round."""

    async def reply(request: web.Request) -> web.StreamResponse:
        if not model.bodies:
            return await model(request)
        model.bodies.append(await request.json())
        return await then(request, upstream)

    return reply


@pytest.fixture
async def ready(start: Any, script: Script, client: Any) -> Any:
    proxy = await start()
    messages = with_canary(conversation_of(int(WINDOW * 1.3)))
    await compacted_and_archived(client, proxy, messages)
    return proxy, messages


async def test_a_round_the_upstream_refuses_ends_the_stream_as_without_recall(
    ready: Any, script: Script, client: Any
) -> None:
    proxy, messages = ready
    model = RecallingModel("quasar")
    refused = json_reply({"error": {"message": "overloaded"}}, status=529)
    script.chat = second_call_replies(model, refused, script.upstream)
    response = await asyncio.wait_for(open_stream(client, proxy, messages), 10)
    async with response:
        assert response.status == 200
        body = await asyncio.wait_for(response.read(), 10)
    events = [line[6:] for line in body.split(b"\n") if line.startswith(b"data: ")]
    assert events[-1] == b"[DONE]" and events.count(b"[DONE]") == 1
    chunks = [orjson.loads(event) for event in events[:-1]]
    assert b'"recall"' not in body and b"tool_calls" not in body
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert [f for f in finishes if f] == ["stop"]
    assert len(model.bodies) == 2


async def test_a_round_whose_stream_is_cut_ends_the_clients_stream_short(
    ready: Any, script: Script, client: Any
) -> None:
    proxy, messages = ready
    model = RecallingModel("quasar")
    cut = streamed(sse_events(chat_chunk("recalled: par"), done=False), cut=True)
    script.chat = second_call_replies(model, cut, script.upstream)
    response = await asyncio.wait_for(open_stream(client, proxy, messages), 10)
    async with response:
        assert response.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            await asyncio.wait_for(response.read(), 10)


async def test_a_client_gone_during_a_round_releases_the_rounds_upstream_call(
    ready: Any, script: Script, client: Any
) -> None:
    proxy, messages = ready
    model = RecallingModel("quasar")
    script.chat = second_call_replies(model, hang_reply(), script.upstream)
    response = await asyncio.wait_for(open_stream(client, proxy, messages), 10)
    await asyncio.wait_for(response.content.readany(), 10)  # the stream is under way
    for _ in range(250):  # the round's call is out
        if len(model.bodies) == 2:
            break
        await asyncio.sleep(0.02)
    response.close()
    await asyncio.wait_for(script.upstream.disconnected.wait(), 10)
