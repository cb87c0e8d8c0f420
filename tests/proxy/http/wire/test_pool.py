"""The wire client's pool and connections (proxy.http.wire) against real sockets: a loopback
server answers each request with bytes written by the test (tests.fakes.wire_server)."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable

import pytest
import trustme
from yarl import URL

from proxy.http.wire import WireError, WirePool
from tests.fakes.wire_server import OK, Answer, Server, body_of, failure_of, send, writes


async def test_the_request_goes_out_as_one_head_with_host_accept_and_length(
    serve: Callable[[Answer], Awaitable[Server]], pool: WirePool
) -> None:
    server = await serve(writes(OK + b'{"ok":true}'))
    response = await send(pool, server, b'{"model":"m"}')
    assert (response.status, response.reason) == (200, "OK")
    assert response.headers["content-type"] == "application/json"
    assert await body_of(response) == b'{"ok":true}'
    head, _, body = server.requests[0].partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /v1/chat/completions?x=1 HTTP/1.1"
    port = server.url.port
    assert set(lines[1:]) == {
        f"Host: 127.0.0.1:{port}".encode(),
        b"Authorization: Bearer k",
        b"Accept: */*",
        b"Content-Length: 13",
    }
    assert body == b'{"model":"m"}'


async def test_a_connection_is_kept_alive_across_requests_read_whole(
    serve: Callable[[Answer], Awaitable[Server]], pool: WirePool
) -> None:
    server = await serve(writes(OK + b'{"ok":true}'))
    for _ in range(3):
        response = await send(pool, server)
        assert await body_of(response) == b'{"ok":true}'
        response.release()
    assert server.connections == 1 and len(server.requests) == 3


async def test_a_response_not_read_whole_or_closed_drops_its_connection(
    serve: Callable[[Answer], Awaitable[Server]], pool: WirePool
) -> None:
    server = await serve(writes(OK + b'{"ok":true}'))
    (await send(pool, server)).release()  # head only: the body was not read
    closed = await send(pool, server)
    assert await closed.content.readany() == b'{"ok":true}'
    closed.close()  # before its end was seen, as the relay does when the client went away
    whole = await send(pool, server)
    await body_of(whole)  # read to its end: back to the pool without a release
    whole.close()  # then a no-op
    (await send(pool, server)).release()
    assert server.connections == 3


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n",
        b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n",
    ],
    ids=["connection-close", "http-1.0"],
)
async def test_a_connection_the_upstream_will_close_is_not_reused(
    serve: Callable[[Answer], Awaitable[Server]], pool: WirePool, head: bytes
) -> None:
    server = await serve(writes(head + b"ok"))
    for _ in range(2):
        response = await send(pool, server)
        assert await body_of(response) == b"ok"
        response.release()
    assert server.connections == 2


async def test_an_idle_connection_the_upstream_closed_is_not_used_again(
    serve: Callable[[Answer], Awaitable[Server]], pool: WirePool
) -> None:
    server = await serve(writes(OK + b'{"ok":true}', close=True))  # closes after answering
    for _ in range(3):
        response = await send(pool, server)
        assert await body_of(response) == b'{"ok":true}'
        response.release()
        await asyncio.sleep(0.05)  # the close arrives while the connection is idle
    assert server.connections == 3


async def test_idle_connections_are_closed_after_the_keepalive(
    serve: Callable[[Answer], Awaitable[Server]],
) -> None:
    server = await serve(writes(OK + b'{"ok":true}'))
    wire = WirePool(connect_timeout_s=2, read_timeout_s=2, keepalive_s=0.1)
    try:
        responses = [await send(wire, server) for _ in range(3)]  # three at once: three connections
        for response in responses:
            await body_of(response)
        assert server.connections == 3
        assert server.closed == 0
        await asyncio.sleep(0.35)  # no request meanwhile: the reaper closes them
        assert server.closed == 3
        (await send(wire, server)).release()
        assert server.connections == 4
    finally:
        await wire.close()


async def test_silence_before_the_head_or_mid_body_is_a_timeout(
    serve: Callable[[Answer], Awaitable[Server]], pool: WirePool
) -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        if n == 1:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
        await asyncio.sleep(2)

    server = await serve(silent)
    assert await failure_of(send(pool, server)) == "timeout"
    response = await send(pool, server)
    assert await failure_of(body_of(response)) == "timeout"


async def test_nothing_listening_is_a_connect_error(pool: WirePool) -> None:
    nowhere = pool.request("POST", URL("http://127.0.0.1:1/v1/x"), {}, b"{}")
    assert await failure_of(nowhere) == "connect"


async def test_a_header_that_would_split_the_head_is_refused(
    serve: Callable[[Answer], Awaitable[Server]], pool: WirePool
) -> None:
    server = await serve(writes(OK + b'{"ok":true}'))
    with pytest.raises(ValueError):
        await pool.request("POST", server.url, {"X-Evil": "a\r\nX-Injected: 1"}, b"{}")
    assert server.requests == []


async def test_a_request_after_close_fails_at_once(pool: WirePool) -> None:
    await pool.close()
    with pytest.raises(WireError):
        await pool.request("POST", URL("http://127.0.0.1:1/v1/x"), {}, b"{}")


async def test_an_https_origin_is_verified_and_spoken_to_over_tls() -> None:
    authority = trustme.CA()
    served = authority.issue_cert("127.0.0.1")
    server_side = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    served.configure_cert(server_side)
    server = Server(writes(OK + b'{"ok":true}'))
    server.server = await asyncio.start_server(server.serve, "127.0.0.1", 0, ssl=server_side)
    url = server.url.with_scheme("https")
    trusting = ssl.create_default_context()
    authority.configure_trust(trusting)
    wire = WirePool(connect_timeout_s=2, read_timeout_s=2, tls=trusting)
    untrusting = WirePool(connect_timeout_s=2, read_timeout_s=2)  # the system's CAs only
    try:
        for _ in range(2):
            response = await wire.request("POST", url, {}, b"{}")
            assert await body_of(response) == b'{"ok":true}'
            response.release()
        assert server.connections == 1
        assert await failure_of(untrusting.request("POST", url, {}, b"{}")) == "connect"
    finally:
        await wire.close()
        await untrusting.close()
        server.server.close()
