"""The proxy's own errors: OpenAI error shape, right status, never a bare 500 or traceback."""

from __future__ import annotations

import asyncio
import gzip
import re
import socket
from typing import Any

import aiohttp
import orjson
import pytest

from proxy.interception import Exchange, Passthrough, RequestContext
from tests.fakes.rawhttp import raw_request
from tests.fakes.upstream import FakeUpstream, hang_reply, json_reply
from tests.proxy.conftest import RunningProxy, StartProxy


def assert_openai_error(body: bytes, code: str | None) -> None:
    error = orjson.loads(body)["error"]
    assert set(error) == {"message", "type", "code"}
    assert error["message"] and "Traceback" not in error["message"]
    assert error["code"] == code


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_unreachable_upstream_is_a_502(
    start_proxy: StartProxy, client: aiohttp.ClientSession
) -> None:
    proxy = await start_proxy(upstream={"base_url": f"http://127.0.0.1:{free_port()}/v1"})
    for method, path in (("POST", "/v1/chat/completions"), ("GET", "/v1/models")):
        async with client.request(method, f"{proxy.url}{path}", data=b"{}") as response:
            assert response.status == 502
            assert_openai_error(await response.read(), "upstream_unreachable")


async def test_silent_upstream_is_a_504_after_the_read_timeout(
    start_proxy: StartProxy, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    proxy = await start_proxy(upstream={"timeout_s": 0.2})
    upstream.reply(hang_reply())
    async with client.post(f"{proxy.url}/v1/chat/completions", data=b"{}") as response:
        assert response.status == 504
        assert_openai_error(await response.read(), "upstream_timeout")


async def test_oversize_body_is_a_413_and_never_reaches_the_upstream(
    start_proxy: StartProxy, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    proxy = await start_proxy(server={"max_body_mb": 0.01})  # ~10 KiB
    big = b'{"messages": "' + b"x" * 20_000 + b'"}'
    for path in ("/v1/chat/completions", "/s/a/v1/chat/completions", "/v1/files"):
        async with client.post(f"{proxy.url}{path}", data=big) as response:
            assert response.status == 413
            assert_openai_error(await response.read(), "request_too_large")

    async def chunked() -> object:  # no Content-Length: the limit is enforced while streaming
        for _ in range(20):
            yield b"x" * 1000

    async with client.post(f"{proxy.url}/v1/chat/completions", data=chunked()) as response:
        assert response.status == 413
    assert upstream.requests == []


async def test_oversize_chunked_body_on_the_generic_route_is_a_413(
    start_proxy: StartProxy, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    proxy = await start_proxy(server={"max_body_mb": 0.01})

    async def chunked() -> object:
        for _ in range(20):
            yield b"x" * 1000

    async with client.post(f"{proxy.url}/v1/files", data=chunked()) as response:
        assert response.status == 413
        assert_openai_error(await response.read(), "request_too_large")


async def _expecting(port: int, path: str, length: int) -> tuple[asyncio.StreamReader, Any]:
    """A POST that states its length and asks to go ahead before sending its body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Expect: 100-continue\r\nContent-Length: {length}\r\n\r\n"
    )
    writer.write(head.encode())
    await writer.drain()
    return reader, writer


async def _response(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    found = re.search(rb"content-length: *(\d+)", head, re.I)
    return head, await reader.readexactly(int(found.group(1))) if found else b""


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/s/a/v1/files"])
async def test_a_body_announced_past_the_limit_is_refused_before_it_is_sent(
    start_proxy: StartProxy, upstream: FakeUpstream, path: str
) -> None:
    # `Expect: 100-continue` asks whether to send the body: a body the proxy would refuse is
    # refused now, not after the client uploaded it.
    proxy = await start_proxy(server={"max_body_mb": 0.01})
    reader, writer = await _expecting(proxy.port, path, 20_000)
    head, body = await _response(reader)
    writer.close()
    assert head.startswith(b"HTTP/1.1 413"), head  # no "100 Continue" first
    assert_openai_error(body, "request_too_large")
    assert upstream.requests == []


async def test_a_body_announced_within_the_limit_is_asked_for_and_forwarded(
    start_proxy: StartProxy, upstream: FakeUpstream
) -> None:
    proxy = await start_proxy(server={"max_body_mb": 0.01})
    body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
    reader, writer = await _expecting(proxy.port, "/v1/chat/completions", len(body))
    go_ahead = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert go_ahead == b"HTTP/1.1 100 Continue\r\n\r\n"
    writer.write(body)
    head, _ = await _response(reader)
    writer.close()
    assert head.startswith(b"HTTP/1.1 200"), head
    assert upstream.requests[-1].body == body


async def test_a_small_compressed_body_that_decodes_past_the_limit_is_a_413(
    start_proxy: StartProxy, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    # The limit counts the decoded bytes (what would be held and forwarded), not the wire bytes:
    # 200 KB of zeros gzip to a few hundred bytes.
    proxy = await start_proxy(server={"max_body_mb": 0.01})
    bomb = gzip.compress(b'{"messages": "' + b"0" * 200_000 + b'"}')
    assert len(bomb) < 1000
    async with client.post(
        f"{proxy.url}/v1/chat/completions", data=bomb, headers={"Content-Encoding": "gzip"}
    ) as response:
        assert response.status == 413
        assert_openai_error(await response.read(), "request_too_large")
    assert upstream.requests == []


async def _half_sent(
    port: int, path: str, *, length: int, sent: bytes
) -> tuple[asyncio.StreamReader, Any]:
    """A POST that states `length` bytes of body, sends `sent` of them and then nothing."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    )
    writer.write(head.encode() + sent)
    await writer.drain()
    return reader, writer


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/files", "/v1/messages"])
async def test_a_client_that_stops_sending_its_body_gets_a_408(
    start_proxy: StartProxy, upstream: FakeUpstream, path: str
) -> None:
    proxy = await start_proxy(server={"read_timeout_s": 0.2})
    reader, writer = await _half_sent(proxy.port, path, length=1000, sent=b'{"model": "m", ')
    head, body = await _response(reader)
    writer.close()
    assert head.startswith(b"HTTP/1.1 408"), head
    # The connection ends with the answer (the server reads and drops what else comes for a
    # while, as aiohttp does): nothing sent after it can be taken for a next request.
    assert b"connection: close" in head.lower()
    error = orjson.loads(body)["error"]
    assert "server.read_timeout_s" in error["message"]
    if path == "/v1/messages":  # Anthropic's shape on Anthropic's paths
        assert error["type"] == "invalid_request_error" and "code" not in error
    else:
        assert_openai_error(body, "request_timeout")
    # Nothing but the streamed route's partial upload ever left for the upstream, and that one
    # was never answered as a whole request.
    assert all(request.path.endswith("/files") for request in upstream.requests)


async def test_a_slow_client_that_keeps_sending_is_not_cut_off(
    start_proxy: StartProxy, upstream: FakeUpstream
) -> None:
    # The timeout is the longest silence, not the whole upload: pieces every 0.1 s for 0.8 s
    # against a 0.5 s timeout go through.
    proxy = await start_proxy(server={"read_timeout_s": 0.5})
    body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
    pieces = [body[i : i + 8] for i in range(0, len(body), 8)]  # 8 pieces: 0.8 s in all
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
    )
    for piece in pieces:
        await asyncio.sleep(0.1)
        writer.write(piece)
        await writer.drain()
    head, _ = await _response(reader)
    writer.close()
    assert head.startswith(b"HTTP/1.1 200"), head
    assert upstream.requests[-1].body == body


@pytest.mark.parametrize(
    "session",
    ["..", ".hidden", "a%20b", "a%2Fb", "%2e%2e", "x" * 129, "caf%C3%A9", "a%00b"],
)
async def test_invalid_session_ids_are_refused_with_400(
    proxy: RunningProxy, upstream: FakeUpstream, session: str
) -> None:
    status, body = await raw_request(
        proxy.port, "POST", f"/s/{session}/v1/chat/completions", body=b"{}"
    )
    assert status == 400, body
    assert_openai_error(body, "invalid_session_id")
    assert upstream.requests == []


@pytest.mark.parametrize("header", ["../etc", ".", "a/b", "", "x" * 129])
async def test_invalid_session_header_is_refused_with_400(
    proxy: RunningProxy, upstream: FakeUpstream, client: aiohttp.ClientSession, header: str
) -> None:
    for path in ("/v1/chat/completions", "/v1/models"):
        async with client.post(
            f"{proxy.url}{path}", data=b"{}", headers={"X-Session-Id": header}
        ) as response:
            assert response.status == 400
            assert_openai_error(await response.read(), "invalid_session_id")
    assert upstream.requests == []


@pytest.mark.parametrize(
    "target",
    [
        "/v1/../admin/sessions",
        "/v1/models/../../secret",
        "/v1/%2e%2e/secret",
        "/v1/a/%2E%2E/%2e%2e/secret",
        "/v1//evil.example.com/x",
        "/v1/http://evil.example.com/x",
        "/v1/@evil.example.com/x",
        "/v1/x%40evil.example.com",
        "/v1/a%5C..%5Cb",
        "/s/ok/v1/../../x",
    ],
)
async def test_path_tails_that_could_leave_the_upstream_are_refused(
    proxy: RunningProxy, upstream: FakeUpstream, target: str
) -> None:
    status, body = await raw_request(proxy.port, "GET", target)
    assert status == 400, body
    assert_openai_error(body, "invalid_path")
    assert upstream.requests == []


async def test_unknown_route_is_a_404_in_openai_shape(
    proxy: RunningProxy, client: aiohttp.ClientSession
) -> None:
    async with client.get(f"{proxy.url}/v2/models") as response:
        assert response.status == 404
        assert_openai_error(await response.read(), "not_found")


class ExplodingHook:
    async def prepare(self, ctx: RequestContext, body: bytes) -> Exchange:
        raise RuntimeError("bug in compaction")


class ExplodingExchange(Passthrough):
    async def retry_after_error(self, status: int, body: bytes) -> bytes | None:
        raise RuntimeError("bug")

    def observe(self, status: int, usage: object) -> None:
        raise RuntimeError("bug")


class HookOfExplodingExchanges:
    async def prepare(self, ctx: RequestContext, body: bytes) -> Exchange:
        return ExplodingExchange(body=body)


async def test_a_failing_hook_forwards_the_original_request(
    start_proxy: StartProxy, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    proxy = await start_proxy(hook=ExplodingHook())
    body = b'{"model":"m","messages":[]}'
    async with client.post(f"{proxy.url}/v1/chat/completions", data=body) as response:
        assert response.status == 200
    assert upstream.requests[-1].body == body


async def test_an_exchange_that_fails_later_relays_the_upstream_answer(
    start_proxy: StartProxy, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    proxy = await start_proxy(hook=HookOfExplodingExchanges())
    body = b'{"model":"m","messages":[]}'
    error = {"error": {"message": "maximum context length", "code": "context_length_exceeded"}}
    upstream.reply_once(json_reply(error, status=400))
    async with client.post(f"{proxy.url}/v1/chat/completions", data=body) as response:
        assert response.status == 400
        assert await response.json() == error
    async with client.post(f"{proxy.url}/v1/chat/completions", data=body) as response:
        assert response.status == 200
    assert [r.body for r in upstream.requests] == [body, body]
