"""Streams are relayed chunk by chunk, and end promptly when either side goes away."""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import orjson
import pytest

from proxy.http import keys
from proxy.logs import JsonFormatter
from tests.fakes.upstream import FakeUpstream, chat_chunk, sse_events, stream_reply
from tests.proxy.conftest import RunningProxy, StartProxy

STREAM_BODY = b'{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}'


async def test_first_chunk_reaches_the_client_before_the_upstream_sends_the_second(
    proxy: RunningProxy, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    first_seen = asyncio.Event()
    first, second, done = sse_events(chat_chunk("one"), chat_chunk("two"))
    # The upstream holds the second chunk until the client has the first: a buffering proxy
    # deadlocks here and the wait_for below fails.
    upstream.reply(stream_reply([first, first_seen, second, done]))
    async with client.post(f"{proxy.url}/v1/chat/completions", data=STREAM_BODY) as response:
        assert response.status == 200
        assert response.headers["Content-Type"] == "text/event-stream"
        received = await asyncio.wait_for(response.content.readuntil(b"\n\n"), timeout=5)
        assert received == first
        assert upstream.chunks_sent == 1
        first_seen.set()
        rest = await asyncio.wait_for(response.content.read(), timeout=5)
    assert rest == second + done


async def test_every_chunk_arrives_as_it_leaves_the_upstream(
    proxy: RunningProxy, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    chunks = sse_events(*(chat_chunk(str(i)) for i in range(5)))
    gates = [asyncio.Event() for _ in chunks]
    steps: list[bytes | float | asyncio.Event] = []
    for chunk, gate in zip(chunks, gates, strict=True):
        steps += [chunk, gate]
    upstream.reply(stream_reply(steps))
    async with client.post(f"{proxy.url}/v1/chat/completions", data=STREAM_BODY) as response:
        for chunk, gate in zip(chunks, gates, strict=True):
            got = await asyncio.wait_for(response.content.readuntil(b"\n\n"), timeout=5)
            assert got == chunk
            gate.set()
        assert await response.content.read() == b""


async def test_client_disconnect_mid_stream_closes_the_upstream_request(
    proxy: RunningProxy, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    chunks = sse_events(*(chat_chunk(str(i)) for i in range(200)))
    steps: list[bytes | float | asyncio.Event] = []
    for chunk in chunks:
        steps += [chunk, 0.02]
    upstream.reply(stream_reply(steps))
    response = await client.post(f"{proxy.url}/v1/chat/completions", data=STREAM_BODY)
    await asyncio.wait_for(response.content.readuntil(b"\n\n"), timeout=5)
    response.close()  # the client goes away after one chunk
    await asyncio.wait_for(upstream.disconnected.wait(), timeout=5)
    assert upstream.chunks_sent < 100


async def test_client_disconnect_while_upstream_is_silent_closes_the_upstream_request(
    proxy: RunningProxy, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    never = asyncio.Event()
    first, *_ = sse_events(chat_chunk("one"))
    upstream.reply(stream_reply([first, never]))
    response = await client.post(f"{proxy.url}/v1/chat/completions", data=STREAM_BODY)
    await asyncio.wait_for(response.content.readuntil(b"\n\n"), timeout=5)
    response.close()
    await asyncio.wait_for(upstream.disconnected.wait(), timeout=10)
    assert upstream.disconnected.is_set()


@pytest.mark.parametrize(
    ("path", "route"),
    [
        ("chat/completions", "chat"),
        ("responses", "responses"),
        ("messages", "messages"),
        ("embeddings", "forward"),
    ],
)
async def test_a_client_gone_mid_stream_is_counted_and_logged_as_gone(
    path: str,
    route: str,
    start_proxy: StartProxy,
    upstream: FakeUpstream,
    client: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    proxy = await start_proxy(upstream={"anthropic_base_url": upstream.base_url})
    never = asyncio.Event()
    first, *_ = sse_events(chat_chunk("one"))
    upstream.reply(stream_reply([first, never]))
    response = await client.post(f"{proxy.url}/v1/{path}", data=STREAM_BODY)
    await asyncio.wait_for(response.content.readuntil(b"\n\n"), timeout=5)
    response.close()
    await asyncio.wait_for(upstream.disconnected.wait(), timeout=5)
    registry = proxy.app[keys.METRICS].registry
    for _ in range(100):  # the handler ends a moment after the upstream saw the close
        if registry.get_sample_value("compaction_proxy_in_flight_requests") == 0:
            break
        await asyncio.sleep(0.02)
    assert registry.get_sample_value("compaction_proxy_in_flight_requests") == 0
    gone = registry.get_sample_value("compaction_proxy_client_disconnects_total", {"route": route})
    assert gone == 1
    formatter = JsonFormatter()
    lines = [orjson.loads(formatter.format(r)) for r in caplog.records if r.name == "proxy.access"]
    assert [(line["status"], line["outcome"]) for line in lines] == [(499, "client_gone")]


async def test_upstream_dying_mid_stream_ends_the_client_stream(
    proxy: RunningProxy, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    first, second, _ = sse_events(chat_chunk("one"), chat_chunk("two"))
    upstream.reply(stream_reply([first, second], cut=True))
    received = b""
    async with client.post(f"{proxy.url}/v1/chat/completions", data=STREAM_BODY) as response:
        assert response.status == 200
        # The client learns the stream is incomplete (no terminating chunk), and never hangs.
        with pytest.raises(aiohttp.ClientPayloadError):
            async with asyncio.timeout(5):
                async for chunk in response.content.iter_any():
                    received += chunk
    assert received == first + second
    async with client.get(f"{proxy.url}/metrics") as metrics:
        text = await metrics.text()
    assert 'compaction_proxy_upstream_errors_total{kind="stream_cut"} 1.0' in text


async def test_silent_upstream_mid_stream_ends_the_client_stream_after_the_read_timeout(
    start_proxy: StartProxy, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    proxy = await start_proxy(upstream={"timeout_s": 1.0})
    never = asyncio.Event()
    first, *_ = sse_events(chat_chunk("one"))
    upstream.reply(stream_reply([first, never]))
    async with client.post(f"{proxy.url}/v1/chat/completions", data=STREAM_BODY) as response:
        assert response.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            async with asyncio.timeout(5):
                await response.content.read()
