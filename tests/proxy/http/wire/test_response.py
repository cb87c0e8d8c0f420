"""How the wire client reads an answer (proxy.http.wire.response): framing, leniency, failures
and flow control, against a loopback server that writes exactly the bytes each test gives it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from proxy.http.wire import WirePool
from tests.fakes.wire_server import OK, Answer, Server, body_of, failure_of, send, writes


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
    assert await failure_of(send(pool, server)) == "protocol"


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
    assert await failure_of(body_of(response)) == "closed"


async def test_an_upgrade_answer_is_a_protocol_error(
    serve: Callable[[Answer], Awaitable[Server]], pool: WirePool
) -> None:
    server = await serve(
        writes(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n"
        )
    )
    assert await failure_of(send(pool, server)) == "protocol"


async def test_a_bad_chunk_size_cuts_the_body(
    serve: Callable[[Answer], Awaitable[Server]], pool: WirePool
) -> None:
    server = await serve(
        writes(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n", b"zz\r\n")
    )
    response = await send(pool, server)
    assert await response.content.readany() == b"ok"
    assert await failure_of(body_of(response)) == "protocol"


async def test_a_connection_that_breaks_mid_body_is_a_closed_error(
    serve: Callable[[Answer], Awaitable[Server]], pool: WirePool
) -> None:
    server = await serve(
        writes(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial", close=True)
    )
    response = await send(pool, server)
    assert await failure_of(body_of(response)) == "closed"


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
