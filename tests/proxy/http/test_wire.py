"""The wire client (proxy.http.wire) against real sockets: a loopback server answers each
request with bytes written by the test, so framing, keep-alive and failures are exact."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import trustme
from yarl import URL

from proxy.http.framing import WireError, WireResponse
from proxy.http.wire import WirePool

Answer = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]
"""Answers the request just read (its index counted over all connections)."""


class Server:
    """Reads each request (head and Content-Length body), lets `answer` write the response;
    counts connections and requests, and keeps each request's bytes."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.connections = 0
        self.closed = 0  # connections the client closed (or this server did)
        self.requests: list[bytes] = []
        self.server: asyncio.Server | None = None

    @property
    def url(self) -> URL:
        assert self.server is not None
        port = self.server.sockets[0].getsockname()[1]
        return URL(f"http://127.0.0.1:{port}/v1/chat/completions?x=1")

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                self.requests.append(head + await reader.readexactly(length))
                await self.answer(reader, writer, len(self.requests) - 1)
                if writer.is_closing():
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.closed += 1
            writer.close()


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Answer], Awaitable[Server]]]:
    servers: list[asyncio.Server] = []

    async def start(answer: Answer) -> Server:
        server = Server(answer)
        server.server = await asyncio.start_server(server.serve, "127.0.0.1", 0)
        servers.append(server.server)
        return server

    yield start
    for server in servers:
        server.close()


@pytest.fixture
async def pool() -> AsyncIterator[WirePool]:
    wire = WirePool(connect_timeout_s=2, read_timeout_s=0.5)
    yield wire
    await wire.close()


def writes(*parts: bytes, close: bool = False) -> Answer:
    """An answer written in `parts`, each its own write (and read), then kept open or closed."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        for part in parts:
            writer.write(part)
            await writer.drain()
            await asyncio.sleep(0.001)
        if close:
            writer.close()

    return answer


async def body_of(response: WireResponse) -> bytes:
    parts = []
    while chunk := await response.content.readany():
        parts.append(chunk)
    return b"".join(parts)


async def send(pool: WirePool, server: Server, body: bytes = b"{}") -> WireResponse:
    return await pool.request("POST", server.url, {"Authorization": "Bearer k"}, body)


OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n"


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


async def test_a_chunked_body_is_decoded_whatever_its_pieces(
    serve: Callable[[Answer], Awaitable[Server]], pool: WirePool
) -> None:
    wire = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5;name=value\r\nhello\r\n1\r\n \r\n10\r\n" + b"w" * 16 + b"\r\n0\r\nX-Trailer: t\r\n\r\n"
    )
    # Byte by byte: every line, size and CRLF split between reads.
    server = await serve(writes(*(wire[i : i + 1] for i in range(len(wire)))))
    response = await send(pool, server)
    assert "Content-Length" not in response.headers
    assert await body_of(response) == b"hello " + b"w" * 16
    response.release()
    # In one piece, and the connection kept alive after the trailers.
    server.answer = writes(wire)
    response = await send(pool, server)
    assert await body_of(response) == b"hello " + b"w" * 16
    response.release()
    assert server.connections == 1


async def test_a_body_without_a_length_runs_to_the_close(
    serve: Callable[[Answer], Awaitable[Server]], pool: WirePool
) -> None:
    server = await serve(
        writes(b"HTTP/1.1 200 OK\r\n\r\n", b"data: 1\n\n", b"data: 2\n\n", close=True)
    )
    response = await send(pool, server)
    assert await body_of(response) == b"data: 1\n\ndata: 2\n\n"
    response.release()


async def test_informational_answers_are_passed_over_and_bodiless_ones_end_at_the_head(
    serve: Callable[[Answer], Awaitable[Server]], pool: WirePool
) -> None:
    server = await serve(
        writes(
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n",
            OK + b'{"ok":true}',
        )
    )
    response = await send(pool, server)
    assert response.status == 200 and "Link" not in response.headers
    assert await body_of(response) == b'{"ok":true}'
    response.release()
    server.answer = writes(b"HTTP/1.1 204 No Content\r\n\r\n")
    response = await send(pool, server)
    assert response.status == 204 and await body_of(response) == b""
    response.release()
    assert server.connections == 1


@pytest.mark.parametrize(
    "answer",
    [
        b"SSH-2.0-OpenSSH\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
        b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 70_000,
    ],
    ids=["not-http", "two-lengths", "head-too-large"],
)
async def test_an_answer_that_is_not_http_is_a_protocol_error(
    serve: Callable[[Answer], Awaitable[Server]], pool: WirePool, answer: bytes
) -> None:
    server = await serve(writes(answer))
    with pytest.raises(WireError) as failed:
        await send(pool, server)
    assert failed.value.kind == "protocol"


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\nContent-Length: 2\n\nok",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2 \r\nok\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX-Odd: a\x01b\r\nContent-Length: 2\r\n\r\nok",
    ],
    ids=["bare-lf", "space-after-chunk-size", "control-character"],
)
async def test_sloppy_answers_aiohttp_accepted_are_accepted(
    serve: Callable[[Answer], Awaitable[Server]], pool: WirePool, answer: bytes
) -> None:
    server = await serve(writes(answer))
    response = await send(pool, server)
    assert response.status == 200 and await body_of(response) == b"ok"


async def test_trailers_are_not_headers_and_two_coding_lines_still_frame_chunked(
    serve: Callable[[Answer], Awaitable[Server]], pool: WirePool
) -> None:
    server = await serve(
        writes(
            b"HTTP/1.1 400 Bad Request\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"2\r\nno\r\n0\r\nContent-Encoding: gzip\r\n\r\n"
        )
    )
    response = await send(pool, server)
    assert await body_of(response) == b"no"
    assert "Content-Encoding" not in response.headers
    # Transfer-Encoding on two lines (gzip, then chunked): a cut mid-chunk is a cut, not an end.
    server.answer = writes(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel",
        close=True,
    )
    response = await send(pool, server)
    with pytest.raises(WireError) as failed:
        await body_of(response)
    assert failed.value.kind == "closed"


async def test_an_upgrade_answer_is_a_protocol_error(
    serve: Callable[[Answer], Awaitable[Server]], pool: WirePool
) -> None:
    server = await serve(
        writes(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n"
        )
    )
    with pytest.raises(WireError) as failed:
        await send(pool, server)
    assert failed.value.kind == "protocol"


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


async def test_a_bad_chunk_size_cuts_the_body(
    serve: Callable[[Answer], Awaitable[Server]], pool: WirePool
) -> None:
    server = await serve(
        writes(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n", b"zz\r\n")
    )
    response = await send(pool, server)
    assert await response.content.readany() == b"ok"
    with pytest.raises(WireError) as failed:
        await body_of(response)
    assert failed.value.kind == "protocol"


async def test_a_connection_that_breaks_mid_body_is_a_closed_error(
    serve: Callable[[Answer], Awaitable[Server]], pool: WirePool
) -> None:
    server = await serve(
        writes(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial", close=True)
    )
    response = await send(pool, server)
    with pytest.raises(WireError) as failed:
        await body_of(response)
    assert failed.value.kind == "closed"


async def test_silence_before_the_head_or_mid_body_is_a_timeout(
    serve: Callable[[Answer], Awaitable[Server]], pool: WirePool
) -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        if n == 1:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
        await asyncio.sleep(2)

    server = await serve(silent)
    with pytest.raises(WireError) as before_head:
        await send(pool, server)
    assert before_head.value.kind == "timeout"
    response = await send(pool, server)
    with pytest.raises(WireError) as mid_body:
        await body_of(response)
    assert mid_body.value.kind == "timeout"


async def test_nothing_listening_is_a_connect_error(pool: WirePool) -> None:
    with pytest.raises(WireError) as failed:
        await pool.request("POST", URL("http://127.0.0.1:1/v1/x"), {}, b"{}")
    assert failed.value.kind == "connect"


async def test_a_header_that_would_split_the_head_is_refused(
    serve: Callable[[Answer], Awaitable[Server]], pool: WirePool
) -> None:
    server = await serve(writes(OK + b'{"ok":true}'))
    with pytest.raises(ValueError):
        await pool.request("POST", server.url, {"X-Evil": "a\r\nX-Injected: 1"}, b"{}")
    assert server.requests == []


async def test_a_slow_reader_holds_back_the_upstream_not_memory(
    serve: Callable[[Answer], Awaitable[Server]], pool: WirePool
) -> None:
    size = 16 * 2**20
    sent = asyncio.Event()

    async def big(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
        for _ in range(size // 2**16):
            writer.write(b"x" * 2**16)
            await writer.drain()  # waits while the client does not read
        sent.set()

    server = await serve(big)
    response = await send(pool, server)
    await asyncio.sleep(0.3)  # nothing read: the client stops reading, the server waits
    assert not sent.is_set()
    first = await response.content.readany()
    assert 0 < len(first) < 4 * 2**20
    assert len(first) + len(await body_of(response)) == size
    await asyncio.wait_for(sent.wait(), 5)
    response.release()


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
        with pytest.raises(WireError) as refused:
            await untrusting.request("POST", url, {}, b"{}")
        assert refused.value.kind == "connect"
    finally:
        await wire.close()
        await untrusting.close()
        server.server.close()
