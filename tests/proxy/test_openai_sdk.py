"""The official `openai` SDK, pointed at the proxy with nothing but `base_url`."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from openai import AsyncOpenAI

from tests.fakes.upstream import (
    FakeUpstream,
    chat_chunk,
    chat_reply,
    sse_events,
    stream_reply,
)
from tests.proxy.conftest import RunningProxy


@pytest.fixture
async def sdk(proxy: RunningProxy) -> AsyncIterator[AsyncOpenAI]:
    client = AsyncOpenAI(base_url=f"{proxy.url}/s/sdk-test/v1", api_key="sk-sdk", max_retries=0)
    try:
        yield client
    finally:
        await client.close()


async def test_sdk_non_streaming_round_trip(sdk: AsyncOpenAI, upstream: FakeUpstream) -> None:
    upstream.reply(chat_reply("4"))
    completion = await sdk.chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "2+2?"}]
    )
    assert completion.choices[0].message.content == "4"
    assert completion.usage is not None and completion.usage.total_tokens == 12
    sent = upstream.requests[-1]
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["Authorization"] == "Bearer sk-sdk"
    assert sent.json()["messages"] == [{"role": "user", "content": "2+2?"}]


async def test_sdk_streaming_round_trip(sdk: AsyncOpenAI, upstream: FakeUpstream) -> None:
    upstream.reply(
        stream_reply(sse_events(chat_chunk("Hel"), chat_chunk("lo"), chat_chunk(None, finish=True)))
    )
    stream = await sdk.chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    parts = [chunk.choices[0].delta.content async for chunk in stream if chunk.choices]
    assert "".join(p for p in parts if p) == "Hello"
    assert upstream.requests[-1].json()["stream"] is True


async def test_sdk_sees_upstream_errors_as_the_upstream_sent_them(
    sdk: AsyncOpenAI, upstream: FakeUpstream
) -> None:
    from openai import RateLimitError

    from tests.fakes.upstream import json_reply

    upstream.reply(
        json_reply(
            {"error": {"message": "slow down", "type": "requests", "code": "rate_limit_exceeded"}},
            status=429,
        )
    )
    with pytest.raises(RateLimitError) as raised:
        await sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert raised.value.code == "rate_limit_exceeded"
