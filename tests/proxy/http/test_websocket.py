"""WebSocket upgrades (Codex's first request: `GET /v1/responses` with `Upgrade: websocket`):
answered 426 by the proxy itself by default, or relayed end to end with
`upstream.websocket: relay`. A half handshake never reaches the upstream."""

from __future__ import annotations

import asyncio

import aiohttp
import orjson
import pytest
from aiohttp import web

from tests.fakes.rawhttp import raw_request
from tests.fakes.upstream import FakeUpstream, json_reply
from tests.proxy.conftest import StartProxy
from tests.proxy.http.test_errors import assert_openai_error

CODEX_UPGRADE = {
    "Upgrade": "websocket",
    "Connection": "Upgrade",
    "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
    "Sec-WebSocket-Version": "13",
    "openai-beta": "responses_websockets=2026-02-06",
    "Authorization": "Bearer sk-codex",
}


@pytest.mark.parametrize("path", ["/v1/responses", "/s/codex/v1/responses", "/v1/realtime"])
async def test_an_upgrade_is_answered_426_by_the_proxy_and_never_forwarded(
    start_proxy: StartProxy, upstream: FakeUpstream, path: str
) -> None:
    proxy = await start_proxy()  # upstream.websocket: refuse, the default
    status, body = await raw_request(proxy.port, "GET", path, CODEX_UPGRADE)
    assert status == 426
    assert_openai_error(body, "websocket_not_relayed")
    assert upstream.requests == []


async def test_a_websocket_client_is_refused_and_the_same_route_serves_http_after(
    start_proxy: StartProxy, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    proxy = await start_proxy()
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await client.ws_connect(f"{proxy.url}/v1/responses")
    assert refused.value.status == 426
    async with client.post(f"{proxy.url}/v1/responses", json={"model": "m", "input": "hi"}) as r:
        assert r.status == 200
    assert [request.method for request in upstream.requests] == ["POST"]


class SocketUpstream:
    """A Responses WebSocket on loopback: answers each `response.create` with
    `response.created` and `response.completed`, and keeps what it saw."""

    def __init__(self) -> None:
        self.handshakes: list[web.Request] = []
        self.received: list[object] = []
        self.close_codes: list[int | None] = []
        self.close_first = asyncio.Event()

    async def reply(self, request: web.Request, upstream: FakeUpstream) -> web.StreamResponse:
        self.handshakes.append(request)
        socket = web.WebSocketResponse(protocols=("openai-realtime",))
        await socket.prepare(request)
        async for message in socket:
            payload = orjson.loads(message.data)
            self.received.append(payload)
            if payload.get("type") == "response.create":
                await socket.send_str(orjson.dumps({"type": "response.created"}).decode())
                await socket.send_bytes(
                    orjson.dumps({"type": "response.completed", "response": {"id": "r1"}})
                )
            if payload.get("type") == "bye":
                await socket.close(code=4001, message=b"done")
        self.close_codes.append(socket.close_code)
        return socket


async def test_relay_carries_messages_both_ways_and_the_clients_close(
    start_proxy: StartProxy, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    fake = SocketUpstream()
    upstream.reply(fake.reply)
    proxy = await start_proxy(upstream={"base_url": upstream.base_url, "websocket": "relay"})
    async with client.ws_connect(
        f"{proxy.url}/s/codex/v1/responses?x=1",
        headers={"Authorization": "Bearer sk-codex", "openai-beta": CODEX_UPGRADE["openai-beta"]},
        protocols=("openai-realtime",),
    ) as socket:
        assert socket.protocol == "openai-realtime"
        await socket.send_str(orjson.dumps({"type": "response.create", "input": []}).decode())
        created = await asyncio.wait_for(socket.receive(), 5)
        assert created.type == aiohttp.WSMsgType.TEXT
        assert orjson.loads(created.data) == {"type": "response.created"}
        completed = await asyncio.wait_for(socket.receive(), 5)
        assert completed.type == aiohttp.WSMsgType.BINARY
        assert orjson.loads(completed.data)["response"]["id"] == "r1"
        await socket.close(code=4000)
    for _ in range(100):
        if fake.close_codes:
            break
        await asyncio.sleep(0.02)
    assert fake.close_codes == [4000]
    assert fake.received == [{"type": "response.create", "input": []}]
    handshake = fake.handshakes[0]
    assert handshake.path == "/v1/responses"
    assert handshake.query_string == "x=1"
    assert handshake.headers["Authorization"] == "Bearer sk-codex"
    assert handshake.headers["openai-beta"] == CODEX_UPGRADE["openai-beta"]
    # One handshake, the proxy's own: not the client's key forwarded beside it.
    assert len(handshake.headers.getall("Sec-WebSocket-Key")) == 1


async def test_relay_passes_the_upstreams_close_to_the_client(
    start_proxy: StartProxy, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    fake = SocketUpstream()
    upstream.reply(fake.reply)
    proxy = await start_proxy(upstream={"base_url": upstream.base_url, "websocket": "relay"})
    async with client.ws_connect(f"{proxy.url}/v1/responses") as socket:
        await socket.send_str('{"type": "bye"}')
        closing = await asyncio.wait_for(socket.receive(), 5)
        assert closing.type == aiohttp.WSMsgType.CLOSE
        assert socket.close_code == 4001


@pytest.mark.parametrize(("answer", "passed_on"), [(426, 426), (404, 404), (200, 502)])
async def test_relay_passes_on_an_upstream_that_does_not_upgrade(
    start_proxy: StartProxy,
    upstream: FakeUpstream,
    client: aiohttp.ClientSession,
    answer: int,
    passed_on: int,
) -> None:
    upstream.reply(json_reply({"error": {"message": "no"}}, status=answer))
    proxy = await start_proxy(upstream={"base_url": upstream.base_url, "websocket": "relay"})
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await client.ws_connect(f"{proxy.url}/v1/responses")
    assert refused.value.status == passed_on
